package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// hostFreeDrift compares the free counts (host_free plus its unfolded
// deltas, migration 00013) with a recount from nodes and describes every
// class where they differ.
func hostFreeDrift(t *testing.T, st *store.Store) []string {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `
		WITH kept AS (
			SELECT host(ip) AS ip, hardware_generation AS hw, gpu_mem AS gpu, cpu_mem AS cpu, source, fabric, sum(free) AS free
			FROM (SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, free FROM host_free
			      UNION ALL
			      SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta FROM host_free_delta) t
			GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(free) <> 0
		), recount AS (
			SELECT host(ip) AS ip, coalesce(hardware_generation, 0) AS hw, coalesce(gpu_mem, -1) AS gpu, cpu_mem AS cpu, source,
			       coalesce(fabric, '') AS fabric, count(*) AS free
			FROM nodes WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
			GROUP BY 1, 2, 3, 4, 5, 6
		)
		SELECT coalesce(k.ip, r.ip), coalesce(k.hw, r.hw), coalesce(k.gpu, r.gpu), coalesce(k.cpu, r.cpu), coalesce(k.source, r.source),
		       coalesce(k.free, 0), coalesce(r.free, 0)
		FROM kept k FULL JOIN recount r USING (ip, hw, gpu, cpu, source, fabric)
		WHERE k.free IS DISTINCT FROM r.free
		ORDER BY 1, 2, 3, 4, 5`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var drift []string
	for rows.Next() {
		var ip, source string
		var hw, gpu, cpu, kept, recount int64
		if err := rows.Scan(&ip, &hw, &gpu, &cpu, &source, &kept, &recount); err != nil {
			t.Fatal(err)
		}
		drift = append(drift, fmt.Sprintf("%s hw=%d gpu=%d cpu=%d %s: kept %d, recount %d", ip, hw, gpu, cpu, source, kept, recount))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// fabric_free (migration 00021) is host_free's folded counts, bucketed.
	rows, err = st.Pool().Query(context.Background(), `
		WITH kept AS (
			SELECT fabric, hardware_generation, gpu_mem, cpu_mem, source, free, hosts FROM fabric_free
		), recount AS (
			SELECT fabric, hardware_generation, gpu_mem, cpu_mem, source, free, count(*)::integer AS hosts
			FROM host_free WHERE fabric <> '' AND free > 0 GROUP BY 1, 2, 3, 4, 5, 6
		)
		SELECT fabric || ' free=' || free || ': kept ' || coalesce(k.hosts, 0) || ', recount ' || coalesce(r.hosts, 0)
		FROM kept k FULL JOIN recount r USING (fabric, hardware_generation, gpu_mem, cpu_mem, source, free)
		WHERE k.hosts IS DISTINCT FROM r.hosts`)
	if err != nil {
		t.Fatal(err)
	}
	buckets, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return append(drift, buckets...)
}

// The free counts stay equal to a recount from nodes through a random mix
// of every kind of write that can change a node's freeness: creates,
// edits (ip, memory, hardware), deletes, claims (single and gang),
// releases, cordons and uncordons, sweeps (lost, found, expired leases),
// sync imports (insert, update, gone, remove) and bulk SQL, with the
// deltas folded now and then. Fault caught (tried once): the update
// trigger counting new rows without "NOT lost", so a node marked lost
// stayed counted as free.
func TestHostFreeMatchesRecount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	rng := rand.New(rand.NewPCG(12, 12))
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO hardware_generations (name) VALUES ('H100'), ('A100')`)
	// Bulk: 20 hosts of 8 through one statement.
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, fabric)
		SELECT ('10.20.0.0'::inet + g / 8), g % 8, 1024, 'd', 1 + g / 8 % 2, CASE WHEN g % 16 < 8 THEN 80 END,
			CASE WHEN g / 8 % 3 > 0 THEN 'fab-' || g / 64 END
		FROM generate_series(0, 159) g`)
	ips := func() string { return fmt.Sprintf("10.20.0.%d", rng.IntN(24)) }
	pks := func(n int) []int64 {
		t.Helper()
		rows, err := st.Pool().Query(ctx, `SELECT pk FROM nodes ORDER BY random() LIMIT $1`, n)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var pk int64
			if err := rows.Scan(&pk); err != nil {
				t.Fatal(err)
			}
			out = append(out, pk)
		}
		return out
	}
	ok := func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, registry.ErrConflict) && !errors.Is(err, registry.ErrNotFound) && !errors.Is(err, registry.ErrInvalid) {
			t.Fatal(err)
		}
	}
	host := func(ext, ip string, gpus int, model string, mem int64, running bool) []registry.ImportedNode {
		return gpuHost(ext, ip, gpus, model, mem, running)
	}
	inventories := [][]registry.ImportedNode{
		append(host("a", "10.20.1.1", 8, "H100", 80, true), host("b", "10.20.1.2", 8, "A100", 40, true)...),
		append(host("a", "10.20.1.1", 8, "H100", 94, true), host("c", "10.20.0.3", 4, "H100", 80, false)...),
		host("b", "10.20.1.2", 8, "A100", 40, false),
		nil,
	}
	ops := 0
	for round := range 400 {
		job := int64(1 + rng.IntN(6))
		switch rng.IntN(13) {
		case 0:
			_, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: ips(), Index: rng.IntN(10), CPUMem: 1024, DriverVersion: "d", GPUMem: ptr(int64(80))})
			ok(err)
		case 1:
			for _, pk := range pks(1) {
				_, err := st.UpdateNode(ctx, sys, pk, func(cur registry.Node) (registry.NodeSpec, error) {
					spec := cur.Spec()
					switch rng.IntN(4) {
					case 0:
						spec.IP = ips()
					case 1:
						spec.GPUMem = ptr(int64(40 + rng.IntN(2)*40))
					case 2:
						spec.Fabric = []*string{nil, ptr("fab-0"), ptr("fab-9")}[rng.IntN(3)]
					default:
						spec.HardwareGeneration = ptr(int64(1 + rng.IntN(2)))
					}
					return spec, nil
				})
				ok(err)
			}
		case 2:
			for _, pk := range pks(1) {
				_, err := st.DeleteNode(ctx, sys, pk, rng.IntN(2) == 0, nil)
				ok(err)
			}
		case 3, 4:
			var lease *time.Duration
			if rng.IntN(2) == 0 {
				lease = ptr(time.Second)
			}
			c := registry.Claim{Job: job, Count: 1 + rng.IntN(8), SameHost: rng.IntN(2) == 0, Lease: lease}
			if rng.IntN(3) == 0 { // whole hosts, in one fabric or not
				c = registry.Claim{Job: job, PerHost: 1 + rng.IntN(4), SameFabric: rng.IntN(2) == 0, Lease: lease}
				c.Count = c.PerHost * (1 + rng.IntN(3))
			}
			_, err := st.ClaimNodes(ctx, sys, c)
			ok(err)
		case 5, 6:
			_, _, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: job})
			ok(err)
		case 7:
			_, _, err := st.CordonNodes(ctx, sys, registry.Cordon{Nodes: pks(1 + rng.IntN(6)), Reason: "fan"})
			ok(err)
		case 8:
			_, _, err := st.UncordonNodes(ctx, sys, registry.Uncordon{Nodes: pks(1 + rng.IntN(10))})
			ok(err)
		case 9:
			// Some nodes fall silent, others speak again; leases may run out.
			exec(`INSERT INTO node_liveness (node_pk, last_seen)
				SELECT pk, CASE WHEN random() < 0.3 THEN now() - interval '1 hour' ELSE now() END FROM nodes
				ON CONFLICT (node_pk) DO UPDATE SET last_seen = excluded.last_seen`)
			exec(`UPDATE nodes SET lease_expires_at = now() - interval '1 second' WHERE lease_expires_at IS NOT NULL AND random() < 0.5`)
			_, err := st.SweepLifecycle(ctx, time.Minute)
			ok(err)
		case 10:
			_, err := st.ApplyImport(ctx, syncSCP, "scp", inventories[rng.IntN(len(inventories))], nil)
			ok(err)
		case 11:
			// Bulk SQL, as an operator might.
			exec(`UPDATE nodes SET schedulable = NOT schedulable WHERE pk % 7 = $1`, rng.IntN(7))
		case 12:
			if err := st.FoldHostFree(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ops++
		if drift := hostFreeDrift(t, st); len(drift) > 0 {
			t.Fatalf("after %d operations (round %d) the free counts drifted:\n%s", ops, round, strings.Join(drift, "\n"))
		}
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Fatalf("after folding, the free counts drifted:\n%s", strings.Join(drift, "\n"))
	}
	var pending, zero int
	if err := st.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM host_free_delta), (SELECT count(*) FROM host_free WHERE free <= 0)`).Scan(&pending, &zero); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || zero != 0 {
		t.Errorf("after folding: %d deltas left, %d rows without free nodes", pending, zero)
	}
}

// gangFleet makes hosts of 8 nodes at 10.30.x.y (hardware generation 1,
// gpu_mem 80) and returns their addresses.
func gangFleet(t *testing.T, st *store.Store, hosts int) []string {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `INSERT INTO hardware_generations (name) VALUES ('H100')`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem)
		SELECT ('10.30.0.0'::inet + g / 8), g % 8, 1024, 'd', 1, 80 FROM generate_series(0, $1 * 8 - 1) g`, hosts); err != nil {
		t.Fatal(err)
	}
	out := make([]string, hosts)
	for i := range out {
		out[i] = fmt.Sprintf("10.30.%d.%d", i/256, i%256)
	}
	return out
}

