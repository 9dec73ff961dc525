package bench

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// A read on B is stale when its version is below one a write on A had
// acknowledged before the read was sent; equal or newer is not. Without a
// version in the answer the read is an error, not silently fresh.
func TestReplicaReadCountsStale(t *testing.T) {
	var version atomic.Int64
	var cc atomic.Value
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc.Store(r.Header.Get("Cache-Control"))
		if v := version.Load(); v > 0 {
			w.Header().Set("ETag", `"`+strconv.FormatInt(v, 10)+`"`)
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer b.Close()
	a := newAcked(&fleet{nodes: 1, minPK: 7})
	a.note(0, 5)
	a.note(0, 3) // an older acknowledgement never lowers the bar
	var stale atomic.Int64
	read := a.readOp(b.URL, "token", "max-stale", &stale)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range []int64{4, 5, 6} {
		version.Store(v)
		if err := read(context.Background(), b.Client(), rng); err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
	}
	if got := stale.Load(); got != 1 {
		t.Errorf("stale = %d, want 1 (the answer with version 4 after 5 was acknowledged)", got)
	}
	if got, _ := cc.Load().(string); got != "max-stale" {
		t.Errorf("Cache-Control sent %q, want max-stale", got)
	}
	version.Store(0)
	if err := read(context.Background(), b.Client(), rng); err == nil || !strings.Contains(err.Error(), "ETag") {
		t.Errorf("an answer without a version: %v, want an error naming the ETag", err)
	}
}

// Against a running registryd the replica workload needs the second
// replica's URL; by default it is left out like startup.
func TestReplicaNeedsSecondURL(t *testing.T) {
	c := Config{URL: "http://a", DatabaseURL: "postgres://x", Token: "t", Workloads: []string{Replica}}
	if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "ReplicaURL") {
		t.Errorf("defaults = %v, want an error asking for ReplicaURL", err)
	}
	c = Config{URL: "http://a", DatabaseURL: "postgres://x", Token: "t"}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	for _, w := range c.Workloads {
		if w == Replica || w == Startup {
			t.Errorf("default workloads against a running registryd include %s: %v", w, c.Workloads)
		}
	}
}
