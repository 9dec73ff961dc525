package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// The client's problem errors become the registry's sentinels the agent
// decides on; the rest stays as it was (the server cannot be used now).
func TestAgentAPIErrors(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]error{400: registry.ErrInvalid, 403: registry.ErrForbidden, 404: registry.ErrNotFound,
		409: registry.ErrConflict, 412: registry.ErrPrecondition} {
		err := domainError(fmt.Errorf("wrapped: %w", &client.Error{Status: status, ExistingPK: 7,
			Fields: []client.FieldError{{Field: "gpu_mem", Message: "must not be negative"}}}))
		var re *registry.Error
		if !errors.Is(err, want) || !errors.As(err, &re) || re.ExistingPK != 7 || len(re.Fields) != 1 {
			t.Errorf("%d: %#v", status, err)
		}
	}
	for _, status := range []int{401, 429, 500, 503} {
		err := domainError(&client.Error{Status: status})
		for _, s := range []error{registry.ErrInvalid, registry.ErrForbidden, registry.ErrNotFound, registry.ErrConflict} {
			if errors.Is(err, s) {
				t.Errorf("%d maps to %v", status, s)
			}
		}
		if status == 401 && !strings.Contains(err.Error(), "refused the token") {
			t.Errorf("401: %v", err)
		}
	}
	plain := errors.New("connection refused")
	if domainError(plain) != plain || domainError(nil) != nil {
		t.Error("a transport error or nil was changed")
	}
}

// The agent's heartbeat acts as the node and takes the Node-Id check from
// the cache as it is (max-stale); its other requests stay consistent.
func TestAgentAPIPingMaxStale(t *testing.T) {
	t.Parallel()
	seen := make(chan http.Header, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/nodes/ping" {
			fmt.Fprint(w, `{"ok":true}`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	api, _, err := newAgentAPI(agentConfig{Server: u, Token: "token", StatePath: filepath.Join(t.TempDir(), "state.json")}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Ping(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	h := <-seen
	if h.Get("Node-Id") != "42" || !strings.EqualFold(h.Get("Cache-Control"), "max-stale") {
		t.Errorf("ping sent Node-Id %q, Cache-Control %q; want 42 and max-stale", h.Get("Node-Id"), h.Get("Cache-Control"))
	}
	if err := api.DeleteNodeAs(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	if h := <-seen; h.Get("Cache-Control") != "" {
		t.Errorf("a delete sent Cache-Control %q", h.Get("Cache-Control"))
	}
}
