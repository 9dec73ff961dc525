package api_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHardwareCRUD(t *testing.T) {
	b := setup(t)
	r := b.must(http.StatusCreated, b.do("POST", "/v1/hardware/create", map[string]any{"name": "H100"}))
	h := r.object(t)
	pk := int64(h["pk"].(float64))
	path := fmt.Sprintf("/v1/hardware/%d", pk)
	if r.header.Get("Location") != path {
		t.Errorf("Location %q, want %q", r.header.Get("Location"), path)
	}
	if h["name"] != "H100" || h["nodes"] != float64(0) {
		t.Errorf("created %v", h)
	}
	got := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	if diff := cmp.Diff(h, got); diff != "" {
		t.Errorf("retrieve (-create +get):\n%s", diff)
	}
	// GET → edit → PUT.
	got["name"] = "H100 SXM"
	got = b.must(http.StatusOK, b.do("PUT", path, got)).object(t)
	if got["name"] != "H100 SXM" {
		t.Errorf("after PUT: %v", got)
	}
	got = b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"name": "H100-SXM5"})).object(t)
	if got["name"] != "H100-SXM5" {
		t.Errorf("after PATCH: %v", got)
	}
	b.createHardware("B200")
	var list []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/hardware/list", nil)).json(t, &list)
	if len(list) != 2 || list[0]["name"] != "H100-SXM5" || list[1]["name"] != "B200" {
		t.Errorf("list: %v", list)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/hardware/list", map[string]any{"name": "B200"})).json(t, &list)
	if len(list) != 1 || list[0]["name"] != "B200" {
		t.Errorf("list by name: %v", list)
	}
	b.must(http.StatusNoContent, b.do("DELETE", path, nil))
	b.must(http.StatusNotFound, b.do("GET", path, nil))
	b.must(http.StatusNotFound, b.do("DELETE", path, nil))
	b.must(http.StatusNotFound, b.do("PATCH", path, map[string]any{"name": "x"}))
}

func TestHardwareInvalid(t *testing.T) {
	b := setup(t)
	pk := b.createHardware("A100")
	path := fmt.Sprintf("/v1/hardware/%d", pk)
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		field        string
	}{
		{"POST", "/v1/hardware/create", map[string]any{}, 400, "name"},
		{"POST", "/v1/hardware/create", map[string]any{"name": ""}, 400, "name"},
		{"POST", "/v1/hardware/create", map[string]any{"name": " H100"}, 400, "name"},
		{"POST", "/v1/hardware/create", map[string]any{"name": 100}, 400, "name"},
		{"POST", "/v1/hardware/create", map[string]any{"name": nil}, 400, "name"},
		{"POST", "/v1/hardware/create", map[string]any{"name": "X", "vendor": "nv"}, 400, "vendor"},
		{"PUT", path, map[string]any{}, 400, "name"},
		{"PUT", path, map[string]any{"name": "A100", "pk": pk + 1}, 400, "pk"},
		{"PATCH", path, map[string]any{"name": nil}, 400, "name"},
		{"PATCH", path, map[string]any{"created_at": "2000-01-01T00:00:00Z"}, 400, "created_at"},
		{"POST", "/v1/hardware/list", map[string]any{"model": "A100"}, 400, "model"},
		{"GET", "/v1/hardware/abc", nil, 400, ""},
		{"GET", "/v1/hardware/99999999999999999999", nil, 400, ""},
	} {
		r := b.must(tc.status, b.do(tc.method, tc.path, tc.body))
		if tc.field != "" && !slices.Contains(r.problemFields(t), tc.field) {
			t.Errorf("%s %s %v: problem names %v, want %q", tc.method, tc.path, tc.body, r.problemFields(t), tc.field)
		}
	}
}

func TestHardwareConflicts(t *testing.T) {
	b := setup(t)
	a := b.createHardware("A100")
	h := b.createHardware("H100")
	r := b.must(http.StatusConflict, b.do("POST", "/v1/hardware/create", map[string]any{"name": "A100"}))
	if r.object(t)["existing_pk"] != float64(a) {
		t.Errorf("conflict: %s", r.body)
	}
	r = b.must(http.StatusConflict, b.do("PATCH", fmt.Sprintf("/v1/hardware/%d", h), map[string]any{"name": "A100"}))
	if r.object(t)["existing_pk"] != float64(a) {
		t.Errorf("conflict: %s", r.body)
	}

	// A generation in use is not deleted, and says how many nodes use it.
	b.createNode(map[string]any{"hardware_generation": a, "index": 0})
	b.createNode(map[string]any{"hardware_generation": a, "index": 1})
	r = b.must(http.StatusConflict, b.do("DELETE", fmt.Sprintf("/v1/hardware/%d", a), nil))
	if d := r.object(t)["detail"].(string); !slices.Contains([]string{"hardware generation " + fmt.Sprint(a) + " is used by 2 nodes; move or delete them first"}, d) {
		t.Errorf("detail %q", d)
	}
	got := b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/hardware/%d", a), nil)).object(t)
	if got["nodes"] != float64(2) {
		t.Errorf("nodes = %v, want 2", got["nodes"])
	}
}
