package store_test

import (
	"context"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkFleetCounts is the fleet metric's one aggregate query over
// 100,000 nodes in 4 hardware generations (plus nodes without one), some
// busy and some unschedulable: what a scrape costs at most once per
// REGISTRY_METRICS_FLEET_INTERVAL.
func BenchmarkFleetCounts(b *testing.B) {
	ctx := context.Background()
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	_, err := st.Pool().Exec(ctx, `
		INSERT INTO hardware_generations (name) VALUES ('H100'), ('A100'), ('B200'), ('L40S');
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, current_job, schedulable)
		SELECT ('10.0.0.0'::inet + (g / 8)), g % 8, 1, 'd',
		       CASE WHEN g % 10 = 9 THEN NULL ELSE 1 + g % 4 END,
		       CASE WHEN g % 3 = 0 THEN 1 + g / 8 END,
		       g % 50 <> 1
		FROM generate_series(0, 99999) g`)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE nodes`); err != nil {
		b.Fatal(err)
	}
	var total int64
	for b.Loop() {
		counts, err := st.FleetCounts(ctx)
		if err != nil {
			b.Fatal(err)
		}
		total = 0
		for _, c := range counts {
			total += c.Nodes
		}
	}
	if total != 100_000 {
		b.Fatalf("counted %d nodes, want 100000", total)
	}
}
