package nodecache

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var admin = registry.Actor{Principal: registry.Principal{Sub: "admin-test", Role: registry.RoleAdmin}}

// replica is one server's store, hub and cache on a shared database.
type replica struct {
	store *store.Store
	cache *Cache
	stop  func()
}

// newReplica follows dbURL's change feed with a cache of size nodes.
func newReplica(t *testing.T, dbURL string, size int) *replica {
	t.Helper()
	st := pgtest.Open(t, dbURL, store.Options{})
	c := New(st, Options{Size: size, MaxStale: time.Second, LivenessChannel: store.LivenessChannel})
	hub := watch.New(st, watch.Options{
		Channels:       watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:         func(registry.NodeEvent) ([]byte, error) { return nil, nil },
		Poll:           100 * time.Millisecond,
		Follower:       c,
		FollowChannels: []string{store.LivenessChannel},
	})
	r := &replica{store: st, cache: c, stop: lifecycle.Go(context.Background(), hub.Run)}
	t.Cleanup(r.stop)
	apitest.Eventually(t, 5*time.Second, "the cache serves", func() bool { return c.Stats().Serving })
	return r
}

func createNode(t *testing.T, st *store.Store, ip string) registry.Node {
	t.Helper()
	n, _, err := st.CreateNode(context.Background(), admin, registry.NodeSpec{IP: ip, CPUMem: 1 << 30, DriverVersion: "550"})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setDriver(t *testing.T, st *store.Store, pk int64, v string) registry.Node {
	t.Helper()
	n, err := st.UpdateNode(context.Background(), admin, pk, func(cur registry.Node) (registry.NodeSpec, error) {
		spec := cur.Spec()
		spec.DriverVersion = v
		return spec, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func get(t *testing.T, c *Cache, pk int64) registry.Node {
	t.Helper()
	n, err := c.GetNode(context.Background(), pk)
	if err != nil {
		t.Fatalf("get node %d: %v", pk, err)
	}
	return n
}

// A second read is a hit; another replica's update and delete reach the
// cache through the feed well within the bound, without a read through.
func TestAcrossReplicas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n := createNode(t, b.store, "10.0.0.1")
	get(t, a.cache, n.PK)
	get(t, a.cache, n.PK)
	if s := a.cache.Stats(); s.Hits != 1 || s.Misses != 1 {
		t.Fatalf("two reads: %+v, want one miss then one hit", s)
	}
	up := setDriver(t, b.store, n.PK, "560")
	start := time.Now()
	apitest.Eventually(t, 2*time.Second, "the update on the other replica is served", func() bool {
		return get(t, a.cache, n.PK).Version == up.Version
	})
	t.Logf("visible across replicas after %s", time.Since(start))
	if got := get(t, a.cache, n.PK); got.DriverVersion != "560" {
		t.Fatalf("driver %q, want 560", got.DriverVersion)
	}
	if s := a.cache.Stats(); s.Misses != 1 || s.Bypassed != 0 {
		t.Fatalf("%+v: the update must come through the feed, not a read", s)
	}
	if _, err := b.store.DeleteNode(context.Background(), admin, n.PK, false, nil); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 2*time.Second, "the delete on the other replica is served", func() bool {
		_, err := a.cache.GetNode(context.Background(), n.PK)
		return errors.Is(err, registry.ErrNotFound)
	})
}

// A renewal on another replica is one event, and it moves the lease and
// version of every node of the job in the cache, through the feed.
func TestRenewalAcrossReplicas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	ctx := context.Background()
	sched := registry.Actor{Principal: registry.Principal{Sub: "sched", Role: registry.RoleScheduler}}
	var pks []int64
	for i := range 3 {
		pks = append(pks, createNode(t, b.store, fmt.Sprintf("10.0.0.%d", i+1)).PK)
	}
	lease := time.Minute
	if _, err := b.store.ClaimNodes(ctx, sched, registry.Claim{Job: 5, Count: 2, Lease: &lease}); err != nil {
		t.Fatal(err)
	}
	for _, pk := range pks {
		get(t, a.cache, pk)
	}
	misses := a.cache.Stats().Misses
	renewed, _, err := b.store.RenewLeases(ctx, sched, registry.Renewal{Job: 5, Lease: time.Hour})
	if err != nil || len(renewed) != 2 {
		t.Fatalf("renew: %v, %v", renewed, err)
	}
	for _, want := range renewed {
		apitest.Eventually(t, 2*time.Second, "the renewal on the other replica is served", func() bool {
			got := get(t, a.cache, want.PK)
			return got.Version == want.Version && got.LeaseExpiresAt != nil && got.LeaseExpiresAt.Equal(*want.LeaseExpiresAt) &&
				got.UpdatedAt.Equal(want.UpdatedAt)
		})
	}
	if s := a.cache.Stats(); s.Misses != misses || s.Bypassed != 0 {
		t.Fatalf("%+v: the renewal must come through the feed, not a read", s)
	}
	events, err := b.store.NodeEventsAfter(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	if last.Kind != registry.EventRenewed || len(last.Nodes) != 2 || last.Node.PK != renewed[0].PK ||
		last.Nodes[1].Version != renewed[1].Version || !last.At.Equal(renewed[0].UpdatedAt) {
		t.Fatalf("the last event: %+v; want one renewed event of %v", last, renewed)
	}
}

// frozen is a cache that serves but follows no feed: only what a test
// hands it changes it.
func frozen(t *testing.T, st *store.Store, size int) *Cache {
	c := New(st, Options{Size: size})
	c.Start(0)
	c.Listening(true)
	c.Sequenced(time.Now().Add(time.Hour), 0)
	return c
}

// Own writes are visible at once; an older version never replaces a newer.
func TestOwnWrites(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	c := frozen(t, st, 10)
	n := createNode(t, st, "10.0.0.1")
	get(t, c, n.PK)
	v2 := setDriver(t, st, n.PK, "560")
	c.Wrote(v2)
	if got := get(t, c, n.PK); got.DriverVersion != "560" {
		t.Fatalf("after own write: driver %q, want 560", got.DriverVersion)
	}
	c.Wrote(n) // late and older
	if got := get(t, c, n.PK); got.Version != v2.Version {
		t.Fatalf("an older version replaced a newer: %d, want %d", got.Version, v2.Version)
	}
	c.Deleted(v2)
	if _, err := c.GetNode(context.Background(), n.PK); err != nil {
		t.Fatalf("after own delete the read goes to PostgreSQL, where the node still is: %v", err)
	}
	if s := c.Stats(); s.Misses != 2 {
		t.Fatalf("%+v: want a second miss after the delete", s)
	}
}

// A fill that read version V while the feed delivered V+1 installs V+1:
// the feed's event for a pk not yet cached is not lost.
func TestStaleFill(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n := createNode(t, b.store, "10.0.0.1")
	var up registry.Node
	a.cache.pauseAfterRead(func(pk int64) {
		up = setDriver(t, b.store, pk, "560")
		apitest.Eventually(t, 5*time.Second, "the feed delivers the update during the fill", func() bool {
			a.cache.mu.RLock()
			defer a.cache.mu.RUnlock()
			f := a.cache.fills[pk]
			return f != nil && f.node != nil && f.node.Version == up.Version
		})
	})
	if got := get(t, a.cache, n.PK); got.Version > n.Version && got.Version != up.Version {
		t.Fatalf("fill returned version %d", got.Version)
	}
	if got := get(t, a.cache, n.PK); got.Version != up.Version || got.DriverVersion != "560" {
		t.Fatalf("after the race the cache serves version %d (%s), want %d", got.Version, got.DriverVersion, up.Version)
	}
}

// A fill that read a node the feed then reported deleted installs nothing.
func TestStaleFillDeleted(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n := createNode(t, b.store, "10.0.0.1")
	a.cache.pauseAfterRead(func(pk int64) {
		if _, err := b.store.DeleteNode(context.Background(), admin, pk, false, nil); err != nil {
			t.Error(err)
		}
		apitest.Eventually(t, 5*time.Second, "the feed delivers the delete during the fill", func() bool {
			a.cache.mu.RLock()
			defer a.cache.mu.RUnlock()
			return a.cache.fills[pk] != nil && a.cache.fills[pk].deleted > 0
		})
	})
	get(t, a.cache, n.PK)
	if _, err := a.cache.GetNode(context.Background(), n.PK); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("after the race: %v, want not found", err)
	}
}

// Heartbeats flushed on one replica reach another's cached copy.
func TestLivenessAcrossReplicas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n := createNode(t, b.store, "10.0.0.1")
	if got := get(t, a.cache, n.PK); got.LastSeen != nil {
		t.Fatalf("last_seen %v before any heartbeat", got.LastSeen)
	}
	at := time.Now().UTC().Truncate(time.Microsecond)
	if err := b.store.TouchNodes(context.Background(), []int64{n.PK}, []time.Time{at}); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 2*time.Second, "the heartbeat reaches the other replica's cache", func() bool {
		got := get(t, a.cache, n.PK)
		return got.LastSeen != nil && got.LastSeen.Equal(at)
	})
	if s := a.cache.Stats(); s.Misses != 1 {
		t.Fatalf("%+v: the heartbeat must come through the notification, not a read", s)
	}
}

