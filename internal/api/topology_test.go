package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/registry"
)

// A node's topology fields round-trip through create, GET, PATCH and PUT;
// labels merge on PATCH and are replaced on PUT, and a PUT from a client
// that does not know them leaves them alone.
func TestNodeTopologyFields(t *testing.T) {
	b := setup(t)
	pk := b.createNode(map[string]any{
		"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-5f1c", "fabric": "ib-a",
		"labels": map[string]any{"team": "ml", "tier": ""},
	})
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	n := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	if n["gpu_model"] != "NVIDIA H100 80GB HBM3" || n["gpu_uuid"] != "GPU-5f1c" || n["fabric"] != "ib-a" ||
		fmt.Sprint(n["labels"]) != "map[team:ml tier:]" {
		t.Fatalf("created: %v", n)
	}
	n = b.must(http.StatusOK, b.do("PATCH", path, `{"labels": {"tier": null, "zone": "z1"}, "fabric": null}`)).object(t)
	if fmt.Sprint(n["labels"]) != "map[team:ml zone:z1]" || n["fabric"] != nil {
		t.Errorf("patched: %v", n)
	}
	// A PUT of the six fields a client older than labels knows keeps them.
	six := map[string]any{"ip": "10.0.0.1", "index": 0, "cpu_mem": 1 << 30, "driver_version": "d2",
		"hardware_generation": nil, "gpu_mem": nil}
	n = b.must(http.StatusOK, b.do("PUT", path, six)).object(t)
	if fmt.Sprint(n["labels"]) != "map[team:ml zone:z1]" || n["gpu_model"] != "NVIDIA H100 80GB HBM3" {
		t.Errorf("a PUT without the topology fields changed them: %v", n)
	}
	six["labels"] = map[string]any{"only": "this"}
	six["gpu_uuid"] = nil
	n = b.must(http.StatusOK, b.do("PUT", path, six)).object(t)
	if fmt.Sprint(n["labels"]) != "map[only:this]" || n["gpu_uuid"] != nil {
		t.Errorf("a PUT of labels: %v", n)
	}
	n = b.must(http.StatusOK, b.do("PATCH", path, `{"labels": null}`)).object(t)
	if fmt.Sprint(n["labels"]) != "map[]" {
		t.Errorf("labels: null left %v", n["labels"])
	}
	// The change reached the watch feed and the audit log with the fields.
	if a := b.auditOf(pk, "node.update"); len(a) == 0 || !strings.Contains(fmt.Sprint(a[len(a)-1]["before"]), "only:this") {
		t.Errorf("audit of the last update: %v", a)
	}
}

// Bad topology values are 400s naming the field; labels under
// registryd.io belong to the node's import: a write may echo them, never
// change them.
func TestNodeLabelsRefused(t *testing.T) {
	b := setup(t)
	many := map[string]any{}
	for i := range 33 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"empty fabric", map[string]any{"fabric": ""}, "fabric"},
		{"blank gpu_model", map[string]any{"gpu_model": " H100"}, "gpu_model"},
		{"gpu_uuid not a string", map[string]any{"gpu_uuid": 7}, "gpu_uuid"},
		{"labels not an object", map[string]any{"labels": []string{"a"}}, "labels"},
		{"a label value not a string", map[string]any{"labels": map[string]any{"a": 1}}, "labels"},
		{"a null label on create", map[string]any{"labels": map[string]any{"a": nil}}, "labels"},
		{"a bad key", map[string]any{"labels": map[string]any{"Not Valid": "x"}}, "labels"},
		{"a bad value", map[string]any{"labels": map[string]any{"a": "-x"}}, "labels"},
		{"33 labels", map[string]any{"labels": many}, "labels"},
		{"an import's label", map[string]any{"labels": map[string]any{"scp.registryd.io/region": "x"}}, "labels"},
	} {
		body := map[string]any{"ip": "10.0.0.9", "index": 0, "cpu_mem": 1, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil}
		for k, v := range tc.body {
			body[k] = v
		}
		refused(t, tc.name, b.do("POST", "/v1/nodes/create", body), tc.field)
	}
	refused(t, "duplicate label", b.do("POST", "/v1/nodes/create",
		`{"ip":"10.0.0.9","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null,"labels":{"a":"1","a":"2"}}`), "labels")

	pk := b.createNode(map[string]any{"labels": map[string]any{"team": "ml"}})
	b.exec(`UPDATE nodes SET source = 'scp', labels = labels || '{"scp.registryd.io/region": "kr-west1"}' WHERE pk = $1`, pk)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	refused(t, "patch an import's label", b.do("PATCH", path, `{"labels": {"scp.registryd.io/region": "x"}}`), "labels")
	refused(t, "remove an import's label", b.do("PATCH", path, `{"labels": {"scp.registryd.io/region": null}}`), "labels")
	refused(t, "add an import's label", b.do("PATCH", path, `{"labels": {"e2e.registryd.io/plan": "x"}}`), "labels")
	// GET, edit, PUT: the import's label is echoed and kept; so it is when
	// left out.
	doc := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	doc["labels"].(map[string]any)["team"] = "infra"
	n := b.must(http.StatusOK, b.do("PUT", path, doc)).object(t)
	if fmt.Sprint(n["labels"]) != "map[scp.registryd.io/region:kr-west1 team:infra]" {
		t.Errorf("after an echoing PUT: %v", n["labels"])
	}
	n = b.must(http.StatusOK, b.do("PATCH", path, `{"labels": null}`)).object(t)
	if fmt.Sprint(n["labels"]) != "map[scp.registryd.io/region:kr-west1]" {
		t.Errorf("labels: null removed the import's: %v", n["labels"])
	}
}

