package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func TestCreateNode(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", map[string]any{
		"ip": "2001:DB8:0:0::7", "index": 3, "cpu_mem": 2199023255552, "driver_version": "550.54.15",
		"hardware_generation": hw, "gpu_mem": 85899345920,
	}))
	n := r.object(t)
	pk := int64(n["pk"].(float64))
	if got, want := r.header.Get("Location"), "/v1/nodes/"+strconv.FormatInt(pk, 10); got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	want := map[string]any{
		"pk": float64(pk), "ip": "2001:db8::7", "index": float64(3), "cpu_mem": float64(2199023255552),
		"driver_version": "550.54.15", "hardware_generation": float64(hw), "gpu_mem": float64(85899345920),
		"last_seen": nil, "current_job": nil, "owner": nil, "source": "api", "schedulable": true, "external_id": nil, "provider_state": nil,
		"lease_expires_at": nil, "state": "free", "cordon_reason": nil, "version": float64(1),
		"gpu_model": nil, "gpu_uuid": nil, "fabric": nil, "labels": map[string]any{},
	}
	delete(n, "created_at")
	delete(n, "updated_at")
	if diff := cmp.Diff(want, n); diff != "" {
		t.Errorf("created node (-want +got):\n%s", diff)
	}
	// The stored node is what create answered.
	got := b.must(http.StatusOK, b.do("GET", r.header.Get("Location"), nil)).object(t)
	delete(got, "created_at")
	delete(got, "updated_at")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("retrieved node (-want +got):\n%s", diff)
	}
}

func TestCreateNodeCanonicalIP(t *testing.T) {
	b := setup(t)
	for i, tc := range []struct{ in, want string }{
		{"10.1.2.3", "10.1.2.3"},
		{"2001:DB8:0:0::7", "2001:db8::7"},
		{"2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"},
		{"::ffff:192.0.2.9", "192.0.2.9"},
		{"::1", "::1"},
	} {
		r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", map[string]any{
			"ip": tc.in, "index": i, "cpu_mem": 0, "driver_version": "", "hardware_generation": nil, "gpu_mem": nil,
		}))
		if got := r.object(t)["ip"]; got != tc.want {
			t.Errorf("ip %q stored as %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCreateNodeConflict(t *testing.T) {
	b := setup(t)
	pk := b.createNode(map[string]any{"ip": "2001:db8::7", "index": 1})
	// The same pair written differently is the same pair.
	r := b.must(http.StatusConflict, b.do("POST", "/v1/nodes/create", map[string]any{
		"ip": "2001:DB8:0:0::7", "index": 1, "cpu_mem": 5, "driver_version": "x", "hardware_generation": nil, "gpu_mem": nil,
	}))
	p := r.object(t)
	if p["existing_pk"] != float64(pk) {
		t.Errorf("existing_pk = %v, want %d", p["existing_pk"], pk)
	}
	if !strings.Contains(p["detail"].(string), strconv.FormatInt(pk, 10)) {
		t.Errorf("detail %q does not name node %d", p["detail"], pk)
	}
	if n := b.countNodes(); n != 1 {
		t.Errorf("%d nodes stored, want 1", n)
	}
	// Another index on the same host is fine.
	b.createNode(map[string]any{"ip": "2001:db8::7", "index": 2})
}

func TestCreateNodeConcurrentSamePair(t *testing.T) {
	b := setup(t)
	const n = 16
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i] = b.do("POST", "/v1/nodes/create", map[string]any{
				"ip": "10.9.9.9", "index": 0, "cpu_mem": i, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil,
			}).status
		})
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
		default:
			t.Errorf("status %d, want 201 or 409", s)
		}
	}
	if created != 1 || b.countNodes() != 1 {
		t.Errorf("%d created, %d stored; want exactly 1", created, b.countNodes())
	}
}

// validNode is a complete, valid create body; cases below break one thing.
func validNode() map[string]any {
	return map[string]any{
		"ip": "10.0.0.1", "index": 0, "cpu_mem": 1024, "driver_version": "550.54.15",
		"hardware_generation": nil, "gpu_mem": nil,
	}
}

func with(k string, v any) map[string]any {
	m := validNode()
	m[k] = v
	return m
}

