package store_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkClaims is 16 concurrent schedulers claiming and releasing, gang
// claims (8 on one host) and single ones, on a whole fleet (every node
// free) and on a fragmented one (99% of hosts with 1 to 7 free, 1% whole).
// The fleet is REGISTRYD_BENCH_HOSTS hosts of 8 nodes (default 12,500:
// 100,000 nodes; 125000 is the million), seeded by SQL in one statement
// (the triggers' cost included). Each op is one claim and its release; the
// metrics are claims/s (successful claims over wall time) and the p99 of
// the claim alone. The sweeper's folding of the free counts runs every
// second meanwhile, as in production. REGISTRYD_BENCH_PLANS=1 logs the
// plans of the host lookup and of the grouped count it replaced (-v).
//
//	REGISTRYD_BENCH_HOSTS=125000 go test ./internal/store -run '^$' -bench Claims -benchtime 5s
func BenchmarkClaims(b *testing.B) {
	ctx := context.Background()
	hosts := 12_500
	if v := os.Getenv("REGISTRYD_BENCH_HOSTS"); v != "" {
		var err error
		if hosts, err = strconv.Atoi(v); err != nil || hosts < 100 {
			b.Fatalf("REGISTRYD_BENCH_HOSTS=%q: want a number of hosts, at least 100", v)
		}
	}
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	// Seeding a million nodes outlasts the store's statement timeout.
	seeder := pgtest.Open(b, st.Pool().Config().ConnString(), store.Options{StatementTimeout: time.Hour})
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := seeder.Pool().Exec(ctx, sql, args...); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	exec(`INSERT INTO hardware_generations (name) VALUES ('H100')`)
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem)
		SELECT ('10.0.0.0'::inet + g / 8), g % 8, 2199023255552, '550', 1, 85899345920
		FROM generate_series(0, $1::bigint * 8 - 1) g`, hosts)
	b.Logf("seeded %d nodes in %v", hosts*8, time.Since(start).Round(time.Millisecond))
	fold := func() {
		b.Helper()
		if f, ok := any(st).(interface{ FoldHostFree(context.Context) error }); ok {
			if err := f.FoldHostFree(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	settle := func() {
		b.Helper()
		fold()
		exec(`VACUUM ANALYZE nodes`)
		for _, t := range []string{"host_free", "host_free_delta"} {
			var exists bool
			if err := st.Pool().QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t).Scan(&exists); err != nil {
				b.Fatal(err)
			}
			if exists {
				exec(`VACUUM ANALYZE ` + t)
			}
		}
	}
	settle()

	hw := int64(1)
	// What finding a host costs, alone: the statement a try runs now, and
	// the grouped count over the free fleet every gang claim ran before
	// (issue 12), side by side on the same data.
	explain := func(what, sql string, args ...any) {
		b.Helper()
		// One statement, its own transaction: the advisory lock it takes
		// ends with it.
		rows, err := st.Pool().Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+sql, args...)
		if err != nil {
			b.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				b.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		b.Logf("%s:\n%s", what, strings.Join(plan, "\n"))
	}
	plans := func(fleet string) {
		b.Helper()
		sql, args := store.HostCandidatesQuery(registry.NodeFilter{HardwareGeneration: &hw}, 8, []string{})
		explain(fleet+" fleet, a gang claim's host lookup", sql, args...)
		explain(fleet+" fleet, the grouped count gang claims ran before", `SELECT host(ip) FROM nodes
			WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL AND hardware_generation = 1
			GROUP BY ip HAVING count(*) >= 8 ORDER BY min(pk) LIMIT 32`)
	}
	if os.Getenv("REGISTRYD_BENCH_PLANS") != "" {
		plans("whole")
	}
	run := func(b *testing.B, count int, sameHost bool) {
		var (
			mu        sync.Mutex
			latencies []time.Duration
			job       atomic.Int64
			claimed   atomic.Int64
			conflicts atomic.Int64
		)
		stop := make(chan struct{})
		folded := make(chan struct{})
		go func() { // the sweeper's fold, once a second
			defer close(folded)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
					if f, ok := any(st).(interface{ FoldHostFree(context.Context) error }); ok {
						if err := f.FoldHostFree(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}
			}
		}()
		job.Store(1 << 40) // apart from the jobs that fragment the fleet
		b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		began := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				j := job.Add(1)
				t0 := time.Now()
				_, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: j, Count: count, SameHost: sameHost,
					Filter: registry.NodeFilter{HardwareGeneration: &hw}})
				mine = append(mine, time.Since(t0))
				if errors.Is(err, registry.ErrConflict) {
					conflicts.Add(1)
					continue
				}
				if err != nil {
					b.Error(err)
					return
				}
				claimed.Add(1)
				if _, _, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: j}); err != nil {
					b.Error(err)
					return
				}
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
		elapsed := time.Since(began)
		b.StopTimer()
		close(stop)
		<-folded
		slices.Sort(latencies)
		if len(latencies) > 0 {
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
		}
		b.ReportMetric(float64(claimed.Load())/elapsed.Seconds(), "claims/s")
		b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/op")
	}
	b.Run("whole/gang", func(b *testing.B) { run(b, 8, true) })
	b.Run("whole/single", func(b *testing.B) { run(b, 1, false) })

	// Fragment: every host but each hundredth keeps 1 to 7 free nodes.
	exec(`UPDATE nodes SET current_job = 1
		WHERE (ip - '10.0.0.0'::inet) % 100 <> 0 AND gpu_index >= 1 + (ip - '10.0.0.0'::inet) % 7`)
	settle()
	if os.Getenv("REGISTRYD_BENCH_PLANS") != "" {
		plans("fragmented")
	}
	b.Run("fragmented/gang", func(b *testing.B) { run(b, 8, true) })
	b.Run("fragmented/single", func(b *testing.B) { run(b, 1, false) })
}