// fabric and selector filter list, claim, cordon and watch alike; a
// selector that does not parse is a 400 naming selector and the position.
func TestFabricAndSelectorFilters(t *testing.T) {
	b := setup(t)
	w := watchStream(t, b.url, "?fabric=ib-1&selector="+url.QueryEscape("pool=1"), b.token)
	var pks []int64
	for i := range 6 {
		pks = append(pks, b.createNode(map[string]any{
			"ip": fmt.Sprintf("10.0.0.%d", i), "fabric": fmt.Sprintf("ib-%d", i%2),
			"labels": map[string]any{"team": []string{"ml", "infra", "ml"}[i%3], "pool": fmt.Sprint(i / 3)},
		}))
	}
	for _, tc := range []struct {
		filter map[string]any
		want   []int64
	}{
		{map[string]any{"fabric": "ib-0"}, []int64{pks[0], pks[2], pks[4]}},
		{map[string]any{"selector": "team=ml"}, []int64{pks[0], pks[2], pks[3], pks[5]}},
		{map[string]any{"selector": "team=ml, pool in (1)"}, []int64{pks[3], pks[5]}},
		{map[string]any{"selector": "team!=ml"}, []int64{pks[1], pks[4]}},
		{map[string]any{"selector": "!team"}, nil},
		{map[string]any{"selector": "team=ml", "fabric": "ib-1"}, []int64{pks[3], pks[5]}},
	} {
		if got := b.listed(tc.filter); !slices.Equal(got, tc.want) {
			t.Errorf("list %v: %v, want %v", tc.filter, got, tc.want)
		}
	}

	claim := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job": 7, "count": 2, "fabric": "ib-1", "selector": "pool=1"}`))
	var got struct{ Nodes []struct{ PK int64 } }
	claim.json(t, &got)
	// Only pks[3] and pks[5] are in ib-1 with pool=1.
	if len(got.Nodes) != 2 || got.Nodes[0].PK != pks[3] || got.Nodes[1].PK != pks[5] {
		t.Fatalf("claim of ib-1, pool=1: %s", claim.body)
	}
	// The watch sees the two nodes made and claimed, and nothing else.
	var seen []string
	for claimed := 0; claimed < 2; {
		e := w.next()
		seen = append(seen, fmt.Sprintf("%s %d", e.Type, e.nodePK()))
		if e.nodePK() != pks[3] && e.nodePK() != pks[5] {
			t.Fatalf("watch of fabric ib-1, pool=1 sent %v", seen)
		}
		if e.Type == "claimed" {
			claimed++
		}
	}
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", `{"job": 8, "fabric": "ib-1", "selector": "pool=1"}`))

	var cordoned struct{ Cordoned []struct{ PK int64 } }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", `{"reason": "rewiring", "fabric": "ib-0", "selector": "team=infra"}`)).json(t, &cordoned)
	if len(cordoned.Cordoned) != 1 || cordoned.Cordoned[0].PK != pks[4] {
		t.Errorf("cordon of ib-0, team=infra: %+v, want node %d", cordoned, pks[4])
	}

	for _, bad := range []string{"team=ml,", "team in (a", "Bad Key=x", "team=ml,,pool=1"} {
		for _, r := range []response{
			b.do("POST", "/v1/nodes/list", map[string]any{"selector": bad}),
			b.do("POST", "/v1/nodes/claim", map[string]any{"job": 9, "selector": bad}),
			b.do("POST", "/v1/nodes/cordon", map[string]any{"reason": "x", "selector": bad}),
			b.doWatch("?selector=" + url.QueryEscape(bad)),
		} {
			refused(t, "selector "+bad, r, "selector")
			if !strings.Contains(string(r.body), "at position ") {
				t.Errorf("selector %q: %s; want the position", bad, r.body)
			}
		}
	}
	refused(t, "empty fabric", b.do("POST", "/v1/nodes/list", `{"fabric": ""}`), "fabric")
	refused(t, "fabric null", b.do("POST", "/v1/nodes/list", `{"fabric": null}`), "fabric")
	refused(t, "fabric with a NUL", b.do("POST", "/v1/nodes/list", `{"fabric": "a\u0000b"}`), "fabric")
	refused(t, "fabric with a NUL", b.do("POST", "/v1/fabrics/list", `{"fabric": "a\u0000b"}`), "fabric")
	refused(t, "watch fabric with a NUL", b.doWatch("?fabric=a%00b"), "fabric")
}

