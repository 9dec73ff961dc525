package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
)

// List, then watch from the list's X-Event-Id, while 4 writers keep
// writing: the watch delivers every change after the list exactly once and
// none the list already showed, so list + watch equals a strong list.
func TestListThenWatchExactlyOnce(t *testing.T) {
	t.Parallel()
	a, c := cachedReplica(t, pgtest.New(t), true)
	var pks []int64
	for i := range 8 {
		pks = append(pks, a.createNode(map[string]any{"ip": fmt.Sprintf("10.8.0.%d", i+1)}))
	}
	t.Cleanup(lifecycle.Go(context.Background(), func(ctx context.Context) {
		c.Preload(ctx, func(ctx context.Context, after int64, limit int) ([]registry.Node, error) {
			return a.store.ListNodes(ctx, registry.NodeFilter{After: after, Limit: limit})
		})
	}))
	apitest.Eventually(t, 5*time.Second, "the cache holds the whole fleet", func() bool { return c.Stats().Complete })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				pk := pks[(w*2+i%2)%len(pks)]
				a.do("PATCH", nodePath(pk), map[string]any{"driver_version": fmt.Sprintf("w%d-%d", w, i)})
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // writers under way
	r := a.must(http.StatusOK, a.do("POST", "/v1/nodes/list", map[string]any{"limit": 100}))
	var listed []map[string]any
	r.json(t, &listed)
	from, err := strconv.ParseInt(r.header.Get("X-Event-Id"), 10, 64)
	if err != nil {
		t.Fatalf("X-Event-Id %q: %v", r.header.Get("X-Event-Id"), err)
	}
	s := watchStream(t, a.url, "", a.token, "Last-Event-ID", strconv.FormatInt(from, 10))
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	view := map[int64]map[string]any{}
	for _, n := range listed {
		view[int64(n["pk"].(float64))] = n
	}
	var want []map[string]any
	a.must(http.StatusOK, a.do("POST", "/v1/nodes/list", map[string]any{"limit": 100}, "Cache-Control", "no-cache")).json(t, &want)
	last := from
	deadline := time.Now().Add(10 * time.Second)
	for !same(view, want) {
		if time.Now().After(deadline) {
			t.Fatalf("list + watch after 10 s differs from a strong list")
		}
		e := s.next()
		if e.ID <= last {
			t.Fatalf("event %d after event %d (list at %d): repeated or out of order", e.ID, last, from)
		}
		last = e.ID
		n := e.Data["node"].(map[string]any)
		pk := int64(n["pk"].(float64))
		if cur, ok := view[pk]; ok && n["version"].(float64) <= cur["version"].(float64) {
			t.Fatalf("event %d repeats node %d version %v, already in the list (X-Event-Id %d) or the watch", e.ID, pk, n["version"], from)
		}
		view[pk] = n
	}
	if last == from {
		t.Fatal("no change after the list: the writers did not overlap the watch")
	}
}

// same reports whether view holds exactly the nodes of want, at their
// versions.
func same(view map[int64]map[string]any, want []map[string]any) bool {
	if len(view) != len(want) {
		return false
	}
	for _, n := range want {
		v, ok := view[int64(n["pk"].(float64))]
		if !ok || v["version"] != n["version"] {
			return false
		}
	}
	return true
}
