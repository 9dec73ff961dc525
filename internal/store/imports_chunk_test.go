package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// logged is how many audit entries principal has and how many change-log
// rows there are.
type logged struct {
	Audit, Changes int
}

func countLogged(t *testing.T, st *store.Store, principal string) logged {
	t.Helper()
	var l logged
	err := st.Pool().QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM audit_log WHERE principal = $1), (SELECT count(*) FROM node_change_events)`,
		principal).Scan(&l.Audit, &l.Changes)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Each pass writes in chunks: whatever the chunk size, every node it
// writes gets exactly one audit entry and one change-log row, and a pass
// that changes nothing writes nothing.
func TestApplyImportChunks(t *testing.T) {
	t.Parallel()
	for _, chunk := range []int{1, 7, 8, 10_000} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			t.Parallel()
			ctx := store.WithImportChunk(context.Background(), chunk)
			st := pgtest.Open(t, pgtest.New(t), store.Options{})
			apply := func(inv []registry.ImportedNode) registry.ImportResult {
				t.Helper()
				res, err := st.ApplyImport(ctx, syncSCP, "scp", inv, nil)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			// 7 hosts × 8 GPUs and a CPU-only host: 57 nodes, a multiple
			// of none of the chunk sizes but 1; one pair listed twice.
			var inv []registry.ImportedNode
			for h := range 7 {
				inv = append(inv, gpuHost(fmt.Sprintf("h%d", h), fmt.Sprintf("10.9.0.%d", h+1), 8, "H100", 80, true)...)
			}
			inv = append(inv, registry.ImportedNode{ExternalID: "cpu", IP: "10.9.1.1", CPUMem: 1 << 30, State: "RUNNING", Running: true})
			twice := append(inv[:len(inv):len(inv)], inv[3])

			res := apply(twice)
			if res.Added != 57 || res.Unchanged+res.Updated+res.Removed != 0 {
				t.Fatalf("first pass: %+v", res)
			}
			got := countLogged(t, st, "sync:scp")
			// Besides the nodes: one entry for the hardware generation.
			if got != (logged{Audit: 57 + 1, Changes: 57}) {
				t.Fatalf("first pass logged %+v, want 58 audit entries and 57 change rows", got)
			}
			perNode(t, st, 1)

			// Nothing changed: nothing written.
			if res = apply(inv); res.Unchanged != 57 || res.Added+res.Updated+res.Removed+res.KeptBusy != 0 {
				t.Fatalf("unchanged pass: %+v", res)
			}
			if again := countLogged(t, st, "sync:scp"); again != got {
				t.Fatalf("a pass that changed nothing logged %+v, had %+v", again, got)
			}

			// Hosts 1 and 2 report new memory (16 nodes, across chunk
			// boundaries); host 5 vanishes with one of its nodes busy.
			pk := firstPK(t, st, "10.9.0.6")
			if _, err := st.Pool().Exec(ctx, "UPDATE nodes SET current_job = 5 WHERE pk = $1", pk); err != nil {
				t.Fatal(err)
			}
			var next []registry.ImportedNode
			for _, n := range inv {
				switch n.ExternalID {
				case "h1", "h2":
					mem := int64(94) << 30
					n.GPUMem = &mem
				case "h5":
					continue
				}
				next = append(next, n)
			}
			res = apply(next)
			if res.Updated != 16 || res.Removed != 7 || res.KeptBusy != 1 || res.Unchanged != 33 || res.Added != 0 {
				t.Fatalf("changed pass: %+v", res)
			}
			after := countLogged(t, st, "sync:scp")
			if want := (logged{Audit: got.Audit + 16 + 7 + 1, Changes: got.Changes + 16 + 7 + 1}); after != want {
				t.Fatalf("changed pass logged %+v, want %+v", after, want)
			}
			perNode(t, st, 1)
		})
	}
}

// perNode fails unless, within the last pass (the rows written in the
// latest transaction), no node has more than max audit entries or change
// rows: one write, one entry, one row.
func perNode(t *testing.T, st *store.Store, max int) {
	t.Helper()
	var audits, changes int
	err := st.Pool().QueryRow(context.Background(), `
		SELECT
			(SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM audit_log
				WHERE target_type = 'node' AND at = (SELECT max(at) FROM audit_log) GROUP BY target_pk) a),
			(SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM node_change_events
				WHERE at = (SELECT max(at) FROM node_change_events) GROUP BY node_pk) n)`).Scan(&audits, &changes)
	if err != nil {
		t.Fatal(err)
	}
	if audits > max || changes > max {
		t.Errorf("one pass wrote up to %d audit entries and %d change rows for one node", audits, changes)
	}
}

// The comparison that keeps unchanged nodes out of a pass is
// registry.ImportUpdate.Same spelled in SQL: a difference in any field
// the provider owns must still reach the plan.
func TestApplyImportNoticesEveryField(t *testing.T) {
	t.Parallel()
	base := func() registry.ImportedNode {
		mem := int64(80) << 30
		return registry.ImportedNode{ExternalID: "h", IP: "10.8.0.1", CPUMem: 1 << 40, GPUMem: &mem,
			GPUModel: "H100", State: "RUNNING", Running: true, Fabric: "fab-1",
			Labels: mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1", "scp.registryd.io/pool": "p1"})}
	}
	cases := []struct {
		name   string
		change func(*registry.ImportedNode) // what the next inventory says
		sql    string                       // or what someone changed under the pass
	}{
		{name: "cpu memory", change: func(n *registry.ImportedNode) { n.CPUMem++ }},
		{name: "gpu memory", change: func(n *registry.ImportedNode) { *n.GPUMem++ }},
		{name: "no gpu memory", change: func(n *registry.ImportedNode) { n.GPUMem = nil }},
		{name: "gpu model", change: func(n *registry.ImportedNode) { n.GPUModel = "B300" }},
		{name: "no gpu model", change: func(n *registry.ImportedNode) { n.GPUModel = "" }},
		{name: "stopped", change: func(n *registry.ImportedNode) { n.Running = false }},
		{name: "state", change: func(n *registry.ImportedNode) { n.State = "REBOOTING" }},
		{name: "external id", change: func(n *registry.ImportedNode) { n.ExternalID = "h2" }},
		{name: "fabric", change: func(n *registry.ImportedNode) { n.Fabric = "fab-2" }},
		{name: "no fabric any more", change: func(n *registry.ImportedNode) { n.Fabric = "" }},
		{name: "a label's value", change: func(n *registry.ImportedNode) {
			n.Labels = mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-east1", "scp.registryd.io/pool": "p1"})
		}},
		{name: "a label gone", change: func(n *registry.ImportedNode) {
			n.Labels = mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1"})
		}},
		{name: "a label more", change: func(n *registry.ImportedNode) {
			n.Labels = mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1", "scp.registryd.io/pool": "p1", "scp.registryd.io/x": ""})
		}},
		{name: "gpu model stored", sql: "UPDATE nodes SET gpu_model = 'X'"},
		{name: "no fabric stored", sql: "UPDATE nodes SET fabric = NULL"},
		{name: "a stale import label stored", sql: `UPDATE nodes SET labels = labels || '{"scp.registryd.io/old": "x", "team": "ml"}'`},
		{name: "an import label lost", sql: `UPDATE nodes SET labels = labels - 'scp.registryd.io/pool' || '{"notregistryd.io/a": "b"}'`},
		{name: "no gpu memory stored", sql: "UPDATE nodes SET gpu_mem = NULL"},
		{name: "no generation stored", sql: "UPDATE nodes SET hardware_generation = NULL"},
		{name: "no provider state stored", sql: "UPDATE nodes SET provider_state = NULL"},
		{name: "no external id stored", sql: "UPDATE nodes SET external_id = NULL"},
		{name: "registered through the api", sql: "UPDATE nodes SET source = 'api'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := pgtest.Open(t, pgtest.New(t), store.Options{})
			n := base()
			if _, err := st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil); err != nil {
				t.Fatal(err)
			}
			if tc.change != nil {
				tc.change(&n)
			}
			if tc.sql != "" {
				if _, err := st.Pool().Exec(ctx, tc.sql); err != nil {
					t.Fatal(err)
				}
			}
			res, err := st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Updated != 1 || res.Unchanged != 0 {
				t.Errorf("%+v, want the node updated", res)
			}
			if res, _ = st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil); res.Unchanged != 1 {
				t.Errorf("the pass after: %+v, want the node unchanged", res)
			}
		})
	}
}

// What a pass leaves alone does not make a node a candidate: labels of
// the node's own (an admin's, an agent's), and the GPU model and fabric
// an owning agent reported where the provider names none.
func TestApplyImportKeepsOwnTopology(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n := registry.ImportedNode{ExternalID: "h", IP: "10.8.0.1", CPUMem: 1 << 40, GPUModel: "H100", State: "RUNNING", Running: true,
		Labels: mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1"})}
	if _, err := st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET owner = 'agent-1', gpu_model = 'NVIDIA H100 80GB HBM3', fabric = 'ib-local',
		labels = labels || '{"team": "ml", "x.registryd.iox/y": "z"}'`); err != nil {
		t.Fatal(err)
	}
	res, err := st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil)
	if err != nil || res.Unchanged != 1 || res.Updated != 0 {
		t.Fatalf("%+v %v; want the node unchanged", res, err)
	}
	nodes, err := st.ListNodes(ctx, registry.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodes[0]; *got.GPUModel != "NVIDIA H100 80GB HBM3" || *got.Fabric != "ib-local" ||
		got.Labels.String() != `{"scp.registryd.io/region":"kr-west1","team":"ml","x.registryd.iox/y":"z"}` {
		t.Errorf("after the pass: %+v", got)
	}
	// The provider names a fabric and a new region: they win, the own
	// labels stay.
	n.Fabric, n.Labels = "fab-9", mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-east1"})
	if res, err := st.ApplyImport(ctx, syncSCP, "scp", []registry.ImportedNode{n}, nil); err != nil || res.Updated != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	nodes, _ = st.ListNodes(ctx, registry.NodeFilter{})
	if got := nodes[0]; *got.Fabric != "fab-9" || *got.GPUModel != "NVIDIA H100 80GB HBM3" ||
		got.Labels.String() != `{"scp.registryd.io/region":"kr-east1","team":"ml","x.registryd.iox/y":"z"}` {
		t.Errorf("after the provider's change: %+v", got)
	}
}

