package scptest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

// keys lists every object key path in v, looking into the first element of
// lists; null leaves are kept, so nullable fields count.
func keys(v any, prefix string, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			out[prefix+"."+k] = true
			keys(x, prefix+"."+k, out)
		}
	case []any:
		if len(v) > 0 {
			keys(v[0], prefix+"[]", out)
		}
	}
}

func seed(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile("../testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestServerShape checks that the fake's answers have every field of the
// seed's examples.
func TestServerShape(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	fake.Lock()
	fake.Nodes = []scptest.Node{{ID: "n1", Name: "gpu-node-001", PolicyIP: "192.168.0.1", ServerType: "s1v8m32_metal",
		ProductTypeID: "f90e8ef54cc2451b825608e9f95f7bcb", State: "RUNNING"}}
	fake.Unlock()
	for _, tt := range []struct{ path, seed string }{
		{"/v1/gpu-nodes", "gpu_nodes_seed.json"},
		{"/v1/cluster-fabrics", "cluster_fabrics_seed.json"},
	} {
		status, got := send(t, fake, tt.path, nil)
		if status != 200 {
			t.Fatalf("GET %s = %d %v", tt.path, status, got)
		}
		wantKeys, gotKeys := map[string]bool{}, map[string]bool{}
		keys(seed(t, tt.seed), "", wantKeys)
		keys(got, "", gotKeys)
		for k := range wantKeys {
			if !gotKeys[k] {
				t.Errorf("GET %s: the fake's answer lacks %s", tt.path, k)
			}
		}
	}
}

// fleet is n nodes, none with a topology of its own.
func fleet(n int) []scptest.Node {
	nodes := make([]scptest.Node, n)
	for i := range nodes {
		nodes[i] = scptest.Node{ID: fmt.Sprintf("n%04d", i), Name: fmt.Sprintf("gpu-%04d", i),
			PolicyIP: fmt.Sprintf("10.0.%d.%d", i/256, i%256), ServerType: "s8h100_metal", ProductTypeID: "p-h100", State: "RUNNING"}
	}
	return nodes
}

type fabricSummary struct {
	ID, Name, Pool, Region string
	Nodes                  []string
}

// fabrics reads every page of GET /v1/cluster-fabrics with query.
func fabrics(t *testing.T, fake *scptest.Server, query string) (int, []fabricSummary) {
	t.Helper()
	var all []fabricSummary
	count := -1
	for page := 0; ; page++ {
		path := fmt.Sprintf("/v1/cluster-fabrics?size=2&page=%d%s", page, query)
		status, body := send(t, fake, path, nil)
		if status != 200 {
			t.Fatalf("GET %s = %d %v", path, status, body)
		}
		count = int(body["count"].(float64))
		list := body["cluster_fabrics"].([]any)
		for _, item := range list {
			f := item.(map[string]any)
			s := fabricSummary{ID: f["id"].(string), Name: f["cluster_name"].(string),
				Pool: f["node_pool_id"].(string), Region: f["region_id"].(string)}
			for _, d := range f["gpu_node_details"].([]any) {
				s.Nodes = append(s.Nodes, d.(map[string]any)["gpu_node_id"].(string))
			}
			if int(f["used_server_count"].(float64)) != len(s.Nodes) {
				t.Errorf("fabric %s: used_server_count %v, %d nodes", s.ID, f["used_server_count"], len(s.Nodes))
			}
			all = append(all, s)
		}
		if len(list) < 2 {
			return count, all
		}
	}
}

func TestServerGeneratesFabrics(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	fake.Lock()
	fake.Nodes = fleet(1200)
	fake.Unlock()

	count, got := fabrics(t, fake, "")
	if count != 3 || len(got) != 3 {
		t.Fatalf("count %d, %d fabrics; want 3 of default size", count, len(got))
	}
	hexID := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for i, f := range got {
		want := min(scptest.DefaultHostsPerFabric, 1200-i*scptest.DefaultHostsPerFabric)
		if len(f.Nodes) != want || f.Nodes[0] != fmt.Sprintf("n%04d", i*scptest.DefaultHostsPerFabric) {
			t.Errorf("fabric %d holds %d nodes from %s, want %d from n%04d", i, len(f.Nodes), f.Nodes[0], want, i*500)
		}
		if !hexID.MatchString(f.ID) || f.Name != fmt.Sprintf("cluster%03d", i+1) || f.Pool != "POOL001-krw1a" || f.Region != "kr-west1" {
			t.Errorf("fabric %d = %+v", i, f)
		}
	}
	if got[0].ID == got[1].ID || got[1].ID == got[2].ID {
		t.Errorf("fabric ids repeat: %s %s %s", got[0].ID, got[1].ID, got[2].ID)
	}

	// The node's own answer agrees with the fabric that lists it.
	status, node := send(t, fake, "/v1/gpu-nodes/n0777", nil)
	if status != 200 || node["cluster_fabric_id"] != got[1].ID || node["cluster_fabric_name"] != "cluster002" ||
		node["node_pool_id"] != "POOL001-krw1a" || node["region_id"] != "kr-west1" {
		t.Errorf("GET /v1/gpu-nodes/n0777 = %d %v, want it in %+v", status, node, got[1].ID)
	}
	status, one := send(t, fake, "/v1/cluster-fabrics/"+got[2].ID, nil)
	if status != 200 || one["cluster_name"] != "cluster003" || one["used_server_count"] != float64(200) {
		t.Errorf("GET /v1/cluster-fabrics/%s = %d %v", got[2].ID, status, one)
	}

	// Another fake generates the same ids: they are stable across passes
	// and restarts.
	again := scptest.New(t)
	again.Lock()
	again.Nodes = fleet(1200)
	again.Unlock()
	if _, same := fabrics(t, again, ""); !cmp.Equal(same, got) {
		t.Errorf("a second fake generated other fabrics:\n%s", cmp.Diff(got, same))
	}
}

func TestServerFabricSettings(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	fake.Lock()
	fake.Nodes = fleet(45)
	fake.HostsPerFabric = 5
	fake.Region = "kr-south2"
	// Nodes of their own topology: one without a fabric, two in a fabric
	// placed among the generated ones.
	fake.Nodes[3].Topology = &scptest.Topology{NodePoolID: "POOL009-krs2b", RegionID: "kr-south2"}
	mine := &scptest.Topology{FabricID: "0fdd87aab8cb46f59b7c1f81ed03fb3e", FabricName: "my fabric", NodePoolID: "POOL009-krs2b", RegionID: "kr-south2"}
	fake.Nodes[40].Topology, fake.Nodes[44].Topology = mine, mine
	fake.Unlock()

	count, got := fabrics(t, fake, "")
	var names, pools []string
	for _, f := range got {
		names, pools = append(names, f.Name), append(pools, f.Pool)
	}
	wantNames := []string{"cluster001", "cluster002", "cluster003", "cluster004", "cluster005", "cluster006", "cluster007", "cluster008", "my fabric", "cluster009"}
	wantPools := []string{"POOL001-krs2a", "POOL001-krs2a", "POOL001-krs2a", "POOL001-krs2a", "POOL002-krs2b", "POOL002-krs2b",
		"POOL002-krs2b", "POOL002-krs2b", "POOL009-krs2b", "POOL003-krs2a"}
	if count != 10 || !slices.Equal(names, wantNames) || !slices.Equal(pools, wantPools) {
		t.Fatalf("count %d, fabrics %v in pools %v; want %v in %v", count, names, pools, wantNames, wantPools)
	}
	if f := got[0]; !slices.Equal(f.Nodes, []string{"n0000", "n0001", "n0002", "n0004"}) {
		t.Errorf("first fabric holds %v; n0003 has no fabric", f.Nodes)
	}
	if f := got[8]; f.ID != mine.FabricID || !slices.Equal(f.Nodes, []string{"n0040", "n0044"}) {
		t.Errorf("fabric %+v, want n0040 and n0044 in %s", f, mine.FabricID)
	}
	status, node := send(t, fake, "/v1/gpu-nodes/n0003", nil)
	if v, ok := node["cluster_fabric_id"]; status != 200 || !ok || v != nil || node["node_pool_id"] != "POOL009-krs2b" {
		t.Errorf("a node without fabric: %d %v; want cluster_fabric_id null", status, node)
	}

	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"&cluster_fabric_name=cluster003", []string{"cluster003"}},
		{"&cluster_fabric_name=my+fabric", []string{"my fabric"}},
		{"&node_pool_id=POOL003-krs2a", []string{"cluster009"}},
		{"&node_pool_id=POOL009-krs2b&state=RUNNING", []string{"my fabric"}},
		{"&state=STOPPED", nil},
	} {
		count, got := fabrics(t, fake, tt.query)
		var names []string
		for _, f := range got {
			names = append(names, f.Name)
		}
		if count != len(tt.want) || !slices.Equal(names, tt.want) {
			t.Errorf("fabrics%s: count %d, %v; want %v", tt.query, count, names, tt.want)
		}
	}
}
