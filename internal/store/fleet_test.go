package store_test

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// The fleet count's SQL agrees with registry.Node.DeriveState for every kind of
// node, and names only states of registry.States: a state added to
// one and not the other fails here.
func TestFleetCountsMatchNodeState(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	_, err := st.Pool().Exec(ctx, `
		INSERT INTO hardware_generations (name) VALUES ('H100'), ('empty');
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, current_job, schedulable, lost, cordon_reason)
		SELECT '10.0.0.1', g, 1, 'd', CASE WHEN g % 2 = 0 THEN 1 END,
		       CASE WHEN g % 4 < 2 THEN 100 + g END, g % 8 < 4, g % 8 = 3,
		       CASE WHEN g % 32 >= 16 OR g % 5 = 0 THEN 'fan' END
		FROM generate_series(0, 31) g`)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := st.ListNodes(ctx, registry.NodeFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		gen   string
		state registry.State
	}
	want := map[key]int64{{"empty", ""}: 0}
	for _, n := range nodes {
		gen := ""
		if n.HardwareGeneration != nil {
			gen = "H100"
		}
		want[key{gen, n.State}]++
	}
	counts, err := st.FleetCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[key]int64{}
	for _, c := range counts {
		got[key{c.Generation, c.State}] += c.Nodes
		if c.State != "" && !slices.Contains(registry.States, c.State) {
			t.Errorf("the store counts state %q, which registry.States lacks", c.State)
		}
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(key{})); d != "" {
		t.Errorf("fleet counts differ from Node.DeriveState (-want +got):\n%s", d)
	}
	if len(nodes) != 32 {
		t.Fatalf("listed %d nodes, want 32", len(nodes))
	}
	for _, s := range registry.States {
		if want[key{"", s}]+want[key{"H100", s}] == 0 {
			t.Errorf("no node in state %s: a weak case", s)
		}
	}
}
