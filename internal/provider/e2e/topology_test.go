package e2e_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
	"github.com/registryd/registryd/internal/provider/providertest"
	"github.com/registryd/registryd/internal/registry"
)

// labels is a host's expected labels; "" leaves one out.
func labels(location, cluster, plan string) map[string]string {
	m := map[string]string{}
	for k, v := range map[string]string{e2e.LabelLocation: location, e2e.LabelCluster: cluster, e2e.LabelPlan: plan} {
		if v != "" {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

func TestLabelKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{e2e.LabelLocation, e2e.LabelCluster, e2e.LabelPlan} {
		if msg := registry.CheckLabelKey(k); msg != "" || !strings.HasPrefix(k, e2e.LabelPrefix) {
			t.Errorf("label key %q: %s (prefix %q)", k, msg, e2e.LabelPrefix)
		}
	}
}

// workers are n running workers of cluster id.
func workers(id, n int) []e2etest.Worker {
	ws := make([]e2etest.Worker, n)
	for i := range ws {
		ws[i] = e2etest.Worker{ID: id*100 + i, Name: fmt.Sprintf("c%d-w%d", id, i),
			PrivateIP: fmt.Sprintf("10.%d.0.%d", id%256, i+1), Status: "Running"}
	}
	return ws
}

// Every worker of a cluster is in the cluster's fabric and carries the
// cluster's labels, whatever strings the provider uses for them.
func TestFetchTopology(t *testing.T) {
	t.Parallel()
	h100 := e2etest.Cluster{Status: "Running", CPU: 96, GPU: 8, MemoryGB: 1800, GPUMemoryGB: 640, GPUCardType: "H100"}
	clusters := []e2etest.Cluster{h100, h100, h100, h100}
	clusters[0].ID, clusters[0].Name, clusters[0].Workers = 301, "llm-pretrain", workers(1, 6)
	clusters[1].ID, clusters[1].Name, clusters[1].Workers = 302, "훈련 클러스터 / fine tune (v2)", workers(2, 4)
	clusters[1].SKUName, clusters[1].Location = "GDC3 8×H100 / 640 GB", "Delhi NCR"
	clusters[2].ID, clusters[2].Name, clusters[2].Workers = 303, "클러스터", workers(3, 3)
	clusters[2].SKUName = strings.Repeat("GDC3.H100-", 10)
	clusters[3].ID, clusters[3].Name, clusters[3].Workers = 304, "llm-pretrain", workers(4, 2) // a name used twice
	clusters[3].Location = "Chennai"
	_, c := setup(t, clusters, nil)
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	providertest.CheckInventory(t, inv)
	want := map[string]struct {
		hosts  int
		labels map[string]string
	}{
		"cluster-301": {6, labels("Delhi", "llm-pretrain", "GDC3.8xH100-640GB")},
		"cluster-302": {4, labels("Delhi-NCR", "fine-tune-v2", "GDC3-8-H100-640-GB")},
		"cluster-303": {3, labels("Delhi", "", strings.Repeat("GDC3.H100-", 6)+"GDC")},
		"cluster-304": {2, labels("Chennai", "llm-pretrain", "GDC3.8xH100-640GB")},
	}
	got := map[string]int{}
	for _, h := range inv.Hosts {
		got[h.Fabric]++
		w, ok := want[h.Fabric]
		if !ok || !strings.HasPrefix(h.ExternalID, strings.TrimPrefix(h.Fabric, "cluster-")+"/") {
			t.Errorf("host %s in fabric %q", h.ExternalID, h.Fabric)
			continue
		}
		if diff := cmp.Diff(w.labels, h.Labels); diff != "" {
			t.Errorf("host %s labels (-want +got):\n%s", h.ExternalID, diff)
		}
	}
	for f, w := range want {
		if got[f] != w.hosts {
			t.Errorf("fabric %s holds %d hosts, want %d", f, got[f], w.hosts)
		}
	}
	// Each host has labels of its own: changing one changes no other.
	inv.Hosts[0].Labels[e2e.LabelCluster] = "changed"
	if inv.Hosts[1].Labels[e2e.LabelCluster] != "llm-pretrain" {
		t.Errorf("hosts of one cluster share their labels map")
	}
}

// The plan's location is optional: without one, the location listed is
// the cluster's.
func TestFetchLocationFallback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, skuDetails, want string }{
		{"no plan", `{"specs":{"gpu":0,"memory":8}}`, "Chennai"},
		{"null location", `{"specs":{"gpu":0,"memory":8},"plan":{"location":null}}`, "Chennai"},
		{"plan not an object", `{"specs":{"gpu":0,"memory":8},"plan":"hourly"}`, "Chennai"},
		{"location nothing of which is kept", `{"specs":{"gpu":0,"memory":8},"plan":{"location":"첸나이"}}`, ""},
		{"plan's own", `{"specs":{"gpu":0,"memory":8},"plan":{"location":"Delhi"}}`, "Delhi"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := `{"code":200,"data":[{"id":7,"name":"c","status":"Running","sku_details":` + tt.skuDetails +
				`,"worker_nodes":[{"id":1,"private_ip":"10.0.0.1"}]}]}`
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
			t.Cleanup(srv.Close)
			cfg := config(srv.URL)
			cfg.Location = "Chennai"
			c, err := e2e.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			inv, err := c.Fetch(t.Context())
			if err != nil || len(inv.Hosts) != 1 {
				t.Fatalf("%+v %v", inv, err)
			}
			if diff := cmp.Diff(labels(tt.want, "c", ""), inv.Hosts[0].Labels); diff != "" || inv.Hosts[0].Fabric != "cluster-7" {
				t.Errorf("fabric %q, labels (-want +got):\n%s", inv.Hosts[0].Fabric, diff)
			}
		})
	}
}
