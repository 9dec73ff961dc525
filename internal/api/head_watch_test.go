package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// HEAD /v1/nodes/watch answers what GET would: 429 with Retry-After once
// the principal (or the server) has its most streams, not a 200 that GET
// would not give.
func TestHeadWatchAtTheCaps(t *testing.T) {
	var hub *watch.Hub
	b := setup(t, func(c *api.Config) {
		st := c.Store.(*store.Store)
		hub = watch.New(st, watch.Options{
			Channels:        watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
			Encode:          api.EncodeEvent,
			MaxStreams:      2,
			MaxPerPrincipal: 1,
		})
		c.Events = hub
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hub.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	one, two, three := tokenFor(t, "watcher-1", registry.RoleReader), tokenFor(t, "watcher-2", registry.RoleReader),
		tokenFor(t, "watcher-3", registry.RoleReader)
	head := func(tok string) response {
		t.Helper()
		return b.do("HEAD", "/v1/nodes/watch", nil, "Authorization", "Bearer "+tok)
	}
	if r := head(one); r.status != http.StatusOK {
		t.Fatalf("HEAD below the caps: %d", r.status)
	}
	if s := watchStream(t, b.url, "", one); s.status != http.StatusOK {
		t.Fatalf("first stream: %d", s.status)
	}
	if get := watchStream(t, b.url, "", one); get.status != http.StatusTooManyRequests {
		t.Fatalf("GET at the principal's cap: %d, want 429", get.status)
	}
	if r := head(one); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Errorf("HEAD at the principal's cap: %d, Retry-After %q; want 429 as GET", r.status, r.header.Get("Retry-After"))
	}
	if r := head(two); r.status != http.StatusOK {
		t.Errorf("HEAD of another principal: %d", r.status)
	}
	if s := watchStream(t, b.url, "", two); s.status != http.StatusOK {
		t.Fatalf("second stream: %d", s.status)
	}
	if r := head(three); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Errorf("HEAD at the server's cap: %d, Retry-After %q; want 429", r.status, r.header.Get("Retry-After"))
	}
	// HEAD holds no slot: the count is unchanged after all of them.
	for deadline := time.Now().Add(5 * time.Second); hub.Streams() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams open, want the 2 GETs", hub.Streams())
		}
	}
}