// When the LISTEN connection dies, everything is dropped (heartbeat
// notifications may be lost); once it is back the cache serves again.
func TestListenLostDrops(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 100)
	n := createNode(t, a.store, "10.0.0.1")
	get(t, a.cache, n.PK)
	drops := a.cache.Stats().Drops
	var killed int
	err := a.store.Pool().QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d LISTEN backends: %v", killed, err)
	}
	apitest.Eventually(t, 5*time.Second, "the cache drops its nodes", func() bool { return a.cache.Stats().Drops > drops })
	if s := a.cache.Stats(); s.Size != 0 {
		t.Fatalf("%+v: nodes kept across a lost LISTEN connection", s)
	}
	// Written while reconnecting: the fresh read after the drop sees it.
	up := setDriver(t, a.store, n.PK, "560")
	apitest.Eventually(t, 10*time.Second, "the cache serves again", func() bool { return a.cache.Stats().Serving })
	if got := get(t, a.cache, n.PK); got.Version != up.Version {
		t.Fatalf("version %d, want %d", got.Version, up.Version)
	}
}

// Events pruned before the hub read them are a gap: the cache drops its
// nodes rather than serve what the missing events changed.
func TestPrunedEventsDrop(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 100)
	n := createNode(t, a.store, "10.0.0.1")
	other := createNode(t, a.store, "10.0.0.2")
	apitest.Eventually(t, 2*time.Second, "the creates are delivered", func() bool {
		a.cache.mu.RLock()
		defer a.cache.mu.RUnlock()
		return a.cache.delivered >= 2
	})
	get(t, a.cache, n.PK)
	drops := a.cache.Stats().Drops
	// In one transaction, and without a notification: n changes, its
	// event and one for another node are stamped, and n's is pruned.
	ctx := context.Background()
	tx, err := a.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE nodes SET driver_version = 'pruned', version = version + 1 WHERE pk = $1`, []any{n.PK}},
		{`INSERT INTO node_changes (kind, node_pk, doc, event_id, at)
		 SELECT 'updated', $1, doc || jsonb_build_object('driver_version', 'pruned', 'version', (doc->>'version')::bigint + 1),
		        nextval('node_event_seq'), now() - interval '2 days'
		 FROM node_changes WHERE node_pk = $1 ORDER BY row_id DESC LIMIT 1`, []any{n.PK}},
		{`INSERT INTO node_changes (kind, node_pk, doc, event_id, at)
		 SELECT 'updated', $1, doc, nextval('node_event_seq'), now() FROM node_changes WHERE node_pk = $1 ORDER BY row_id DESC LIMIT 1`, []any{other.PK}},
		{`UPDATE node_changes_horizon SET pruned_through = (SELECT max(event_id) FROM node_changes WHERE node_pk = $1)`, []any{n.PK}},
		{`DELETE FROM node_changes WHERE node_pk = $1 AND event_id = (SELECT pruned_through FROM node_changes_horizon)`, []any{n.PK}},
	} {
		if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
			t.Fatalf("%s: %v", st.sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "the cache sees the gap", func() bool { return a.cache.Stats().Drops > drops })
	if got := get(t, a.cache, n.PK); got.DriverVersion != "pruned" {
		t.Fatalf("driver %q after the gap, want pruned (the cache served what a pruned event changed)", got.DriverVersion)
	}
}

// The cache holds at most Size nodes; evicted ones read through again.
func TestBoundedSize(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	c := frozen(t, st, 3)
	var pks []int64
	for i := range 10 {
		pks = append(pks, createNode(t, st, "10.0.1."+string(rune('0'+i))).PK)
	}
	for range 3 {
		for _, pk := range pks {
			if got := get(t, c, pk); got.PK != pk {
				t.Fatalf("got node %d, want %d", got.PK, pk)
			}
		}
	}
	if s := c.Stats(); s.Size != 3 || s.Misses < 10 || s.Hits+s.Misses != 30 {
		t.Fatalf("%+v: want 3 nodes kept, every read answered", s)
	}
}

// Without a fresh proof that the feed is current the cache does not serve:
// reads go to PostgreSQL, and fill nothing.
func TestStaleFeedReadsThrough(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	c := New(st, Options{Size: 10, MaxStale: 300 * time.Millisecond})
	n := createNode(t, st, "10.0.0.1")
	c.Start(0)
	c.Listening(true)
	c.Sequenced(time.Now(), 0)
	get(t, c, n.PK)
	get(t, c, n.PK)
	if s := c.Stats(); s.Hits != 1 {
		t.Fatalf("%+v: want a hit while the proof is fresh", s)
	}
	time.Sleep(400 * time.Millisecond)
	up := setDriver(t, st, n.PK, "560")
	if got := get(t, c, n.PK); got.Version != up.Version {
		t.Fatalf("served version %d from a feed over MaxStale behind, want %d", got.Version, up.Version)
	}
	// A proof still waiting for its events does not count.
	c.Sequenced(time.Now(), 5)
	if s := c.Stats(); s.Serving {
		t.Fatalf("%+v: serving on a pass whose events are not applied", s)
	}
	c.Apply([]registry.NodeEvent{{ID: 5, Kind: "updated", Node: up}})
	if s := c.Stats(); !s.Serving {
		t.Fatalf("%+v: not serving once the pass's events are applied", s)
	}
}

// A fill whose read began before a drop installs nothing: what it read may
// predate the gap.
func TestFillAcrossDrop(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	c := frozen(t, st, 10)
	n := createNode(t, st, "10.0.0.1")
	c.pauseAfterRead(func(int64) {
		c.Gap("test")
		c.Sequenced(time.Now().Add(time.Hour), 0) // current again at once
	})
	get(t, c, n.PK)
	get(t, c, n.PK)
	if s := c.Stats(); s.Hits != 0 || s.Misses != 2 {
		t.Fatalf("%+v: the fill across the drop was installed", s)
	}
}

// A packed node reads exactly as the node it was packed from, and shares
// nothing with it.
func TestPack(t *testing.T) {
	t.Parallel()
	n := sample(42)
	job := int64(7)
	n.CurrentJob = &job
	reason := "maintenance"
	n.CordonReason = &reason
	p := pack(n)
	if !reflect.DeepEqual(*p, n) {
		t.Fatalf("packed:\n%+v\nwant\n%+v", *p, n)
	}
	*n.Owner, *n.GPUMem = "someone-else", 1
	if *p.Owner != "agent-gpu-0042" || *p.GPUMem != 80<<30 {
		t.Fatal("the packed node shares memory with the original")
	}
	var empty registry.Node
	if got := *pack(empty); !reflect.DeepEqual(got, empty) {
		t.Fatalf("packed zero node: %+v", got)
	}
}

// lister pages st's nodes for Preload; between reading a page and handing
// it over, during (when set) runs once per page.
func lister(st *store.Store, during func(page []registry.Node)) Lister {
	return func(ctx context.Context, after int64, limit int) ([]registry.Node, error) {
		page, err := st.ListNodes(ctx, registry.NodeFilter{After: after, Limit: limit})
		if err == nil && during != nil {
			during(page)
		}
		return page, err
	}
}

// Preload fills the cache with the fleet once the feed is current: every
// read after it is a hit, none a read through; it stops at the size bound.
func TestPreload(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 7000)
	if _, err := a.store.Pool().Exec(context.Background(), `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT '10.1.0.0'::inet + (g / 8), g % 8, 1024, '550' FROM generate_series(0, 7999) g`); err != nil {
		t.Fatal(err)
	}
	startPreload(t, a, nil)
	apitest.Eventually(t, 10*time.Second, "the preload fills the cache to its bound", func() bool { return a.cache.Stats().Size == 7000 })
	var pks []int64
	if err := pgxscan(a.store, &pks, `SELECT pk FROM nodes ORDER BY pk LIMIT 7000`); err != nil {
		t.Fatal(err)
	}
	for _, pk := range pks {
		get(t, a.cache, pk)
	}
	if s := a.cache.Stats(); s.Hits != 7000 || s.Misses != 0 || s.Size != 7000 {
		t.Fatalf("%+v: want every read of a preloaded node a hit, and the bound kept", s)
	}
}

// A page read before another replica's change, and handed over after the
// feed delivered it, does not install the older version of that node;
// and after a drop the preload starts again.
func TestPreloadStalePageAndDrop(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100), newReplica(t, dbURL, 100)
	n1, n2 := createNode(t, b.store, "10.0.0.1"), createNode(t, b.store, "10.0.0.2")
	apitest.Eventually(t, 5*time.Second, "the creations reach the cache before the preload", func() bool {
		var created []int64 // the latest event, once both creations have one
		if err := pgxscan(a.store, &created, `SELECT max(event_id) FROM node_changes HAVING count(event_id) = 2`); err != nil {
			t.Fatal(err)
		}
		a.cache.mu.RLock()
		defer a.cache.mu.RUnlock()
		return len(created) == 1 && a.cache.delivered >= created[0]
	})
	var up registry.Node
	raced := false
	during := func(page []registry.Node) {
		if raced || len(page) == 0 {
			return
		}
		raced = true
		up = setDriver(t, b.store, n1.PK, "560")
		apitest.Eventually(t, 5*time.Second, "the feed delivers the update while the page is in hand", func() bool {
			a.cache.mu.RLock()
			defer a.cache.mu.RUnlock()
			_, ok := a.cache.touched[n1.PK]
			return ok
		})
	}
	startPreload(t, a, during)
	// The feed installs n1's update (the cache tracks the whole fleet
	// from the preload's start); the page's older n1 is not installed
	// over it.
	apitest.Eventually(t, 5*time.Second, "the page's other node is installed", func() bool { return a.cache.Stats().Size == 2 })
	a.cache.mu.RLock()
	cached := a.cache.nodes[n1.PK]
	_, other := a.cache.nodes[n2.PK]
	a.cache.mu.RUnlock()
	if cached == nil || cached.Version != up.Version || !other {
		t.Fatalf("n1 cached as %+v, want the feed's version %d (it changed while its page was read); n2 installed %v", cached, up.Version, other)
	}
	if got := get(t, a.cache, n1.PK); got.Version != up.Version {
		t.Fatalf("served version %d, want %d", got.Version, up.Version)
	}
	a.cache.Gap("test")
	apitest.Eventually(t, 10*time.Second, "the preload fills the cache again after a drop", func() bool { return a.cache.Stats().Size == 2 })
}

func pgxscan(st *store.Store, dst *[]int64, sql string) error {
	rows, err := st.Pool().Query(context.Background(), sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return err
		}
		*dst = append(*dst, v)
	}
	return rows.Err()
}
