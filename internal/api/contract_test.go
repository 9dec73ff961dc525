package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/registry"
)

// The node's document is registry.Node's JSON, and openapi.yaml's Node
// schema describes exactly it: the same members, all of them required. A
// field added to one and not the other fails here.
func TestNodeDocumentMatchesSpec(t *testing.T) {
	doc, _ := apitest.Spec(t)
	schema := doc.Components.Schemas["Node"].Value
	b, err := json.Marshal(registry.Node{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	members := slices.Sorted(maps.Keys(m))
	if diff := cmp.Diff(slices.Sorted(maps.Keys(schema.Properties)), members); diff != "" {
		t.Errorf("Node properties (-spec +document):\n%s", diff)
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(schema.Required)), members); diff != "" {
		t.Errorf("Node required (-spec +document):\n%s", diff)
	}
}

// One document, three places: what a response carries is what the audit
// log and the change log (and so the watch stream) keep, plus the
// version in the logs.
func TestNodeDocumentShared(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", with("hardware_generation", hw)))
	resp := r.object(t)
	etag := r.header.Get("ETag")

	var entries []struct {
		After map[string]any `json:"after"`
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"target_type": "node"})).json(t, &entries)
	if len(entries) != 1 {
		t.Fatalf("audit entries: %+v", entries)
	}
	after := entries[0].After
	if v := after["version"]; fmt.Sprintf(`"%v"`, v) != etag {
		t.Errorf("audit version %v, ETag %s", v, etag)
	}
	if diff := cmp.Diff(resp, after); diff != "" {
		t.Errorf("audit document (-response +audit):\n%s", diff)
	}

	if _, err := b.store.SequenceEvents(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	events, err := b.store.NodeEventsAfter(context.Background(), 0, 10)
	if err != nil || len(events) != 1 {
		t.Fatalf("change log: %v, %v", events, err)
	}
	var fromLog map[string]any
	data, _ := json.Marshal(events[0].Node)
	if err := json.Unmarshal(data, &fromLog); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(resp, fromLog); diff != "" {
		t.Errorf("change log document (-response +log):\n%s", diff)
	}
}

// What generators read: the rules of issue 9, held by the spec itself so
// a later edit cannot undo them unnoticed. (scripts/generators runs ogen
// and oapi-codegen themselves; the client package is generated in make
// test.)
func TestSpecForGenerators(t *testing.T) {
	doc, _ := apitest.Spec(t)
	if doc.Info.License == nil || doc.Info.License.Name == "" || doc.Info.Contact == nil {
		t.Error("info lacks license or contact")
	}

	// Every operation has the one default problem response, so
	// generators make one error type (ogen's convenient errors).
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			d := op.Responses.Default()
			if d == nil || d.Ref != "#/components/responses/Error" {
				t.Errorf("%s %s: no default problem response", method, path)
			}
		}
	}
	if r := doc.Components.Responses["Error"]; r == nil {
		t.Error("no Error response")
	} else if mt := r.Value.Content.Get("application/problem+json"); len(r.Value.Content) != 1 || mt == nil || mt.Schema.Ref != "#/components/schemas/Problem" {
		t.Error("the default response is not a problem document")
	}

	// Ids are integers, never strings: path pks, Node-Id, watch filters.
	ids := map[string]float64{"pk": 1, "Node-Id": 1, "node": 1, "hardware_generation": 1, "Last-Event-Id": 0, "last_event_id": 0, "index": 0}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			params := append(slices.Clone(item.Parameters), op.Parameters...)
			for _, p := range params {
				min, ok := ids[p.Value.Name]
				if !ok {
					continue
				}
				s := p.Value.Schema.Value
				if !s.Type.Is("integer") || s.Min == nil || *s.Min != min {
					t.Errorf("%s %s: parameter %s is %v (minimum %v), want an integer from %v", method, path, p.Value.Name, s.Type, s.Min, min)
				}
				if p.Value.Name != "index" && s.Format != "int64" {
					t.Errorf("%s %s: parameter %s has format %q, want int64", method, path, p.Value.Name, s.Format)
				}
			}
		}
	}

	// Examples are sent as they are by tools: none that act as a node, a
	// precondition that fails, or a forced delete.
	for name, p := range doc.Components.Parameters {
		switch name {
		case "Force":
			if p.Value.Example != "false" {
				t.Errorf("force example %v, want false", p.Value.Example)
			}
		default:
			if !p.Value.Required && p.Value.Example != nil {
				t.Errorf("optional parameter %s has example %v; a tool would send it", name, p.Value.Example)
			}
		}
	}
	for name, s := range doc.Components.Schemas {
		if strings.HasPrefix(name, "Echo") && s.Value.Example != nil {
			t.Errorf("%s has example %v; a tool would echo it", name, s.Value.Example)
		}
	}

	// Response schemas mark nothing readOnly (oapi-codegen would make
	// their required fields optional pointers).
	for _, name := range []string{"Node", "Hardware"} {
		for prop, s := range doc.Components.Schemas[name].Value.Properties {
			if s.Value.ReadOnly {
				t.Errorf("%s.%s is readOnly", name, prop)
			}
		}
	}

	// The audit documents are open objects that may be null.
	for _, prop := range []string{"before", "after"} {
		s := doc.Components.Schemas["AuditEntry"].Value.Properties[prop].Value
		if !s.Nullable || s.AdditionalProperties.Has == nil || !*s.AdditionalProperties.Has {
			t.Errorf("AuditEntry.%s: nullable %v, additionalProperties %v", prop, s.Nullable, s.AdditionalProperties.Has)
		}
	}

	// The watch stream's events are described, so generators make types.
	stream := doc.Paths.Find("/v1/nodes/watch").Get.Responses.Status(200).Value.Content.Get("text/event-stream")
	var refs []string
	for _, s := range stream.Schema.Value.OneOf {
		refs = append(refs, s.Ref)
	}
	if diff := cmp.Diff([]string{"#/components/schemas/NodeEvent", "#/components/schemas/LeaseRenewal", "#/components/schemas/WatchReset", "#/components/schemas/WatchBookmark"}, refs); diff != "" {
		t.Errorf("watch stream schema (-want +got):\n%s", diff)
	}

	// Every component is used.
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`#/components/(\w+)/(\w+)`).FindAllSubmatch(registryd.OpenAPI, -1) {
		used[string(m[1])+"/"+string(m[2])] = true
	}
	check := func(kind string, names []string) {
		for _, n := range names {
			if !used[kind+"/"+n] {
				t.Errorf("components/%s/%s is not used", kind, n)
			}
		}
	}
	check("schemas", slices.Collect(maps.Keys(doc.Components.Schemas)))
	check("responses", slices.Collect(maps.Keys(doc.Components.Responses)))
	check("parameters", slices.Collect(maps.Keys(doc.Components.Parameters)))
	check("headers", slices.Collect(maps.Keys(doc.Components.Headers)))
}

