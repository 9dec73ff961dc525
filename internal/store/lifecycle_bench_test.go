package store_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// sweepBenchNodes is the fleet BenchmarkSweepLifecycle sweeps:
// REGISTRYD_BENCH_NODES, 100,000 by default.
func sweepBenchNodes(b *testing.B) int {
	n := 100_000
	if v := os.Getenv("REGISTRYD_BENCH_NODES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 10_000 {
			b.Fatalf("REGISTRYD_BENCH_NODES=%q: want a whole number ≥ 10000", v)
		}
	}
	return n
}

// BenchmarkSweepLifecycle is one sweeper pass over 100,000 nodes
// (REGISTRYD_BENCH_NODES to change it; counts below scale with it): half of
// them owned by agents, all written a day ago, 99% heartbeating, 1,000 lost
// already, 1,000 held with a lease that has not run out, 1,000 registered by
// agents a moment ago and not heard from yet. "steady" is the pass of a healthy
// fleet, with nothing to change; "churn" marks n/1000 nodes lost and finds
// as many others in each pass. The plan of the candidate query is logged
// (go test -bench SweepLifecycle -v).
func BenchmarkSweepLifecycle(b *testing.B) {
	ctx := context.Background()
	n := sweepBenchNodes(b)
	churn := n / 1000
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			b.Fatal(err)
		}
	}
	exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, owner)
		SELECT ('10.' || (i / 65536) || '.' || (i / 256 % 256) || '.' || (i % 256))::inet, 0, 1024, '550',
		       CASE WHEN i % 2 = 0 THEN 'agent-' || i END
		FROM generate_series(1, $1::int) AS i`, n)
	exec(`UPDATE nodes SET updated_at = now() - interval '1 day'`) // registered long ago
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT pk, now() FROM nodes WHERE pk % 100 <> 0`)
	// Agents registered these and have not heartbeated yet (as CreateNode writes it).
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT pk, NULL FROM nodes WHERE pk % 100 = 0 AND owner IS NOT NULL`)
	exec(`UPDATE node_liveness SET last_seen = now() - interval '1 hour' WHERE node_pk % 100 = 1`)
	exec(`UPDATE nodes SET lost = true WHERE pk % 100 = 1`)
	exec(`UPDATE nodes SET current_job = pk, lease_expires_at = now() + interval '1 day' WHERE pk % 100 = 2`)
	exec(`UPDATE nodes SET updated_at = now() WHERE pk % 100 = 0`) // never heartbeated, just written
	exec(`VACUUM ANALYZE nodes`)
	exec(`VACUUM ANALYZE node_liveness`)
	const ttl = time.Hour // nothing fresh goes stale while the benchmark runs
	if done, err := st.SweepLifecycle(ctx, ttl); err != nil || !done.Empty() {
		b.Fatalf("the fleet is not steady: %+v %v", done, err)
	}

	rows, err := st.Pool().Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+strings.Replace(store.SweepCandidates, "FOR UPDATE OF n SKIP LOCKED", "", 1),
		time.Now().Add(-ttl), time.Now())
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
	b.Logf("candidate query at %d nodes:\n%s", n, strings.Join(plan, "\n"))

	b.Run("steady", func(b *testing.B) {
		for b.Loop() {
			if done, err := st.SweepLifecycle(ctx, ttl); err != nil || !done.Empty() {
				b.Fatalf("%+v %v", done, err)
			}
		}
	})
	b.Run("churn", func(b *testing.B) {
		round := 0
		for b.Loop() {
			b.StopTimer()
			// n/1000 healthy nodes fall silent; those of the last round speak again.
			exec(`UPDATE node_liveness SET last_seen = now() - interval '2 hours' WHERE node_pk % 100 = 3 AND node_pk / 100 % 10 = $1`, round%10)
			exec(`UPDATE node_liveness SET last_seen = now() WHERE node_pk % 100 = 3 AND node_pk / 100 % 10 = $1`, (round+9)%10)
			b.StartTimer()
			done, err := st.SweepLifecycle(ctx, ttl)
			if err != nil || len(done.Lost) != churn || round > 0 && len(done.Found) != churn {
				b.Fatalf("%+v %v", done, err)
			}
			round++
		}
	})
}