// fabricHosts makes hosts of gpus GPUs each: counts[i] hosts in fabric
// fab-i.
func (b *bundle) fabricHosts(gpus int, counts ...int) {
	b.t.Helper()
	for f, n := range counts {
		for h := range n {
			for i := range gpus {
				b.createNode(map[string]any{"ip": fmt.Sprintf("10.%d.%d.1", 100+f, h), "index": i,
					"gpu_mem": 80 << 30, "fabric": fmt.Sprintf("fab-%d", f)})
			}
		}
	}
}

type claimAnswer struct {
	Job   int64
	Nodes []struct {
		PK     int64
		IP     string
		Fabric *string
	}
}

// spread is how many nodes of each host a claim took, and its fabrics.
func (c claimAnswer) spread() (perHost map[string]int, fabrics map[string]bool) {
	perHost, fabrics = map[string]int{}, map[string]bool{}
	for _, n := range c.Nodes {
		perHost[n.IP]++
		if n.Fabric != nil {
			fabrics[*n.Fabric] = true
		}
	}
	return perHost, fabrics
}

// A claim of whole hosts in one fabric over HTTP: best fit, whole groups,
// codes a program can branch on, and claims of named nodes.
func TestFabricGangClaims(t *testing.T) {
	b := setup(t)
	b.fabricHosts(8, 3, 5, 4) // fab-0: 3 hosts, fab-1: 5, fab-2: 4
	var got claimAnswer
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job": 7, "count": 32, "per_host": 8, "same_fabric": true}`)).json(t, &got)
	perHost, fabrics := got.spread()
	if len(perHost) != 4 || len(fabrics) != 1 || !fabrics["fab-2"] {
		t.Errorf("took %v in %v; want 4 whole hosts of fab-2, the best fit", perHost, fabrics)
	}
	for ip, n := range perHost {
		if n != 8 {
			t.Errorf("host %s gave %d nodes", ip, n)
		}
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job": 8, "count": 32, "per_host": 8, "same_fabric": true}`))
	r := b.do("POST", "/v1/nodes/claim", `{"job": 9, "count": 32, "per_host": 8, "same_fabric": true}`)
	if p := r.object(t); r.status != http.StatusConflict || p["code"] != "no_fabric_fit" || !strings.Contains(fmt.Sprint(p["detail"]), "the most in one fabric is 3") {
		t.Errorf("a third gang: %d %s", r.status, r.body)
	}
	r = b.do("POST", "/v1/nodes/claim", `{"job": 9, "count": 40, "per_host": 8}`)
	if p := r.object(t); r.status != http.StatusConflict || p["code"] != "not_enough_hosts" {
		t.Errorf("five hosts with four left: %d %s", r.status, r.body)
	}
	// Named nodes: every one or none, and the 409 says why of each.
	free := b.listed(map[string]any{"free": true, "limit": 3})
	held := b.listed(map[string]any{"current_job": 7, "limit": 1})
	r = b.do("POST", "/v1/nodes/claim", map[string]any{"job": 10, "nodes": []int64{free[0], held[0], 999999}})
	if p := r.object(t); r.status != http.StatusConflict || !strings.Contains(fmt.Sprint(p["detail"]), fmt.Sprintf("node %d is busy", held[0])) ||
		!strings.Contains(fmt.Sprint(p["detail"]), "node 999999 does not exist") {
		t.Errorf("named nodes, one busy, one missing: %d %s", r.status, r.body)
	}
	if got := b.listed(map[string]any{"current_job": 10}); len(got) != 0 {
		t.Errorf("a refused claim of named nodes took %v", got)
	}
	got = claimAnswer{}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 10, "nodes": free})).json(t, &got)
	if len(got.Nodes) != 3 || got.Nodes[0].PK != free[0] || got.Nodes[2].PK != free[2] {
		t.Errorf("named nodes: %+v, want %v", got, free)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"job": 11, "count": 12, "per_host": 8}`, "count"},
		{`{"job": 11, "count": 8, "per_host": 0}`, "per_host"},
		{`{"job": 11, "count": 8, "per_host": 8, "same_host": true}`, "per_host"},
		{`{"job": 11, "count": 8, "same_host": true, "same_fabric": true}`, "same_fabric"},
		{`{"job": 11, "nodes": []}`, "nodes"},
		{`{"job": 11, "nodes": [1, 1]}`, "nodes"},
		{`{"job": 11, "nodes": [1, 2], "count": 3}`, "count"},
		{`{"job": 11, "nodes": [1], "per_host": 1}`, "per_host"},
		{`{"job": 11, "nodes": null}`, "nodes"},
	} {
		refused(t, "claim "+tc.body, b.do("POST", "/v1/nodes/claim", tc.body), tc.field)
	}
}

// POST /v1/fabrics/list answers the capacity of each fabric over the nodes
// a list's filters select; anyone who may list nodes may ask.
func TestListFabrics(t *testing.T) {
	b := setup(t)
	b.fabricHosts(4, 2, 1) // fab-0: 2 hosts of 4, fab-1: 1 host of 4
	b.createNode(map[string]any{"ip": "10.200.0.1"})
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job": 3, "count": 4, "per_host": 4, "fabric": "fab-0"}`))
	var caps []struct {
		Fabric    *string
		Hosts     int
		Nodes     map[string]int
		FreeHosts []struct{ Free, Hosts int } `json:"free_hosts"`
	}
	b.must(http.StatusOK, b.do("POST", "/v1/fabrics/list", nil)).json(t, &caps)
	if len(caps) != 3 || *caps[0].Fabric != "fab-0" || caps[0].Hosts != 2 || caps[0].Nodes["busy"] != 4 || caps[0].Nodes["free"] != 4 ||
		fmt.Sprint(caps[0].FreeHosts) != "[{0 1} {4 1}]" || *caps[1].Fabric != "fab-1" || caps[2].Fabric != nil || caps[2].Hosts != 1 {
		t.Errorf("capacity: %+v", caps)
	}
	caps = nil
	b.token = tokenFor(t, "reader-1", registry.RoleReader)
	b.must(http.StatusOK, b.do("POST", "/v1/fabrics/list", `{"free": true, "fabric": "fab-1"}`)).json(t, &caps)
	if len(caps) != 1 || caps[0].Nodes["free"] != 4 || fmt.Sprint(caps[0].FreeHosts) != "[{4 1}]" {
		t.Errorf("free nodes of fab-1: %+v", caps)
	}
	refused(t, "after", b.do("POST", "/v1/fabrics/list", `{"after": 3}`), "after")
	refused(t, "limit", b.do("POST", "/v1/fabrics/list", `{"limit": 3}`), "limit")
	refused(t, "selector", b.do("POST", "/v1/fabrics/list", `{"selector": "a in ("}`), "selector")
}