// Where the spec says a request member may be null, the server accepts
// null; where it does not, the server refuses null naming the member. For
// every member of every request schema that can be sent alone.
func TestSpecNullability(t *testing.T) {
	b := setup(t)
	doc, _ := apitest.Spec(t)
	pk := b.createNode(nil)
	hw := b.createHardware("H100")
	for _, tc := range []struct {
		schema, method, path string
		base                 map[string]any
		ok                   int
	}{
		{"NodePatch", "PATCH", fmt.Sprintf("/v1/nodes/%d", pk), map[string]any{}, http.StatusOK},
		{"NodeUpdate", "PUT", fmt.Sprintf("/v1/nodes/%d", pk), validNode(), http.StatusOK},
		{"HardwarePatch", "PATCH", fmt.Sprintf("/v1/hardware/%d", hw), map[string]any{}, http.StatusOK},
		{"HardwareUpdate", "PUT", fmt.Sprintf("/v1/hardware/%d", hw), map[string]any{"name": "H100"}, http.StatusOK},
		{"NodeFilter", "POST", "/v1/nodes/list", map[string]any{}, http.StatusOK},
		{"HardwareFilter", "POST", "/v1/hardware/list", map[string]any{}, http.StatusOK},
		{"AuditFilter", "POST", "/v1/audit/list", map[string]any{}, http.StatusOK},
		{"NodeClaim", "POST", "/v1/nodes/claim", map[string]any{"job": 1, "ip": "192.0.2.1"}, http.StatusConflict},
		{"NodeRelease", "POST", "/v1/nodes/release", map[string]any{"job": 1}, http.StatusOK},
		{"RevokeRequest", "POST", "/v1/tokens/revoke", map[string]any{"jti": "nullability-test"}, http.StatusOK},
	} {
		schema := doc.Components.Schemas[tc.schema].Value
		for _, name := range slices.Sorted(maps.Keys(schema.Properties)) {
			prop := schema.Properties[name].Value
			body := maps.Clone(tc.base)
			body[name] = nil
			r := b.do(tc.method, tc.path, body)
			switch {
			case prop.Nullable && r.status != tc.ok:
				t.Errorf("%s.%s is nullable, but %s %s with it null: %d %s", tc.schema, name, tc.method, tc.path, r.status, r.body)
			case !prop.Nullable && (r.status != http.StatusBadRequest || !slices.Contains(r.problemFields(t), name)):
				t.Errorf("%s.%s is not nullable, but %s %s with it null: %d %s", tc.schema, name, tc.method, tc.path, r.status, r.body)
			}
		}
	}
}

// What /docs shows a person, held by the spec: Node-Id is declared only
// where acting as a node means something (the heartbeat, the watch, and
// the operations of one node; the server takes it everywhere), the tags
// start with nodes, and the conventions are a tag of their own, last,
// that the short intro links to.
func TestSpecForPeople(t *testing.T) {
	doc, _ := apitest.Spec(t)
	want := []string{"deleteNode", "getNode", "headNode", "headPingNodes", "headWatchNodes", "patchNode", "pingNodes", "updateNode", "watchNodes"}
	var got []string
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, p := range append(slices.Clone(item.Parameters), op.Parameters...) {
				if p.Ref == "#/components/parameters/NodeId" {
					got = append(got, op.OperationID)
				}
			}
		}
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("operations declaring Node-Id (-want +got):\n%s", diff)
	}

	var tags []string
	for _, tag := range doc.Tags {
		tags = append(tags, tag.Name)
	}
	if len(tags) == 0 || tags[0] != "nodes" || tags[len(tags)-1] != "conventions" {
		t.Errorf("tags %v: want nodes first and conventions last", tags)
	}
	if conv := doc.Tags.Get("conventions"); conv == nil || !strings.Contains(conv.Description, "Rules that hold for every endpoint") {
		t.Error("the conventions tag does not hold the rules")
	}
	intro := doc.Info.Description
	if n := strings.Count(intro, "\n"); n > 20 || !strings.Contains(intro, "](#/conventions)") {
		t.Errorf("info.description has %d lines, link to the conventions: %v; want a short intro that links to them", n, strings.Contains(intro, "](#/conventions)"))
	}
}