func without(k string) map[string]any {
	m := validNode()
	delete(m, k)
	return m
}

func TestCreateNodeInvalid(t *testing.T) {
	b := setup(t)
	for _, tc := range []struct {
		name   string
		body   any
		status int
		fields []string // fields the problem must name
	}{
		{"bad ip", with("ip", "10.0.0.256"), 400, []string{"ip"}},
		{"hostname ip", with("ip", "gpu-host-1"), 400, []string{"ip"}},
		{"cidr ip", with("ip", "10.0.0.0/24"), 400, []string{"ip"}},
		{"zone ip", with("ip", "fe80::1%eth0"), 400, []string{"ip"}},
		{"empty ip", with("ip", ""), 400, []string{"ip"}},
		{"unspecified ip", with("ip", "0.0.0.0"), 400, []string{"ip"}},
		{"unspecified ipv6", with("ip", "::"), 400, []string{"ip"}},
		{"broadcast ip", with("ip", "255.255.255.255"), 400, []string{"ip"}},
		{"multicast ip", with("ip", "224.0.0.251"), 400, []string{"ip"}},
		{"ip number", with("ip", 167772161), 400, []string{"ip"}},
		{"negative index", with("index", -1), 400, []string{"index"}},
		{"huge index", with("index", int64(1)<<40), 400, []string{"index"}},
		{"negative cpu_mem", with("cpu_mem", -5), 400, []string{"cpu_mem"}},
		{"negative gpu_mem", with("gpu_mem", -1), 400, []string{"gpu_mem"}},
		{"cpu_mem beyond int64", `{"ip":"10.0.0.1","index":0,"cpu_mem":9223372036854775808,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, 400, []string{"cpu_mem"}},
		{"gpu_mem float", with("gpu_mem", 1.5), 400, []string{"gpu_mem"}},
		{"index float that looks whole", `{"ip":"10.0.0.1","index":1.0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, 400, []string{"index"}},
		{"cpu_mem exponent", `{"ip":"10.0.0.1","index":0,"cpu_mem":1e9,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, 400, []string{"cpu_mem"}},
		{"cpu_mem string", with("cpu_mem", "1024"), 400, []string{"cpu_mem"}},
		{"index bool", with("index", true), 400, []string{"index"}},
		{"driver_version number", with("driver_version", 550), 400, []string{"driver_version"}},
		{"driver_version control char", with("driver_version", "550\n"), 400, []string{"driver_version"}},
		{"driver_version too long", with("driver_version", strings.Repeat("9", 129)), 400, []string{"driver_version"}},
		{"null ip", with("ip", nil), 400, []string{"ip"}},
		{"null cpu_mem", with("cpu_mem", nil), 400, []string{"cpu_mem"}},
		{"missing ip", without("ip"), 400, []string{"ip"}},
		{"missing gpu_mem", without("gpu_mem"), 400, []string{"gpu_mem"}},
		{"missing hardware_generation", without("hardware_generation"), 400, []string{"hardware_generation"}},
		{"unknown field", with("gpu_count", 8), 400, []string{"gpu_count"}},
		{"read-only pk on create", with("pk", 7), 400, []string{"pk"}},
		{"missing hardware generation row", with("hardware_generation", 424242), 400, []string{"hardware_generation"}},
		{"zero hardware generation", with("hardware_generation", 0), 400, []string{"hardware_generation"}},
		{"several at once", map[string]any{"ip": "x", "index": -1}, 400, []string{"ip", "index", "cpu_mem", "driver_version", "hardware_generation", "gpu_mem"}},
		{"duplicate member", `{"ip":"10.0.0.1","ip":"10.0.0.2","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, 400, []string{"ip"}},
		{"malformed json", `{"ip": "10.0.0.1",`, 400, nil},
		{"not json", `ip=10.0.0.1`, 400, nil},
		{"array body", `[1,2]`, 400, nil},
		{"trailing data", `{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null} {}`, 400, nil},
		{"empty body", ``, 400, nil},
		{"body over 1 MiB", `{"driver_version":"` + strings.Repeat("a", 1<<20) + `"}`, 413, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do("POST", "/v1/nodes/create", tc.body)
			b.must(tc.status, r)
			got := r.problemFields(t)
			for _, f := range tc.fields {
				if !slices.Contains(got, f) {
					t.Errorf("problem names %v, want it to name %q; body %s", got, f, r.body)
				}
			}
		})
	}
	if n := b.countNodes(); n != 0 {
		t.Errorf("%d nodes stored by invalid requests", n)
	}
}

func TestCreateNodeMediaType(t *testing.T) {
	b := setup(t)
	r := b.do("POST", "/v1/nodes/create", validNode(), "Content-Type", "application/x-www-form-urlencoded")
	b.must(http.StatusUnsupportedMediaType, r)
	if !strings.Contains(string(r.body), "application/json") {
		t.Errorf("415 does not say what to send: %s", r.body)
	}
	// JSON is UTF-8: another charset is refused, not misread.
	for _, ct := range []string{"application/json; charset=utf-16", "application/json; charset=ISO-8859-1"} {
		r := b.do("POST", "/v1/nodes/create", validNode(), "Content-Type", ct)
		b.must(http.StatusUnsupportedMediaType, r)
		if !strings.Contains(string(r.body), "UTF-8") {
			t.Errorf("%s: 415 does not say why: %s", ct, r.body)
		}
	}
	b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", with("ip", "10.0.0.2"), "Content-Type", "application/json; charset=UTF-8"))
	b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", with("ip", "10.0.0.3"), "Content-Type", "application/json; charset=utf-8"))
	// Without a Content-Type the body is still read as JSON.
	b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", validNode(), "Content-Type", ""))
}

func TestRetrieveNode(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/nodes/%d", pk), nil))
	for _, tc := range []struct {
		path   string
		status int
	}{
		{fmt.Sprintf("/v1/nodes/%d", pk+1000), 404},
		{"/v1/nodes/0", 400},
		{"/v1/nodes/-3", 400},
		{"/v1/nodes/abc", 400},
		{"/v1/nodes/1.5", 400},
		{"/v1/nodes/99999999999999999999", 400},
		{"/v1/nodes/9223372036854775807", 404},
	} {
		b.must(tc.status, b.do("GET", tc.path, nil))
	}
}

func TestUpdateNode(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("A100")
	pk := b.createNode(map[string]any{"hardware_generation": hw, "gpu_mem": 80 << 30})
	path := fmt.Sprintf("/v1/nodes/%d", pk)

	// GET → edit → PUT works with every read-only field echoed.
	node := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	node["driver_version"] = "560.28.03"
	node["gpu_mem"] = nil
	node["hardware_generation"] = nil
	got := b.must(http.StatusOK, b.do("PUT", path, node)).object(t)
	if got["driver_version"] != "560.28.03" || got["gpu_mem"] != nil || got["hardware_generation"] != nil {
		t.Errorf("PUT result %v", got)
	}
	if got["updated_at"] == node["updated_at"] {
		t.Errorf("updated_at did not move")
	}

	// PUT without a nullable field is refused, naming it.
	r := b.must(http.StatusBadRequest, b.do("PUT", path, without("gpu_mem")))
	if diff := cmp.Diff([]string{"gpu_mem"}, r.problemFields(t)); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	r = b.must(http.StatusBadRequest, b.do("PUT", path, map[string]any{"ip": "10.0.0.1"}))
	if diff := cmp.Diff([]string{"index", "cpu_mem", "driver_version", "hardware_generation", "gpu_mem"}, r.problemFields(t)); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	b.must(http.StatusNotFound, b.do("PUT", "/v1/nodes/987654", validNode()))
	b.must(http.StatusBadRequest, b.do("PUT", "/v1/nodes/x", validNode()))
}

func TestUpdateNodeReadOnlyFields(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	node := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	for _, tc := range []struct {
		field string
		value any
	}{
		{"pk", float64(pk + 1)},
		{"pk", nil},
		{"current_job", 42},
		{"last_seen", "2099-01-01T00:00:00Z"},
		{"created_at", "2001-01-01T00:00:00Z"},
		{"updated_at", "2001-01-01T00:00:00Z"},
		{"updated_at", "yesterday"},
	} {
		edited := map[string]any{}
		for k, v := range node {
			edited[k] = v
		}
		edited[tc.field] = tc.value
		edited["driver_version"] = "changed"
		for _, method := range []string{"PUT", "PATCH"} {
			r := b.must(http.StatusBadRequest, b.do(method, path, edited))
			if diff := cmp.Diff([]string{tc.field}, r.problemFields(t)); diff != "" {
				t.Errorf("%s with %s=%v: fields (-want +got):\n%s", method, tc.field, tc.value, diff)
			}
		}
	}
	if got := b.must(http.StatusOK, b.do("GET", path, nil)).object(t); got["driver_version"] != node["driver_version"] {
		t.Errorf("a refused update changed the node: %v", got)
	}
}

func TestUpdateNodeLastSeenEcho(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	node := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	// A heartbeat lands between the client's GET and its PUT.
	b.seen("0", pk)
	node["driver_version"] = "after-heartbeat"
	b.must(http.StatusOK, b.do("PUT", path, node)) // last_seen: null echoed, node seen since
	node = b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	b.seen("1 second", pk)
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"last_seen": node["last_seen"], "cpu_mem": 7}))
}