// A pair the comparison found free may be registered through the API
// before the pass inserts it: the pass skips that pair, inserts the rest
// of its chunk, and logs only what it inserted.
func TestApplyImportInsertRace(t *testing.T) {
	t.Parallel()
	ctx := store.WithImportChunk(context.Background(), 4)
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	blocker, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) VALUES ('10.4.0.1', 2, 1, 'x')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan registry.ImportResult, 1)
	go func() {
		res, err := st.ApplyImport(ctx, syncSCP, "scp", gpuHost("h", "10.4.0.1", 8, "H100", 80, true), nil)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitForLockWait(t, st) // the pass waits on the blocker's pair
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var res registry.ImportResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not end")
	}
	if res.Added != 7 {
		t.Errorf("%+v, want 7 added", res)
	}
	if got := countLogged(t, st, "sync:scp"); got != (logged{Audit: 7 + 1, Changes: 7}) {
		t.Errorf("logged %+v, want 8 audit entries (7 nodes, 1 generation) and 7 change rows", got)
	}
	if got := nodesOf(t, st, "10.4.0.1"); len(got) != 8 || got[0].Index != 2 || got[0].Source != "api" {
		t.Errorf("nodes: %+v", got)
	}
	// The next pass merges the registered node.
	if res, err := st.ApplyImport(ctx, syncSCP, "scp", gpuHost("h", "10.4.0.1", 8, "H100", 80, true), nil); err != nil || res.Updated != 1 || res.Unchanged != 7 {
		t.Errorf("next pass: %+v %v", res, err)
	}
}