// Many schedulers gang-claiming and releasing at once: every claim that
// succeeds is 8 nodes of one host, no node is ever held by two jobs, and
// with hosts to spare, claimers spread over them instead of failing on
// the same first host.
func TestGangClaimsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 40)
	hw := int64(1)

	var mu sync.Mutex
	holder := map[int64]int64{} // node → job, as the claims answered
	var problems []string
	var claims, conflicts int
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 25 {
				job := int64(w*1000 + i + 1)
				f := registry.NodeFilter{}
				if i%2 == 0 {
					f.HardwareGeneration = &hw
				}
				got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: job, Count: 8, SameHost: true, Filter: f})
				mu.Lock()
				switch {
				case errors.Is(err, registry.ErrConflict):
					conflicts++
				case err != nil:
					problems = append(problems, err.Error())
				default:
					claims++
					if len(got) != 8 {
						problems = append(problems, fmt.Sprintf("job %d got %d nodes", job, len(got)))
					}
					for _, n := range got {
						if n.IP != got[0].IP {
							problems = append(problems, fmt.Sprintf("job %d got nodes on %s and %s", job, got[0].IP, n.IP))
						}
						if other, held := holder[n.PK]; held {
							problems = append(problems, fmt.Sprintf("node %d given to job %d while job %d held it", n.PK, job, other))
						}
						holder[n.PK] = job
					}
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				mu.Lock()
				for _, n := range got {
					delete(holder, n.PK)
				}
				mu.Unlock()
				if _, _, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: job}); err != nil {
					mu.Lock()
					problems = append(problems, err.Error())
					mu.Unlock()
				}
			}
		})
	}
	// The sweeper folds deltas meanwhile, as in production.
	stop := make(chan struct{})
	folded := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				folded <- nil
				return
			case <-time.After(20 * time.Millisecond):
				if err := st.FoldHostFree(ctx); err != nil {
					folded <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	if err := <-folded; err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatalf("%d problems, e.g.:\n%s", len(problems), strings.Join(problems[:min(10, len(problems))], "\n"))
	}
	// 16 claimers, never more than 16 hosts held, 40 hosts: none of them
	// ever lacks a host.
	if conflicts > 0 {
		t.Errorf("%d of %d gang claims found no host among 40 with at most 16 held", conflicts, claims+conflicts)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("free counts drifted:\n%s", strings.Join(drift, "\n"))
	}
}