func TestUpdateNodeConflict(t *testing.T) {
	b := setup(t)
	a := b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0})
	other := b.createNode(map[string]any{"ip": "10.0.0.1", "index": 1})
	r := b.must(http.StatusConflict, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", other), map[string]any{"index": 0}))
	if r.object(t)["existing_pk"] != float64(a) {
		t.Errorf("conflict names %s, want node %d", r.body, a)
	}
	r = b.must(http.StatusConflict, b.do("PUT", fmt.Sprintf("/v1/nodes/%d", other), with("index", 0)))
	if r.object(t)["existing_pk"] != float64(a) {
		t.Errorf("conflict names %s, want node %d", r.body, a)
	}
	// Writing a node's own pair back is no conflict.
	b.must(http.StatusOK, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", other), map[string]any{"ip": "10.0.0.1", "index": 1}))
}

func TestPatchNode(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("L40S")
	pk := b.createNode(map[string]any{"hardware_generation": hw, "gpu_mem": 48 << 30, "cpu_mem": 100})
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	before := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)

	// Absent members stay; present ones change.
	got := b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"cpu_mem": 200}, "Content-Type", "application/merge-patch+json")).object(t)
	if got["cpu_mem"] != float64(200) || got["gpu_mem"] != before["gpu_mem"] || got["hardware_generation"] != before["hardware_generation"] || got["ip"] != before["ip"] {
		t.Errorf("after patch: %v", got)
	}
	// null clears the nullable fields.
	got = b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"gpu_mem": nil, "hardware_generation": nil})).object(t)
	if got["gpu_mem"] != nil || got["hardware_generation"] != nil {
		t.Errorf("null did not clear: %v", got)
	}
	// null on a non-nullable field is refused and changes nothing.
	for _, f := range []string{"ip", "index", "cpu_mem", "driver_version"} {
		r := b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{f: nil, "gpu_mem": 1}))
		if !slices.Contains(r.problemFields(t), f) {
			t.Errorf("null %s: problem names %v", f, r.problemFields(t))
		}
	}
	// An empty patch changes nothing, not even the version stamp.
	same := b.must(http.StatusOK, b.do("PATCH", path, map[string]any{})).object(t)
	if diff := cmp.Diff(got, same); diff != "" {
		t.Errorf("empty patch changed the node:\n%s", diff)
	}
	b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"hardware_generation": 999999}))
	b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"bogus": 1}))
	b.must(http.StatusNotFound, b.do("PATCH", "/v1/nodes/424242", map[string]any{"cpu_mem": 1}))
	if after := b.must(http.StatusOK, b.do("GET", path, nil)).object(t); after["cpu_mem"] != float64(200) {
		t.Errorf("refused patches changed cpu_mem to %v", after["cpu_mem"])
	}
}