// A pass folds the free-count deltas it wrote before it commits, so no
// claim ever sums an import's deltas (one a host: 125,000 after a first
// pass of a million nodes, which made gang claims take seconds until the
// sweeper had folded them), and a pass that wrote a chunk's worth of
// nodes has the nodes table analyzed (the planner's figures are the
// fleet's from the moment it commits) and, when that is a fifth of the
// fleet or more, vacuumed once it has committed. A fold moves its deltas in chunks
// of its own, each counted once, whatever the chunk.
func TestImportLeavesNoDeltas(t *testing.T) {
	t.Parallel()
	for _, fold := range []int64{1, 3, 20_000} {
		t.Run(fmt.Sprint(fold), func(t *testing.T) {
			t.Parallel()
			ctx := store.WithFoldChunk(store.WithImportChunk(context.Background(), 8), fold)
			st := pgtest.Open(t, pgtest.New(t), store.Options{})
			deltas := func() (n int64) {
				t.Helper()
				if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM host_free_delta`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			var inv []registry.ImportedNode
			for h := range 7 {
				inv = append(inv, gpuHost(fmt.Sprintf("h%d", h), fmt.Sprintf("10.9.0.%d", h+1), 8, "H100", 80, true)...)
			}
			if _, err := st.ApplyImport(ctx, syncSCP, "scp", inv, nil); err != nil {
				t.Fatal(err)
			}
			if n := deltas(); n != 0 {
				t.Errorf("%d deltas left by the first pass, want none", n)
			}
			if d := hostFreeDrift(t, st); len(d) > 0 {
				t.Errorf("free counts after the pass: %v", d)
			}
			var analyzed, vacuumed bool
			deadline := time.Now().Add(10 * time.Second)
			for !(analyzed && vacuumed) && time.Now().Before(deadline) {
				if err := st.Pool().QueryRow(ctx, `SELECT last_analyze IS NOT NULL, last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'nodes'`).Scan(&analyzed, &vacuumed); err != nil {
					t.Fatal(err)
				}
				if !(analyzed && vacuumed) {
					time.Sleep(50 * time.Millisecond)
				}
			}
			if !analyzed || !vacuumed {
				t.Errorf("a pass that added 56 nodes (chunks of 8) to none: nodes analyzed %t, vacuumed %t; want both", analyzed, vacuumed)
			}
			// A pass that changes one host of seven (8 nodes, a chunk, less
			// than a fifth) analyzes and leaves the vacuum to autovacuum.
			counts := func() (vacuums, analyzes int64) {
				t.Helper()
				if err := st.Pool().QueryRow(ctx, `SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relname = 'nodes'`).Scan(&vacuums, &analyzes); err != nil {
					t.Fatal(err)
				}
				return vacuums, analyzes
			}
			v0, a0 := counts()
			changed := append([]registry.ImportedNode(nil), inv...)
			for i := range 8 {
				changed[i].CPUMem *= 2
			}
			if res, err := st.ApplyImport(ctx, syncSCP, "scp", changed, nil); err != nil || res.Updated != 8 {
				t.Fatalf("second pass: %+v, %v", res, err)
			}
			v1, a1 := counts()
			for deadline := time.Now().Add(10 * time.Second); a1 == a0 && time.Now().Before(deadline); v1, a1 = counts() {
				time.Sleep(50 * time.Millisecond)
			}
			if v1 != v0 || a1 != a0+1 {
				t.Errorf("a pass that changed 8 of 56 nodes: vacuums %d → %d (want none), analyzes %d → %d (want one)", v0, v1, a0, a1)
			}

			// Deltas of other writers (bulk SQL: 20 hosts of 8) are
			// folded by the sweeper's fold, in chunks, to the last one.
			if _, err := st.Pool().Exec(ctx, `
				INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, gpu_mem)
				SELECT ('10.8.0.' || h)::inet, i, 1024, '', 80 * 1024^3 FROM generate_series(1, 20) h, generate_series(0, 7) i`); err != nil {
				t.Fatal(err)
			}
			for h := 1; h <= 20; h++ { // one statement a host: a delta each
				if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET cordon_reason = 'x' WHERE ip = $1 AND gpu_index < 2`, fmt.Sprintf("10.8.0.%d", h)); err != nil {
					t.Fatal(err)
				}
			}
			if n := deltas(); n < 20 {
				t.Fatalf("%d deltas before the fold, want at least 20", n)
			}
			if err := st.FoldHostFree(ctx); err != nil {
				t.Fatal(err)
			}
			if n := deltas(); n != 0 {
				t.Errorf("%d deltas left by the fold, want none", n)
			}
			if d := hostFreeDrift(t, st); len(d) > 0 {
				t.Errorf("free counts after the fold: %v", d)
			}
		})
	}
}