// A fragmented fleet: 300 hosts with 1 to 7 free nodes each and 3 whole
// ones. Gang claims of 8 take exactly the 3 whole hosts, then conflict;
// a claim of 7 prefers a host with exactly 7 free (best fit) over
// breaking up one with more.
func TestGangClaimFragmented(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	hosts := gangFleet(t, st, 303)
	// Host i (i < 300) keeps 1 + i%7 free: its higher indexes are busy.
	if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET current_job = 999
		WHERE ip < '10.30.1.44'::inet AND gpu_index >= 1 + (ip - '10.30.0.0'::inet) % 7`); err != nil {
		t.Fatal(err)
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	whole := map[string]bool{hosts[300]: true, hosts[301]: true, hosts[302]: true}
	for job := int64(1); job <= 3; job++ {
		got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: job, Count: 8, SameHost: true})
		if err != nil {
			t.Fatalf("gang claim %d: %v", job, err)
		}
		if !whole[got[0].IP] || len(got) != 8 {
			t.Fatalf("gang claim %d took %d nodes on %s, want a whole host", job, len(got), got[0].IP)
		}
		delete(whole, got[0].IP)
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 4, Count: 8, SameHost: true}); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a gang claim with no whole host left: %v, want a conflict", err)
	}
	got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 5, Count: 7, SameHost: true})
	if err != nil || len(got) != 7 {
		t.Fatalf("gang claim of 7: %v %v", got, err)
	}
	var free int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM nodes WHERE ip = $1::inet AND current_job IS NULL`, got[0].IP).Scan(&free); err != nil || free != 0 {
		t.Errorf("a gang claim of 7 left %d free on %s (%v), want a host with exactly 7", free, got[0].IP, err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("free counts drifted:\n%s", strings.Join(drift, "\n"))
	}
}