func TestDeleteNode(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	r := b.must(http.StatusNoContent, b.do("DELETE", path, nil))
	if len(r.body) != 0 {
		t.Errorf("204 with a body: %q", r.body)
	}
	b.must(http.StatusNotFound, b.do("DELETE", path, nil))
	b.must(http.StatusNotFound, b.do("GET", path, nil))
	b.must(http.StatusBadRequest, b.do("DELETE", "/v1/nodes/nope", nil))
}

func TestDeleteNodeHoldingJob(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	b.exec("UPDATE nodes SET current_job = 77 WHERE pk = $1", pk)
	r := b.must(http.StatusConflict, b.do("DELETE", fmt.Sprintf("/v1/nodes/%d", pk), nil))
	if !strings.Contains(r.object(t)["detail"].(string), "77") {
		t.Errorf("409 does not name the job: %s", r.body)
	}
	if b.countNodes() != 1 {
		t.Error("node holding a job was deleted")
	}
}

func TestListNodes(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.ListBatch = 3 }) // force several batches
	hw := b.createHardware("H200")
	var pks []int64
	for i := range 10 {
		f := map[string]any{"ip": fmt.Sprintf("10.0.1.%d", i/4), "index": i % 4, "cpu_mem": i * 100}
		if i%2 == 0 {
			f["hardware_generation"] = hw
			f["gpu_mem"] = (i + 1) << 30
		}
		pks = append(pks, b.createNode(f))
	}
	b.exec("UPDATE nodes SET current_job = 5 WHERE pk = $1", pks[1])
	b.seen("0", pks[2], pks[3])
	b.seen("-1 hour", pks[4])

	list := func(body any) []int64 {
		t.Helper()
		r := b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", body))
		var nodes []struct{ PK int64 }
		r.json(t, &nodes)
		out := []int64{}
		for _, n := range nodes {
			out = append(out, n.PK)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		body any
		want []int64
	}{
		{"no body", nil, pks},
		{"empty object", map[string]any{}, pks},
		{"limit", map[string]any{"limit": 4}, pks[:4]},
		{"after", map[string]any{"after": pks[6]}, pks[7:]},
		{"after and limit", map[string]any{"after": pks[2], "limit": 3}, pks[3:6]},
		{"free", map[string]any{"free": true}, slices.Delete(slices.Clone(pks), 1, 2)},
		{"busy", map[string]any{"free": false}, pks[1:2]},
		{"current_job", map[string]any{"current_job": 5}, pks[1:2]},
		{"hardware_generation", map[string]any{"hardware_generation": hw}, []int64{pks[0], pks[2], pks[4], pks[6], pks[8]}},
		{"min_gpu_mem", map[string]any{"min_gpu_mem": 5 << 30}, []int64{pks[4], pks[6], pks[8]}},
		{"min_cpu_mem", map[string]any{"min_cpu_mem": 700}, pks[7:]},
		{"ip", map[string]any{"ip": "10.0.1.1"}, pks[4:8]},
		{"ip and index", map[string]any{"ip": "10.0.1.1", "index": 2}, pks[6:7]},
		{"seen_within", map[string]any{"seen_within": 60}, pks[2:4]},
		{"combined", map[string]any{"free": true, "hardware_generation": hw, "min_gpu_mem": 3 << 30, "limit": 2}, []int64{pks[2], pks[4]}},
		{"nothing matches", map[string]any{"ip": "192.0.2.1"}, []int64{}},
	} {
		if diff := cmp.Diff(tc.want, list(tc.body)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	// Keyset pages cover every node exactly once (and end: a page that
	// does not move on would loop for ever).
	var all []int64
	after := int64(0)
	for pages := 0; ; pages++ {
		if pages > len(pks) {
			t.Fatalf("keyset pages do not end: %d pages for %d nodes, at %v", pages, len(pks), all)
		}
		page := list(map[string]any{"after": after, "limit": 4})
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1]
	}
	if diff := cmp.Diff(pks, all); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
}

func TestListNodesInvalid(t *testing.T) {
	b := setup(t)
	for _, tc := range []struct {
		body  string
		field string
	}{
		{`{"bogus": 1}`, "bogus"},
		{`{"limit": 0}`, "limit"},
		{`{"limit": 1001}`, "limit"},
		{`{"limit": "5"}`, "limit"},
		{`{"free": "yes"}`, "free"},
		{`{"after": -1}`, "after"},
		{`{"ip": "not-an-ip"}`, "ip"},
		{`{"seen_within": 0}`, "seen_within"},
		{`{"min_gpu_mem": 1.5}`, "min_gpu_mem"},
		{`{"index": -2}`, "index"},
		{`[]`, ""},
		{`{"free": tru`, ""},
	} {
		r := b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", tc.body))
		if tc.field != "" && !slices.Contains(r.problemFields(t), tc.field) {
			t.Errorf("%s: problem names %v, want %q", tc.body, r.problemFields(t), tc.field)
		}
	}
}

func TestPing(t *testing.T) {
	b := setup(t)
	r := b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil))
	if r.object(t)["status"] != "ok" {
		t.Errorf("ping: %s", r.body)
	}
}

