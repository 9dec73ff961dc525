package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/registry"
)

// HEAD answers as GET does, without a body.
func TestHead(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	hw := b.createHardware("H100")
	same := func(path string, headers ...string) {
		t.Helper()
		get := b.do("GET", path, nil, headers...)
		head := b.do("HEAD", path, nil, headers...)
		if head.status != get.status || len(head.body) != 0 {
			t.Errorf("HEAD %s: %d with %d body bytes; GET: %d", path, head.status, len(head.body), get.status)
		}
		for _, h := range []string{"Content-Type", "ETag", "Content-Length", "WWW-Authenticate", "Allow"} {
			if h == "Content-Length" && (path == "/v1/nodes/ping" || get.status == http.StatusMethodNotAllowed) {
				continue // the body holds the time, or names the method
			}
			if head.header.Get(h) != get.header.Get(h) {
				t.Errorf("HEAD %s: %s %q, GET %q", path, h, head.header.Get(h), get.header.Get(h))
			}
		}
	}
	node, hardware := fmt.Sprintf("/v1/nodes/%d", pk), fmt.Sprintf("/v1/hardware/%d", hw)
	same("/healthz")
	same("/readyz")
	same("/openapi.yaml")
	same("/v1/nodes/ping")
	same(node)
	same(hardware)
	same("/v1/nodes/424242")
	same(node, "If-None-Match", `"1"`)
	same(hardware, "If-None-Match", "*")
	same(node, "Authorization", "")
	reader := tokenFor(t, "reader-1", registry.RoleReader)
	same(node, "Authorization", "Bearer "+reader, "Node-Id", fmt.Sprint(pk))
	same("/v1/nodes/create")
	if r := b.do("HEAD", node, nil, "If-None-Match", `"1"`); r.status != http.StatusNotModified || r.header.Get("ETag") != `"1"` {
		t.Errorf("HEAD with If-None-Match: %d %q", r.status, r.header.Get("ETag"))
	}
	if r := b.do("HEAD", node, nil, "Authorization", ""); r.status != http.StatusUnauthorized {
		t.Errorf("HEAD without a token: %d", r.status)
	}
	if r := b.do("HEAD", "/v1/nodes/create", nil); r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" {
		t.Errorf("HEAD of a POST route: %d, Allow %q", r.status, r.header.Get("Allow"))
	}

	// The watch stream: headers, then the answer ends; nothing hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "HEAD", b.url+"/v1/nodes/watch?source=api", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("HEAD watch: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("HEAD watch: %d %v", resp.StatusCode, resp.Header)
	}
	for query, want := range map[string]int{"?source=bogus": 400, "?last_event_id=x": 400} {
		if r := b.do("HEAD", "/v1/nodes/watch"+query, nil); r.status != want {
			t.Errorf("HEAD watch%s: %d", query, r.status)
		}
	}
	if r := b.do("HEAD", "/v1/nodes/watch", nil, "Authorization", ""); r.status != http.StatusUnauthorized {
		t.Errorf("HEAD watch without a token: %d", r.status)
	}
	noWatch := another(t, func(c *api.Config) { c.Events = nil })
	if r := noWatch.do("HEAD", "/v1/nodes/watch", nil); r.status != http.StatusServiceUnavailable {
		t.Errorf("HEAD watch without events: %d", r.status)
	}
}
