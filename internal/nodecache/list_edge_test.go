package nodecache

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
)

// An IPv4-compatible IPv6 address, which Go and PostgreSQL spell apart
// (::102:304, ::1.2.3.4): the ip filter from memory matches it as the
// SQL does, whichever way the filter spells it.
func TestListIPForms(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 1000)
	n := createNode(t, a.store, "::1.2.3.4")
	a.cache.Wrote(n)
	preload(t, a)
	ctx := context.Background()
	for _, ip := range []string{"::1.2.3.4", "::102:304"} {
		f := registry.NodeFilter{IP: &ip, Limit: 10}
		want, err := a.store.ListNodes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		before := a.cache.Stats().ListHits
		got, err := a.cache.ListNodes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if a.cache.Stats().ListHits != before+1 {
			t.Fatalf("filter ip %q: read from PostgreSQL, want from memory", ip)
		}
		if len(want) != 1 || !sameNodes(got, want) {
			t.Errorf("filter ip %q: store %v, cache %v", ip, pksOf(want), pksOf(got))
		}
	}
}

// A heartbeat of a new node whose notification arrives before the node's
// creation event (sequenced after its commit) is kept and merged when the
// event installs the node: lists show it, as PostgreSQL does.
func TestListHeartbeatBeforeCreateEvent(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 1000), newReplica(t, dbURL, 1000)
	createNode(t, a.store, "10.7.0.1")
	preload(t, a)
	ctx := context.Background()
	bad := 0
	for i := range 10 {
		n := createNode(t, b.store, "10.7.1."+strconv.Itoa(i+1))
		seen := time.Now().UTC().Truncate(time.Microsecond)
		if err := b.store.TouchNodes(ctx, []int64{n.PK}, []time.Time{seen}); err != nil {
			t.Fatal(err)
		}
		pk := n.PK
		apitest.Eventually(t, 5*time.Second, "listed", func() bool {
			p, _, ok := a.cache.listCached(registry.NodeFilter{PK: &pk, Limit: 1})
			return ok && len(p) == 1
		})
		time.Sleep(300 * time.Millisecond)
		p, _, _ := a.cache.listCached(registry.NodeFilter{PK: &pk, Limit: 1})
		db, _ := a.store.GetNode(ctx, pk)
		if p[0].LastSeen == nil || !p[0].LastSeen.Equal(*db.LastSeen) {
			bad++
			t.Logf("node %d: cache last_seen %v, PostgreSQL %v", pk, p[0].LastSeen, db.LastSeen)
		}
	}
	if bad > 0 {
		t.Errorf("%d of 10 nodes listed from memory with a stale last_seen", bad)
	}
}

// A deletion applied while the cache does not track the fleet (after a
// drop) is remembered all the same: a late Wrote of the node (a write that
// committed before the deletion) once the next pass tracks does not bring
// it back into a complete cache.
func TestListLateWriteAfterDropAndDelete(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 1000)
	createNode(t, a.store, "10.8.0.1")
	x := createNode(t, a.store, "10.8.0.2")
	old := setDriver(t, a.store, x.PK, "551") // its Wrote is "late"
	a.cache.Gap("test: a drop")               // not tracking now
	del, err := a.store.DeleteNode(context.Background(), admin, x.PK, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.cache.Deleted(del)
	// wait until the feed applied the deletion too (before tracking)
	time.Sleep(300 * time.Millisecond)
	preload(t, a)
	a.cache.Wrote(old)
	pk := x.PK
	got, _, ok := a.cache.listCached(registry.NodeFilter{PK: &pk, Limit: 1})
	if !ok || len(got) != 0 {
		t.Errorf("from memory %v: complete cache lists %v, want deleted node %d absent", ok, pksOf(got), pk)
	}
}

// A deletion delivered while a page holding the node is read: the page,
// older, does not bring the node back (TestPreloadStalePageAndDrop is the
// update's case).
func TestListDeleteDuringPage(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n1 := createNode(t, b.store, "10.0.0.1")
	createNode(t, b.store, "10.0.0.2")
	time.Sleep(300 * time.Millisecond)
	raced := false
	during := func(page []registry.Node) {
		if raced || len(page) == 0 {
			return
		}
		raced = true
		if _, err := b.store.DeleteNode(context.Background(), admin, n1.PK, true, nil); err != nil {
			t.Error(err)
		}
		apitest.Eventually(t, 5*time.Second, "delete delivered during the page", func() bool {
			a.cache.mu.RLock()
			defer a.cache.mu.RUnlock()
			_, ok := a.cache.touched[n1.PK]
			return ok
		})
	}
	startPreload(t, a, during)
	apitest.Eventually(t, 5*time.Second, "complete", func() bool { return a.cache.Stats().Complete })
	pk := n1.PK
	if got, _, ok := a.cache.listCached(registry.NodeFilter{PK: &pk, Limit: 1}); !ok || len(got) != 0 {
		t.Fatalf("from memory %v: listed %v, want deleted node %d absent from a complete cache", ok, pksOf(got), pk)
	}
}