// Filters are answered by the counts' classes: a host whose nodes differ
// (4 with 80 GiB, 4 with 40) serves a gang of 8 with min_gpu_mem 40 from
// both classes together, but not one with min_gpu_mem 80; a hardware
// generation that no host has is a conflict at once.
func TestGangClaimClasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 2)
	if _, err := st.Pool().Exec(ctx, `INSERT INTO hardware_generations (name) VALUES ('A100');
		UPDATE nodes SET gpu_mem = 40 WHERE gpu_index >= 4 AND ip = '10.30.0.0';
		UPDATE nodes SET hardware_generation = 2 WHERE ip = '10.30.0.1'`); err != nil {
		t.Fatal(err)
	}
	hw1, hw2 := int64(1), int64(2)
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 1, Count: 8, SameHost: true, Filter: registry.NodeFilter{HardwareGeneration: &hw1, MinGPUMem: ptr(int64(80))}}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("a gang of 8 with 80 GiB where a host has 4: %v, want a conflict", err)
	}
	got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 2, Count: 8, SameHost: true, Filter: registry.NodeFilter{HardwareGeneration: &hw1, MinGPUMem: ptr(int64(40))}})
	if err != nil || len(got) != 8 || got[0].IP != "10.30.0.0" || got[7].IP != "10.30.0.0" {
		t.Fatalf("a gang of 8 with 40 GiB on the mixed host: %v %v", got, err)
	}
	got, err = st.ClaimNodes(ctx, sys, registry.Claim{Job: 3, Count: 8, SameHost: true, Filter: registry.NodeFilter{HardwareGeneration: &hw2}})
	if err != nil || len(got) != 8 || got[0].IP != "10.30.0.1" {
		t.Fatalf("a gang of 8 of generation 2: %v %v", got, err)
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 4, Count: 1, SameHost: true}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("a claim with nothing free: %v, want a conflict", err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("free counts drifted:\n%s", strings.Join(drift, "\n"))
	}
}

// A gang claim's host lookup reads host_free by key for the pending
// deltas however stale the planner's picture of host_free_delta is: after
// a bulk import its statistics say thousands of rows while a handful
// wait, and a hash join on that estimate read every class of the fleet
// (0.1 s a claim at 1,000,000 nodes).
func TestHostLookupPlanIgnoresStaleDeltaStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	exec := func(sql string) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// 40,000 hosts imported in bulk: their deltas analyzed while they
	// wait, then folded, leaving statistics of 40,000 pending rows.
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT '10.0.0.0'::inet + (g / 8), g % 8, 1024, '550' FROM generate_series(0, 319999) g`)
	exec(`ANALYZE host_free_delta`)
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	exec(`ANALYZE host_free`)
	exec(`UPDATE nodes SET current_job = 1 WHERE pk IN (SELECT pk FROM nodes ORDER BY pk LIMIT 8)`) // one pending delta
	sql, args := store.HostCandidatesQuery(registry.NodeFilter{}, 8, []string{})
	rows, err := st.Pool().Query(ctx, `EXPLAIN `+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan on host_free ") || strings.Contains(text, "Hash Join") || strings.Contains(text, "Hash Left Join") {
		t.Fatalf("the lookup reads all of host_free:\n%s", text)
	}
}

// A claim's statement reads no more of the fleet than it takes, at
// 100,000 nodes with a thousand held: the single claim walks the free
// index from the lowest pk; the gang claim's own host lookup goes through
// host_free's index on the count, and its pick through the host's nodes by
// ip, never the free index of the whole fleet (which a plan ordered by pk
// would walk until it met the host).
func TestClaimPlansReadNoFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	exec := func(sql string) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT '10.0.0.0'::inet + (g / 8), g % 8, 1024, '550' FROM generate_series(0, 99999) g`)
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE nodes SET current_job = 1 WHERE pk % 100 = 0`)
	exec(`ANALYZE nodes`)
	exec(`ANALYZE host_free`)
	exec(`ANALYZE host_free_delta`)
	for _, c := range []registry.Claim{{Job: 2, Count: 1}, {Job: 3, Count: 8, SameHost: true}} {
		sql, args := store.ClaimStatement(c)
		rows, err := st.Pool().Query(ctx, `EXPLAIN `+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on nodes") || strings.Contains(text, "Seq Scan on host_free ") {
			t.Errorf("claim %+v reads a whole table:\n%s", c, text)
		}
		if c.SameHost && (strings.Contains(text, "nodes_free_idx") || !strings.Contains(text, "nodes_ip_index_key")) {
			t.Errorf("gang claim picks its host's nodes other than by ip:\n%s", text)
		}
		t.Logf("claim %+v:\n%s", c, text)
	}
}