// An agent registering a node the sync worker imported adopts it: 200, it
// becomes the owner, the provider's fields stay.
func TestCreateAdoptsImportedNode(t *testing.T) {
	b := setup(t)
	mem := int64(80) << 30
	_, err := b.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.7.0.1", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.token = tokenFor(t, "agent-gpu-9", registry.RoleAgent)
	body := map[string]any{"ip": "10.7.0.1", "index": 0, "cpu_mem": 5, "driver_version": "560.35.03", "hardware_generation": 424242, "gpu_mem": nil}
	b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/create", body)) // bad input is still bad
	body["hardware_generation"] = nil
	n := b.must(http.StatusOK, b.do("POST", "/v1/nodes/create", body)).object(t)
	if n["owner"] != "agent-gpu-9" || n["driver_version"] != "560.35.03" || n["source"] != "scp" || n["gpu_mem"] != float64(mem) || n["external_id"] != "h1" {
		t.Errorf("adopted node: %v", n)
	}
	// Adopted once; the next registration is a conflict.
	b.token = tokenFor(t, "agent-gpu-10", registry.RoleAgent)
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/create", body))
}

// failingLists fails every ListNodes call after the first: the database
// going away while a long list streams.
type failingLists struct {
	*store.Store
	calls atomic.Int32
}

