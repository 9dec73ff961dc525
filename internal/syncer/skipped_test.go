package syncer_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/syncer"
)

// A host the provider reports well but our own mapping (Nodes) skips, for
// an address that is not an IP or a size past belief, keeps its nodes like
// a host the provider client skipped: TestSyncKeepsSkippedHosts covers
// only the clients' skips, which reach ApplyImport another way.
func TestSyncKeepsHostsOurMappingSkips(t *testing.T) {
	b := imported(t)
	before := b.table()
	b.scp.Lock()
	b.scp.Products = append(b.scp.Products, scptest.Product{ID: "p-huge", Name: "s8h100_huge", Description: "vCPU 96 │ Memory 2PB",
		GPUModel: "H100", MemoryValue: "2097152", CPUValue: "96"}) // 2 PiB: more than a host holds
	b.scp.Products = append(b.scp.Products, scptest.Product{ID: "p-odd", Name: "s8h100_odd", Description: "CPU 96 | Memory 2048GB | H1\u202E00(80GB)*8 | Disk 960GB",
		GPUModel: "H1\u202E00", MemoryValue: "2048", CPUValue: "96"}) // a model that reads otherwise than it is
	b.scp.Nodes[10].PolicyIP = "gpu-node-10.internal"
	b.scp.Nodes[11].ServerType = "s8h100_huge"
	b.scp.Nodes[12].ServerType = "s8h100_odd"
	b.scp.Unlock()
	b.e2e.Lock()
	b.e2e.Clusters[0].Workers[1].PrivateIP = "w2.train-a.internal"
	b.e2e.Unlock()
	sums, err := b.run()
	if err != nil {
		t.Fatalf("%v: %v", err, sums)
	}
	checkKept(t, sums, keptFor{24, []string{"must be an IPv4 or IPv6 address", "bytes of host memory", "gpu model that must not contain invisible format characters"}},
		keptFor{8, []string{"must be an IPv4 or IPv6 address"}})
	if diff := cmp.Diff(before, b.table()); diff != "" {
		t.Errorf("hosts our mapping skipped lost nodes:\n%s", diff)
	}
}

// keptFor is what one provider's pass says of the hosts it skipped: how
// many nodes it kept for them, and why it skipped them.
type keptFor struct {
	kept    int
	reasons []string
}

// checkKept fails t unless the pass of each provider, in order, kept its
// want's nodes for skipped hosts, removed none and gave every reason.
func checkKept(t *testing.T, sums []syncer.Summary, want ...keptFor) {
	t.Helper()
	for i, w := range want {
		s := sums[i]
		if s.Result.KeptSkipped != w.kept || s.Result.Removed != 0 {
			t.Errorf("%s: %+v, want %d nodes kept for their skipped hosts and none removed", s.Provider, s.Result, w.kept)
		}
		for _, r := range w.reasons {
			if !strings.Contains(s.String(), r) {
				t.Errorf("%s: no host skipped for %q:\n%.2000s", s.Provider, r, s)
			}
		}
	}
}
