package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/providertest"
)

// Every string the client keeps from an answer has a bound, and a value one
// byte past it has the field's outcome: an id fails the pass, a name,
// address, status or GPU model skips the host (which keeps its nodes), a
// label's source leaves the label out (the location label falls back to
// the configured location). A value at the bound is taken.
func TestStringBounds(t *testing.T) {
	t.Parallel()
	type doc = map[string]any
	for _, tc := range []struct {
		field string
		limit int
		set   func(cluster, specs, worker doc, v string)
		// past says what a value past the bound does: "fail" the pass,
		// "skip" the host, or leave out the label of this key.
		past string
	}{
		{"a cluster's id", provider.MaxID, func(c, _, _ doc, v string) { c["id"] = v }, "fail"},
		{"its id", provider.MaxID, func(_, _, w doc, v string) { w["id"] = v }, "fail"},
		{"its id", provider.MaxName, func(_, _, w doc, v string) { delete(w, "id"); w["name"] = v }, "fail"}, // named, not numbered
		{"the worker's name", provider.MaxName, func(_, _, w doc, v string) { w["name"] = v }, "skip"},
		{"the worker's address", provider.MaxAddress, func(_, _, w doc, v string) { w["private_ip"] = v }, "skip"},
		{"the worker's status", provider.MaxWord, func(_, _, w doc, v string) { w["status"] = v }, "skip"},
		{"the cluster's status", provider.MaxWord, func(c, _, _ doc, v string) { c["status"] = v }, "skip"},
		{"gpu_card_type", provider.MaxGPUModel, func(_, s, _ doc, v string) { s["gpu_card_type"] = v }, "skip"},
		{"name", provider.MaxName, func(c, _, _ doc, v string) { c["name"] = v }, e2e.LabelCluster},
		{"specs.name", provider.MaxName, func(_, s, _ doc, v string) { s["name"] = v }, e2e.LabelPlan},
		{"plan.location", provider.MaxName, func(c, _, _ doc, v string) {
			c["sku_details"].(doc)["plan"] = doc{"location": v}
		}, e2e.LabelLocation},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			fetch := func(v string) (provider.Inventory, error) {
				specs := doc{"name": "GDC3.8xH100-640GB", "cpu": 96, "gpu": 8, "memory": 1024, "gpu_memory": 640, "gpu_card_type": "H100"}
				worker := doc{"id": 1, "name": "w1", "private_ip": "10.0.0.1", "status": "Running"}
				cluster := doc{"id": 7, "name": "train-a", "status": "Running", "no_of_nodes": 1,
					"sku_details": doc{"specs": specs, "plan": doc{"location": "Chennai"}}, "worker_nodes": []any{worker}}
				tc.set(cluster, specs, worker, v)
				body, err := json.Marshal(doc{"code": 200, "data": []any{cluster}, "errors": doc{}, "message": "Success"})
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
				defer srv.Close()
				c, err := e2e.New(e2e.Config{Endpoint: srv.URL, APIKey: "k", Token: "t", ProjectID: "1", Location: "Delhi",
					Retry: provider.Retry{Attempts: 1}})
				if err != nil {
					t.Fatal(err)
				}
				inv, err := c.Fetch(context.Background())
				providertest.CheckFetch(t, inv, err)
				return inv, err
			}
			fallback := ""
			if tc.past == e2e.LabelLocation {
				fallback = "Delhi" // the configured location
			}
			want := provider.TooLong(strings.TrimPrefix(strings.TrimPrefix(tc.field, "specs."), "plan."), tc.limit)
			providertest.CheckBound(t, fetch, tc.limit, tc.past, want, "7/1", fallback)
		})
	}
}
