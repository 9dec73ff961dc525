package syncer_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/registry"
)

// The clients' bounds are within what the registry stores: a GPU model or
// a fabric id they pass can be a node's.
func TestProviderBoundsFitTheRegistry(t *testing.T) {
	if provider.MaxGPUModel > registry.MaxGPUModel || provider.MaxFabric > registry.MaxFabric {
		t.Errorf("provider bounds GPU model %d, fabric %d; the registry holds %d, %d",
			provider.MaxGPUModel, provider.MaxFabric, registry.MaxGPUModel, registry.MaxFabric)
	}
}

// A host whose name, address or state is past its bound is skipped and
// keeps its nodes; the summary says why without the provider's string. An
// id past its bound fails the provider's pass, which changes nothing.
func TestSyncProviderStringsPastTheirBounds(t *testing.T) {
	b := imported(t)
	before := b.table()
	long := strings.Repeat("z", 4<<10)
	b.scp.Lock()
	b.scp.Nodes[10].Name = long
	b.scp.Nodes[11].PolicyIP = long
	b.scp.Nodes[12].State = long
	b.scp.Unlock()
	b.e2e.Lock()
	b.e2e.Clusters[0].Workers[1].Name = long
	b.e2e.Unlock()
	sums, err := b.run()
	if err != nil {
		t.Fatalf("%v: %v", err, sums)
	}
	checkKept(t, sums,
		keptFor{24, []string{"gpu_node_name is longer than 255 bytes", "policy_ip is longer than 64 bytes", "state is longer than 64 bytes"}},
		keptFor{8, []string{"name is longer than 255 bytes"}})
	for _, s := range sums {
		if strings.Contains(s.String(), "zzzz") {
			t.Errorf("%s: the summary quotes a string past its bound:\n%.2000s", s.Provider, s)
		}
	}
	if diff := cmp.Diff(before, b.table()); diff != "" {
		t.Errorf("hosts skipped for long strings lost nodes:\n%s", diff)
	}

	b.inventory()
	b.scp.Lock()
	b.scp.Nodes[3].ID = long
	b.scp.Unlock()
	b.e2e.Lock()
	b.e2e.Clusters[1].Workers[0].ID = long
	b.e2e.Unlock()
	sums, err = b.run()
	if err == nil {
		t.Fatalf("a pass with ids past their bound succeeded: %v", sums)
	}
	for _, s := range sums {
		if s.Err == nil || !strings.Contains(s.Err.Error(), "id is longer than 128 bytes") || strings.Contains(s.String(), "zzzz") {
			t.Errorf("%s: %.2000s; want the pass failed for its id", s.Provider, s)
		}
	}
	if diff := cmp.Diff(before, b.table()); diff != "" {
		t.Errorf("a failed pass changed nodes:\n%s", diff)
	}
}
