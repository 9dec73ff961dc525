package scp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/providertest"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/registry"
)

func TestLabelKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{scp.LabelRegion, scp.LabelNodePool, scp.LabelFabricName, scp.LabelServerType} {
		if msg := registry.CheckLabelKey(k); msg != "" || !strings.HasPrefix(k, scp.LabelPrefix) {
			t.Errorf("label key %q: %s (prefix %q)", k, msg, scp.LabelPrefix)
		}
	}
}

// clusterFabric is what GET /v1/cluster-fabrics says of one fabric.
type clusterFabric struct {
	ID         string `json:"id"`
	Name       string `json:"cluster_name"`
	NodePoolID string `json:"node_pool_id"`
	RegionID   string `json:"region_id"`
	ServerType string `json:"server_type"`
	Nodes      []struct {
		ID string `json:"gpu_node_id"`
	} `json:"gpu_node_details"`
}

// listFabrics reads every fabric from the fake, signed as the client signs.
func listFabrics(t *testing.T, fake *scptest.Server) []clusterFabric {
	t.Helper()
	var all []clusterFabric
	for page := 0; ; page++ {
		url := fmt.Sprintf("%s/v1/cluster-fabrics?page=%d&size=4", fake.URL, page)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
		req.Header.Set("Scp-Accesskey", fake.AccessKey)
		req.Header.Set("Scp-Signature", scp.Sign("GET", url, ts, fake.AccessKey, fake.AccountID, fake.SecretKey))
		req.Header.Set("Scp-Timestamp", ts)
		req.Header.Set("Scp-ClientType", "Openapi")
		req.Header.Set("Scp-Api-Version", scptest.APIVersion)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s %v", url, resp.StatusCode, b, err)
		}
		var list struct {
			Fabrics []clusterFabric `json:"cluster_fabrics"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		all = append(all, list.Fabrics...)
		if len(list.Fabrics) < 4 {
			return all
		}
	}
}

// The fake's generated fleet, fetched and signed for real: every host
// carries the fabric that the fabric list puts it in, hosts of one fabric
// share it, and the labels say what the fabric list says.
func TestFetchGeneratedFleetTopology(t *testing.T) {
	t.Parallel()
	fake, c, _ := setup(t, func(c *scp.Config) { c.PageSize = 100 })
	fake.Lock()
	fake.Nodes, fake.HostsPerFabric, fake.Region = nil, 100, "kr-east1"
	for i := range 1000 {
		fake.Nodes = append(fake.Nodes, scptest.Node{ID: fmt.Sprintf("n%04d", i), Name: fmt.Sprintf("gpu-%04d", i),
			PolicyIP: fmt.Sprintf("10.1.%d.%d", i/256, i%256), ServerType: "b300_metal", State: "RUNNING"})
	}
	fake.Unlock()
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	providertest.CheckInventory(t, inv)
	if len(inv.Hosts) != 1000 {
		t.Fatalf("%d hosts, want 1000", len(inv.Hosts))
	}
	byID := map[string]provider.Host{}
	perFabric := map[string]int{}
	for _, h := range inv.Hosts {
		byID[h.ExternalID] = h
		perFabric[h.Fabric]++
	}

	fabrics := listFabrics(t, fake)
	if len(fabrics) != 10 || len(perFabric) != 10 {
		t.Fatalf("%d fabrics listed, hosts in %d fabrics; want 10 of 100 hosts each: %v", len(fabrics), len(perFabric), perFabric)
	}
	for _, f := range fabrics {
		if f.ID == "" || perFabric[f.ID] != 100 || len(f.Nodes) != 100 {
			t.Errorf("fabric %q lists %d nodes and holds %d hosts, want 100", f.ID, len(f.Nodes), perFabric[f.ID])
		}
		want := map[string]string{scp.LabelRegion: f.RegionID, scp.LabelNodePool: f.NodePoolID,
			scp.LabelFabricName: f.Name, scp.LabelServerType: f.ServerType}
		if f.RegionID != "kr-east1" || !strings.HasSuffix(f.NodePoolID, "-kre1a") && !strings.HasSuffix(f.NodePoolID, "-kre1b") {
			t.Errorf("fabric %q in region %q, pool %q", f.ID, f.RegionID, f.NodePoolID)
		}
		for _, n := range f.Nodes {
			h := byID[n.ID]
			if h.Fabric != f.ID {
				t.Errorf("host %s: fabric %q, but %q lists it", n.ID, h.Fabric, f.ID)
			}
			if diff := cmp.Diff(want, h.Labels); diff != "" {
				t.Errorf("host %s labels (-want +got):\n%s", n.ID, diff)
			}
		}
	}
	// Fabric ids are the same on the next pass.
	again, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range again.Hosts {
		if h.Fabric != inv.Hosts[i].Fabric {
			t.Fatalf("host %s moved from fabric %q to %q between passes", h.ExternalID, inv.Hosts[i].Fabric, h.Fabric)
		}
	}
}

// serveNodes answers the products call with one s1v8m32_metal product and
// every other call with nodes.
func serveNodes(t *testing.T, nodes []byte) *scp.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gpu-nodes/products" {
			w.Write([]byte(`{"products":[{"id":"SCALE","name":"s1v8m32_metal","description":"vCPU 8 │ Memory 32G",` +
				`"product_attrs":{"gpu_model":"H100","memory_value":"32"}}]}`))
			return
		}
		w.Write(nodes)
	}))
	t.Cleanup(srv.Close)
	c, err := scp.New(scp.Config{Endpoint: srv.URL, AccessKey: "ak", SecretKey: "sk", Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The seed's own List GPU Nodes example (its count set to the one node it
// lists).
func TestFetchSeedTopology(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/gpu_nodes_seed.json")
	if err != nil {
		t.Fatal(err)
	}
	var seed map[string]any
	if err := json.Unmarshal(b, &seed); err != nil {
		t.Fatal(err)
	}
	seed["count"] = 1
	if b, err = json.Marshal(seed); err != nil {
		t.Fatal(err)
	}
	inv, err := serveNodes(t, b).Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []provider.Host{{
		ExternalID: "0fdd87aab8cb46f59b7c1f81ed03fb3e", Name: "gpu-node-001", IP: "192.168.0.1", State: "RUNNING", Running: true,
		GPUModel: "H100", GPUs: 8, GPUMemBytes: 80 * gib, CPUMemBytes: 32 * gib,
		Fabric: "20c507a036c447cdb3b19468d8ea62ac",
		Labels: map[string]string{
			"scp.registryd.io/region":      "kr-west1",
			"scp.registryd.io/node-pool":   "POOL001-krw1a",
			"scp.registryd.io/fabric-name": "cluster001",
			"scp.registryd.io/server-type": "s1v8m32_metal",
		},
	}}
	if diff := cmp.Diff(want, inv.Hosts); diff != "" || len(inv.Skipped) != 0 {
		t.Errorf("hosts (-want +got):\n%s\nskipped %+v", diff, inv.Skipped)
	}
}

// Topology fields only describe a host: one of an unexpected type is
// unknown, not a failed pass.
func TestFetchTopologyOfOtherTypes(t *testing.T) {
	t.Parallel()
	c := serveNodes(t, []byte(`{"count":2,"gpu_nodes":[`+
		`{"id":"a","policy_ip":"10.0.0.1","server_type":"s1v8m32_metal","state":"RUNNING",`+
		`"cluster_fabric_id":42,"cluster_fabric_name":{"en":"x"},"node_pool_id":["p"],"region_id":true},`+
		`{"id":"b","policy_ip":"10.0.0.2","server_type":"s1v8m32_metal","state":"RUNNING",`+
		`"cluster_fabric_id":"f\u00e9\"1","cluster_fabric_name":"caf\u00e9 \"one\"","node_pool_id":null}]}`))
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Hosts) != 2 {
		t.Fatalf("hosts %+v", inv.Hosts)
	}
	a, b := inv.Hosts[0], inv.Hosts[1]
	if a.Fabric != "" || cmp.Diff(map[string]string{scp.LabelServerType: "s1v8m32_metal"}, a.Labels) != "" {
		t.Errorf("host a: fabric %q, labels %v", a.Fabric, a.Labels)
	}
	if b.Fabric != `fé"1` || b.Labels[scp.LabelFabricName] != "caf-one" || len(b.Labels) != 2 {
		t.Errorf("host b: fabric %q, labels %v", b.Fabric, b.Labels)
	}
}
