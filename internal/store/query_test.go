package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// Listing the cordoned and draining nodes reads the cordoned index, not
// the fleet: with 20,000 nodes of which 20 are cordoned, the plan of
// ListNodes's own statement names it.
func TestListCordonedUsesAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, cordon_reason, current_job)
		SELECT '10.0.0.0'::inet + (g / 8), g % 8, 1, 'd',
		       CASE WHEN g % 1000 = 0 THEN 'fan' END, CASE WHEN g % 2000 = 0 THEN 7 END
		FROM generate_series(0, 19999) AS g;
		ANALYZE nodes`); err != nil {
		t.Fatal(err)
	}
	for _, states := range [][]registry.State{
		{registry.StateCordoned},
		{registry.StateCordoned, registry.StateDraining},
	} {
		f := registry.NodeFilter{State: states, Limit: 100}
		sql, args := store.ListQuery(f)
		var plan strings.Builder
		rows, err := st.Pool().Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&plan, line)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if !strings.Contains(plan.String(), "nodes_cordoned_idx") {
			t.Errorf("state %v does not use nodes_cordoned_idx:\n%s", states, plan.String())
		}
		got, err := st.ListNodes(ctx, f)
		if want := map[int]int{1: 10, 2: 20}[len(states)]; err != nil || len(got) != want {
			t.Errorf("state %v: %d nodes, want %d (%v)", states, len(got), want, err)
		}
	}
}