func (f *failingLists) ListNodes(ctx context.Context, filter registry.NodeFilter) ([]registry.Node, error) {
	if f.calls.Add(1) > 1 {
		return nil, fmt.Errorf("store: list nodes: %w", registry.ErrUnavailable)
	}
	return f.Store.ListNodes(ctx, filter)
}

// A list that fails after its first batch is cut off: the client sees a
// broken response, never a short array that looks complete.
func TestListNodesFailsMidStream(t *testing.T) {
	b := setup(t)
	for i := range 5 {
		b.createNode(map[string]any{"index": i})
	}
	verifier, _ := auth.NewVerifier(auth.Config{Secret: testSecret})
	srv := httptest.NewServer(api.New(api.Config{Store: &failingLists{Store: b.store}, OpenAPI: registryd.OpenAPI,
		Auth: verifier, ListBatch: 2}))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/nodes/list", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("read a complete-looking body: %s", body)
	}
	var nodes []map[string]any
	if json.Unmarshal(body, &nodes) == nil {
		t.Errorf("the truncated body parses as JSON: %s", body)
	}
	// The first batch fails before anything is written: a clean 503.
	first := &failingLists{Store: b.store}
	first.calls.Store(1)
	srv2 := httptest.NewServer(api.New(api.Config{Store: first, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	defer srv2.Close()
	req, _ = http.NewRequest("POST", srv2.URL+"/v1/nodes/list", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("first batch failing: status %d", resp2.StatusCode)
	}
}

// A list that fits one batch is answered with its length and the same
// bytes as the streamed form; a longer one is still streamed. (Pages of
// several nodes: net/http itself sets the length of an answer under 2 KB.)
func TestListOnePageFraming(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.ListBatch = 10 })
	var pks []int64
	for i := range 14 {
		pks = append(pks, b.createNode(map[string]any{"ip": "10.0.2.1", "index": i, "cpu_mem": 100}))
	}
	for _, tc := range []struct {
		name    string
		body    any
		nodes   int
		oneShot bool
	}{
		{"under a batch", map[string]any{"limit": 8}, 8, true},
		{"a limit of exactly a batch", map[string]any{"limit": 10}, 10, true},
		{"the tail, under a batch", map[string]any{"after": pks[7]}, 6, true},
		{"more than a batch", map[string]any{}, 14, false},
		{"a limit above a batch", map[string]any{"limit": 12}, 12, false},
	} {
		r := b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", tc.body))
		if len(r.body) < 2048 {
			t.Fatalf("%s: %d bytes; the test needs answers net/http would not measure itself", tc.name, len(r.body))
		}
		if got := r.header.Get("Content-Length"); (got != "") != tc.oneShot {
			t.Errorf("%s: Content-Length %q, want one: %v", tc.name, got, tc.oneShot)
		} else if tc.oneShot && got != strconv.Itoa(len(r.body)) {
			t.Errorf("%s: Content-Length %s for %d bytes", tc.name, got, len(r.body))
		}
		var nodes []map[string]any
		r.json(t, &nodes)
		if len(nodes) != tc.nodes || !bytes.HasSuffix(r.body, []byte("]\n")) {
			t.Errorf("%s: %d nodes, want %d; body %q", tc.name, len(nodes), tc.nodes, r.body)
		}
	}
}