// A fold takes every delta of a class at once, however few deltas a chunk
// picks: deltas lie in no particular order (a freed slot is reused), so a
// claim's -1 can lie before the release's +1 that came first, and folding
// the -1 alone took the count below zero, which a fold reports as a write
// that bypassed the triggers (and then failed on every pass).
func TestFoldTakesWholeClasses(t *testing.T) {
	t.Parallel()
	ctx := store.WithFoldChunk(context.Background(), 1)
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, cordon_reason) VALUES ('10.8.0.1', 0, 1024, '', 'down')`)
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	// The host's count is 0; its uncordon and its cordon again, the -1
	// first on disk.
	exec(`INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
		VALUES ('10.8.0.1', 0, -1, 1024, 'api', -1), ('10.8.0.1', 0, -1, 1024, 'api', 1)`)
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatalf("a fold of a class whose -1 lies first: %v", err)
	}
	if d := hostFreeDrift(t, st); len(d) > 0 {
		t.Errorf("free counts after the fold: %v", d)
	}
}

// Folds never run at once: while one holds the fold lock (an import
// folding its own deltas before it commits), the sweeper's fold leaves
// the deltas to its next pass at once, and an import waits for the lock.
// Two at once could deadlock on a fabric_free bucket and a delta, and one
// that skipped the other's rows stopped before it had folded its own.
func TestFoldsTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	if _, err := st.Pool().Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) VALUES ('10.8.0.1', 0, 1024, '')`); err != nil {
		t.Fatal(err)
	}
	deltas := func() (n int64) {
		t.Helper()
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM host_free_delta`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	holder, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(store.FoldLockID)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := st.FoldHostFree(ctx); err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("a fold while another holds the lock: %v after %s; want nothing done at once", err, time.Since(start))
	}
	if n := deltas(); n != 1 {
		t.Fatalf("%d deltas after a fold that found the lock taken, want the 1 left", n)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.ApplyImport(ctx, syncSCP, "scp", gpuHost("h", "10.9.0.1", 8, "H100", 80, true), nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("an import folded while another fold held the lock (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the import did not finish once the lock was free")
	}
	if n := deltas(); n != 0 {
		t.Errorf("%d deltas after the import, want none (it folds every visible one)", n)
	}
	if d := hostFreeDrift(t, st); len(d) > 0 {
		t.Errorf("free counts: %v", d)
	}
}

// A fold ends once it has folded the table as it found it, not when the
// table is empty: under steady claims new deltas keep coming, and a fold
// that waited for none left never ended (nor did the sweeper's pass).
// Here a new delta commits after every transaction of the fold.
func TestFoldEndsUnderSteadyWrites(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(store.WithFoldChunk(context.Background(), 100))
	defer cancel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	if _, err := st.Pool().Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) VALUES ('10.8.0.1', 0, 1024, '')`); err != nil {
		t.Fatal(err)
	}
	transactions := 0
	ctx = store.WithFoldObserver(ctx, func() {
		if transactions++; transactions == 50 {
			cancel()
			return
		}
		cordon := map[bool]any{true: "x", false: nil}[transactions%2 == 1]
		if _, err := st.Pool().Exec(context.Background(), `UPDATE nodes SET cordon_reason = $1`, cordon); err != nil {
			t.Error(err)
		}
	})
	if err := st.FoldHostFree(ctx); err != nil || transactions != 1 {
		t.Fatalf("a fold with a delta committed after each of its transactions: %v after %d transactions; want done after the first", err, transactions)
	}
}