// A node stored before a rule it breaks was made (an address no host has,
// a deceptive character) stays editable: an update that leaves the field
// as it is succeeds, one that sets it anew is held to the rule.
func TestUpdateKeepsFieldsStoredBeforeTheirRule(t *testing.T) {
	b := setup(t)
	pk := b.createNode(map[string]any{"ip": "10.0.0.9"})
	b.exec(fmt.Sprintf(`UPDATE nodes SET ip = '0.0.0.0', driver_version = E'550\u200b' WHERE pk = %d`, pk))
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"cpu_mem": 7}))
	var n map[string]any
	b.must(http.StatusOK, b.do("GET", path, nil)).json(t, &n)
	b.must(http.StatusOK, b.do("PUT", path, map[string]any{"ip": n["ip"], "index": 0, "cpu_mem": 8, "driver_version": n["driver_version"],
		"hardware_generation": nil, "gpu_mem": nil}))
	// Set anew, the rules hold.
	other := b.createNode(map[string]any{"ip": "10.0.0.10"})
	r := b.must(http.StatusBadRequest, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", other), map[string]any{"ip": "0.0.0.0", "driver_version": "550\u200b"}))
	if got := r.problemFields(t); !slices.Contains(got, "ip") || !slices.Contains(got, "driver_version") {
		t.Errorf("fields %v, want ip and driver_version", got)
	}
	// Changing the stored bad value to another bad one is refused too.
	b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"ip": "255.255.255.255"}))
}

// owner filters nodes by the principal that registered them, in lists,
// claims and the watch, from PostgreSQL and from the node cache alike; an
// empty or malformed owner is a 400 naming the field.
func TestFilterByOwner(t *testing.T) {
	b := setup(t)
	node := func(ip string) map[string]any {
		return map[string]any{"ip": ip, "index": 0, "cpu_mem": 1 << 30, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil}
	}
	for i, sub := range []string{"agent-a", "agent-b", "agent-a"} {
		b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", node(fmt.Sprintf("10.0.0.%d", i+1)), "Authorization", "Bearer "+tokenFor(t, sub, registry.RoleAgent)))
	}
	b.createNode(map[string]any{"ip": "10.0.0.9"}) // an admin's: no owner
	var ns []struct {
		IP    string
		Owner *string
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"owner": "agent-a"})).json(t, &ns)
	if len(ns) != 2 || *ns[0].Owner != "agent-a" || *ns[1].Owner != "agent-a" {
		t.Fatalf("owner agent-a: %+v", ns)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"owner": "nobody"})).json(t, &ns)
	if len(ns) != 0 {
		t.Fatalf("owner nobody: %+v", ns)
	}
	// A claim takes only the owner's nodes.
	var got struct{ Nodes []struct{ IP string } }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 5, "count": 1, "owner": "agent-b"})).json(t, &got)
	if len(got.Nodes) != 1 || got.Nodes[0].IP != "10.0.0.2" {
		t.Fatalf("claim of agent-b's node: %+v", got)
	}
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 6, "count": 1, "owner": "agent-b"}))
	for _, bad := range []any{"", "a\nb", 7} {
		r := b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", map[string]any{"owner": bad}))
		if got := r.problemFields(t); !slices.Contains(got, "owner") {
			t.Errorf("owner %q: fields %v", bad, got)
		}
	}
	b.must(http.StatusBadRequest, b.do("GET", "/v1/nodes/watch?owner=", nil))
}

// ip selects a host or, as a CIDR prefix, a range of hosts, in every node
// filter: list, claim, cordon, fabric capacity and the watch. A prefix
// with bits right of its mask is a 400 that names the prefix meant.
func TestFilterByAddressRange(t *testing.T) {
	b := setup(t)
	pks := map[string]int64{}
	for _, ip := range []string{"10.0.0.1", "10.0.1.1", "10.0.1.2", "10.0.2.1", "2001:db8::1", "2001:db9::1"} {
		pks[ip] = b.createNode(map[string]any{"ip": ip})
	}
	list := func(ip string) []string {
		t.Helper()
		var ns []struct{ IP string }
		b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"ip": ip})).json(t, &ns)
		var got []string
		for _, n := range ns {
			got = append(got, n.IP)
		}
		return got
	}
	for ip, want := range map[string][]string{
		"10.0.1.0/24":         {"10.0.1.1", "10.0.1.2"},
		"10.0.0.0/23":         {"10.0.0.1", "10.0.1.1", "10.0.1.2"},
		"10.0.1.2/32":         {"10.0.1.2"},
		"::ffff:10.0.2.0/120": {"10.0.2.1"},
		"2001:DB8::/32":       {"2001:db8::1"},
		"2001:db8::/31":       {"2001:db8::1", "2001:db9::1"},
		"10.9.0.0/16":         nil,
	} {
		if got := list(ip); !slices.Equal(got, want) {
			t.Errorf("ip %s: %v, want %v", ip, got, want)
		}
	}
	for _, bad := range []string{"10.0.1.1/24", "10.0.0.0/33", "10.0.0.0/", "fe80::1%eth0/128"} {
		r := b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", map[string]any{"ip": bad}))
		if got := r.problemFields(t); !slices.Equal(got, []string{"ip"}) {
			t.Errorf("ip %q: fields %v", bad, got)
		}
	}
	if r := b.do("POST", "/v1/nodes/list", map[string]any{"ip": "10.0.1.1/24"}); !strings.Contains(string(r.body), "10.0.1.0/24") {
		t.Errorf("a prefix with host bits: the answer does not name the prefix meant: %s", r.body)
	}

	var caps []struct{ Hosts int }
	b.must(http.StatusOK, b.do("POST", "/v1/fabrics/list", map[string]any{"ip": "10.0.0.0/16"})).json(t, &caps)
	if len(caps) != 1 || caps[0].Hosts != 4 {
		t.Errorf("capacity of 10.0.0.0/16: %+v", caps)
	}
	w := watchStream(t, b.url, "?ip=10.0.1.0/24", b.token)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.0.2.0/24", "reason": "rack 2"}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.0.1.0/24", "reason": "rack 1"}))
	for range 2 {
		if e := w.next(); e.nodePK() != pks["10.0.1.1"] && e.nodePK() != pks["10.0.1.2"] {
			t.Errorf("watch of 10.0.1.0/24 saw node %d", e.nodePK())
		}
	}
	var cordoned []struct{ IP string }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"state": "cordoned"})).json(t, &cordoned)
	if len(cordoned) != 3 {
		t.Errorf("cordoned by range: %+v", cordoned)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": []int64{pks["10.0.1.1"], pks["10.0.1.2"]}}))
	var got struct{ Nodes []struct{ IP string } }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 5, "count": 2, "ip": "10.0.1.0/24"})).json(t, &got)
	if len(got.Nodes) != 2 || got.Nodes[0].IP != "10.0.1.1" || got.Nodes[1].IP != "10.0.1.2" {
		t.Errorf("claim in 10.0.1.0/24: %+v", got)
	}
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 6, "count": 1, "ip": "10.0.1.0/24"}))
	if s := watchStream(t, b.url, "?ip=10.0.1.1/24", b.token); s.status != http.StatusBadRequest {
		t.Errorf("watch with a prefix with host bits: status %d", s.status)
	}
}
