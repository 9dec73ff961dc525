package api_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// cachedReplica is a server on dbURL whose reads go through a node cache.
// With follow it follows the change feed as serve wires it; without, the
// cache is frozen: it claims to be current for the next hour and nothing
// changes it (what a test needs to tell the cache's answer from
// PostgreSQL's).
func cachedReplica(t *testing.T, dbURL string, follow bool) (*bundle, *nodecache.Cache) {
	t.Helper()
	st := pgtest.Open(t, dbURL, store.Options{})
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	var hub *watch.Hub
	c := nodecache.New(st, nodecache.Options{Size: 1000, LivenessChannel: store.LivenessChannel,
		Prove: func(since time.Time) { hub.Prove(since) }})
	var follower watch.Follower
	if follow {
		follower = c
	} else {
		c.Start(0)
		c.Listening(true)
		c.Sequenced(time.Now().Add(time.Hour), 0)
	}
	hub = watch.New(st, watch.Options{
		Channels:       watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:         api.EncodeEvent,
		Poll:           time.Second, // as serve runs it: consistent reads must not rely on the poll
		Follower:       follower,
		FollowChannels: []string{store.LivenessChannel},
	})
	t.Cleanup(lifecycle.Go(context.Background(), hub.Run))
	beats := heartbeat.New(st, heartbeat.Options{})
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping, Logger: logger,
		Auth: verifier, Heartbeats: beats, Events: hub, Nodes: c}))
	t.Cleanup(ts.Close)
	apitest.Eventually(t, 5*time.Second, "the node cache serves", func() bool { return c.Stats().Serving })
	return &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, dbURL: dbURL, beats: beats,
		token: tokenFor(t, "admin-test", registry.RoleAdmin)}, c
}

func nodePath(pk int64) string { return "/v1/nodes/" + strconv.FormatInt(pk, 10) }

// A replica's own writes are visible to its next read, ETags included:
// they come through the feed, which every read waits for.
func TestNodeCacheOwnWrites(t *testing.T) {
	t.Parallel()
	a, c := cachedReplica(t, pgtest.New(t), true)
	pk := a.createNode(nil)
	old := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil)).header.Get("ETag")
	a.must(http.StatusNotModified, a.do("GET", nodePath(pk), nil, "If-None-Match", old))
	a.must(http.StatusOK, a.do("PATCH", nodePath(pk), map[string]any{"driver_version": "560.1"}))
	r := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil, "If-None-Match", old))
	if got := r.object(t)["driver_version"]; got != "560.1" {
		t.Fatalf("own write not visible: driver_version %v", got)
	}
	if tag := r.header.Get("ETag"); tag == old {
		t.Fatalf("ETag %s unchanged by the write", tag)
	}
	a.must(http.StatusNotModified, a.do("GET", nodePath(pk), nil, "If-None-Match", r.header.Get("ETag")))
	// Claim and release go through the cache too.
	a.must(http.StatusOK, a.do("POST", "/v1/nodes/claim", map[string]any{"job": 7}))
	if got := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil)).object(t)["current_job"]; got != 7.0 {
		t.Fatalf("after an own claim current_job is %v", got)
	}
	a.must(http.StatusNoContent, a.do("DELETE", nodePath(pk)+"?force=true", nil))
	a.must(http.StatusNotFound, a.do("GET", nodePath(pk), nil))
	if s := c.Stats(); s.Hits < 4 {
		t.Fatalf("%+v: reads did not use the cache", s)
	}
}

// Cache-Control: no-cache reads PostgreSQL: it sees a write the cache
// cannot know of yet.
func TestNodeCacheStrongRead(t *testing.T) {
	t.Parallel()
	a, _ := cachedReplica(t, pgtest.New(t), false)
	pk := a.createNode(nil)
	a.must(http.StatusOK, a.do("GET", nodePath(pk), nil))
	// Another replica's write: this frozen cache never hears of it.
	a.exec(`UPDATE nodes SET driver_version = 'elsewhere', version = version + 1 WHERE pk = $1`, pk)
	if got := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil)).object(t)["driver_version"]; got != "550.54.15" {
		t.Fatalf("the cached read shows %v; the test needs the cache's answer", got)
	}
	if got := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil, "Cache-Control", "no-cache")).object(t)["driver_version"]; got != "elsewhere" {
		t.Fatalf("a strong read shows %v, want PostgreSQL's elsewhere", got)
	}
	// max-stale takes the cache's answer; with no-cache too, PostgreSQL's.
	for h, want := range map[string]string{"max-stale=1": "550.54.15", "Max-Stale, no-cache": "elsewhere"} {
		if got := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil, "Cache-Control", h)).object(t)["driver_version"]; got != want {
			t.Errorf("Cache-Control: %s shows %v, want %s", h, got, want)
		}
	}
}

// A cache that cannot prove itself current is not served from, whatever
// the read accepts: a consistent read waits at most a second, then reads
// PostgreSQL, and a max-stale read reads it at once.
func TestNodeCacheBehindReadsPostgreSQL(t *testing.T) {
	t.Parallel()
	a, c := cachedReplica(t, pgtest.New(t), false)
	pk := a.createNode(nil)
	a.must(http.StatusOK, a.do("GET", nodePath(pk), nil))
	a.exec(`UPDATE nodes SET driver_version = 'elsewhere', version = version + 1 WHERE pk = $1`, pk)
	c.Listening(false) // a lost notification connection: no proof until it is back
	c.Listening(true)
	for _, h := range []string{"", "max-stale"} {
		start := time.Now()
		r := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil, "Cache-Control", h))
		if got := r.object(t)["driver_version"]; got != "elsewhere" {
			t.Errorf("Cache-Control %q on a cache behind: %v, want PostgreSQL's elsewhere", h, got)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("Cache-Control %q: took %v", h, took)
		}
	}
	if s := c.Stats(); s.AwaitsBehind < 1 {
		t.Errorf("%+v: the consistent read's wait is not counted as behind", s)
	}
}

// Another replica's update and delete are served by the very next read.
func TestNodeCacheAcrossReplicas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, _ := cachedReplica(t, dbURL, true)
	b, _ := cachedReplica(t, dbURL, true)
	pk := b.createNode(nil)
	old := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil)).header.Get("ETag")
	b.must(http.StatusOK, b.do("PATCH", nodePath(pk), map[string]any{"driver_version": "560.1"}))
	if got := a.must(http.StatusOK, a.do("GET", nodePath(pk), nil, "If-None-Match", old)).object(t)["driver_version"]; got != "560.1" {
		t.Fatalf("the other replica's update: driver_version %v", got)
	}
	b.must(http.StatusNoContent, b.do("DELETE", nodePath(pk), nil))
	a.must(http.StatusNotFound, a.do("GET", nodePath(pk), nil))
}

// Node-Id is refused on the very next request after any replica deletes
// the node; an owner that adopts a node is let in the same way.
func TestNodeCacheNodeID(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, _ := cachedReplica(t, dbURL, true)
	b, _ := cachedReplica(t, dbURL, true)
	agent := tokenFor(t, "agent-1", registry.RoleAgent)
	ping := func(x *bundle, pk int64, token string) int {
		return x.do("GET", "/v1/nodes/ping", nil, "Node-Id", strconv.FormatInt(pk, 10), "Authorization", "Bearer "+token).status
	}
	a.token, b.token = agent, agent
	own := a.createNode(map[string]any{"ip": "10.0.0.1"})
	other := a.createNode(map[string]any{"ip": "10.0.0.2"})
	a.token, b.token = tokenFor(t, "admin-test", registry.RoleAdmin), tokenFor(t, "admin-test", registry.RoleAdmin)
	for _, pk := range []int64{own, other} {
		if st := ping(a, pk, agent); st != http.StatusOK {
			t.Fatalf("the owner's ping: %d", st)
		}
	}
	a.must(http.StatusNoContent, a.do("DELETE", nodePath(own), nil))
	if st := ping(a, own, agent); st != http.StatusForbidden {
		t.Fatalf("ping as a node this replica just deleted: %d, want 403", st)
	}
	b.must(http.StatusNoContent, b.do("DELETE", nodePath(other), nil))
	if st := ping(a, other, agent); st != http.StatusForbidden {
		t.Fatalf("ping as a node another replica just deleted: %d, want 403", st)
	}

	// An imported node (no owner) is adopted through the other replica.
	mem := int64(80) << 30
	if _, err := a.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.9.0.1", CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil); err != nil {
		t.Fatal(err)
	}
	nodes, err := a.store.ListNodes(context.Background(), registry.NodeFilter{IP: ptr("10.9.0.1")})
	if err != nil || len(nodes) != 1 {
		t.Fatalf("imported node: %v %v", nodes, err)
	}
	imported := nodes[0].PK
	if st := ping(a, imported, agent); st != http.StatusForbidden {
		t.Fatalf("ping as an unowned node: %d, want 403", st)
	}
	b.token = agent
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/create", map[string]any{"ip": "10.9.0.1", "index": 0, "cpu_mem": 1 << 30,
		"driver_version": "550", "hardware_generation": nil, "gpu_mem": nil}))
	if st := ping(a, imported, agent); st != http.StatusOK {
		t.Fatalf("the adopter on the other replica: %d, want 200", st)
	}
}

// An agent that adopts a node through this replica acts as it on the very
// next request.
func TestNodeCacheOwnAdoption(t *testing.T) {
	t.Parallel()
	a, _ := cachedReplica(t, pgtest.New(t), true)
	mem := int64(80) << 30
	if _, err := a.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.9.0.1", CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil); err != nil {
		t.Fatal(err)
	}
	nodes, err := a.store.ListNodes(context.Background(), registry.NodeFilter{IP: ptr("10.9.0.1")})
	if err != nil || len(nodes) != 1 {
		t.Fatalf("imported node: %v %v", nodes, err)
	}
	pk := strconv.FormatInt(nodes[0].PK, 10)
	a.token = tokenFor(t, "agent-1", registry.RoleAgent)
	a.must(http.StatusForbidden, a.do("GET", "/v1/nodes/ping", nil, "Node-Id", pk))
	a.must(http.StatusOK, a.do("POST", "/v1/nodes/create", map[string]any{"ip": "10.9.0.1", "index": 0, "cpu_mem": 1 << 30,
		"driver_version": "550", "hardware_generation": nil, "gpu_mem": nil}))
	a.must(http.StatusOK, a.do("GET", "/v1/nodes/ping", nil, "Node-Id", pk))
}

// Once the cache holds the whole fleet, pages of a list come from memory:
// this replica's own writes are in the next page, and Cache-Control:
// no-cache reads PostgreSQL instead.
func TestNodeCacheLists(t *testing.T) {
	t.Parallel()
	a, c := cachedReplica(t, pgtest.New(t), true)
	first := a.createNode(nil)
	t.Cleanup(lifecycle.Go(context.Background(), func(ctx context.Context) {
		c.Preload(ctx, func(ctx context.Context, after int64, limit int) ([]registry.Node, error) {
			return a.store.ListNodes(ctx, registry.NodeFilter{After: after, Limit: limit})
		})
	}))
	apitest.Eventually(t, 5*time.Second, "the cache holds the whole fleet", func() bool { return c.Stats().Complete })
	before := c.Stats()
	second := a.createNode(map[string]any{"ip": "10.7.0.2"})
	if got := a.listed(map[string]any{"free": true, "limit": 10}); len(got) != 2 || got[0] != first || got[1] != second {
		t.Fatalf("free nodes %v, want [%d %d]: this replica's new node at once", got, first, second)
	}
	a.must(http.StatusOK, a.do("POST", "/v1/nodes/claim", map[string]any{"job": 9, "ip": "10.7.0.2"}))
	if got := a.listed(map[string]any{"free": true, "limit": 10}); len(got) != 1 || got[0] != first {
		t.Fatalf("free nodes %v after claiming %d, want [%d]", got, second, first)
	}
	if s := c.Stats(); s.ListHits != before.ListHits+2 || s.ListMisses != before.ListMisses {
		t.Fatalf("%+v (before %+v): want both pages from memory", s, before)
	}
	// A write the feed does not carry: the cache's page keeps the node
	// free; a strong read shows PostgreSQL's row.
	a.exec(`UPDATE nodes SET current_job = 8, version = version + 1 WHERE pk = $1`, first)
	if got := a.listed(map[string]any{"free": true, "limit": 10}); len(got) != 1 {
		t.Fatalf("free nodes %v; the test needs the cache's answer", got)
	}
	var nodes []map[string]any
	a.must(http.StatusOK, a.do("POST", "/v1/nodes/list", map[string]any{"free": true, "limit": 10}, "Cache-Control", "no-cache")).json(t, &nodes)
	if len(nodes) != 0 {
		t.Fatalf("a strong list shows %d free nodes, want PostgreSQL's none", len(nodes))
	}
}

// staleCache holds copies older than PostgreSQL's rows: current enough for
// max-stale, never proven for a consistent read.
type staleCache struct{ nodes map[int64]registry.Node }

func (c *staleCache) GetNode(_ context.Context, pk int64) (registry.Node, error) {
	if n, ok := c.nodes[pk]; ok {
		return n, nil
	}
	return registry.Node{}, registry.ErrNotFound
}

func (c *staleCache) ListNodesAt(context.Context, registry.NodeFilter) ([]registry.Node, registry.Position, error) {
	return nil, registry.Position{}, errors.New("staleCache: no lists")
}
func (c *staleCache) Recycle([]registry.Node)                  {}
func (c *staleCache) Await(context.Context, time.Time) bool    { return false }
func (c *staleCache) Proven(time.Time) bool                    { return true }
func (c *staleCache) ListsFromMemory(registry.NodeFilter) bool { return true }

// A Node-Id check with max-stale takes a yes from the cache as it is, but
// never a no: a refusal is checked again by a consistent read. A node
// handed to the agent (or created) a moment ago, whose older copy the
// cache holds or lacks, is its to act as; one handed away a moment ago
// may still be, with max-stale only.
func TestNodeIDMaxStaleRefusalIsChecked(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mk := func(owner, ip string) registry.Node {
		n, _, err := st.CreateNode(ctx, registry.Actor{Principal: registry.Principal{Sub: owner, Role: registry.RoleAgent}},
			registry.NodeSpec{IP: ip, DriverVersion: "550"})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	other := "agent-b"
	mine, handedAway, fresh := mk("agent-a", "10.9.0.1"), mk("agent-b", "10.9.0.2"), mk("agent-a", "10.9.0.3")
	staleMine, staleAway := mine, handedAway
	staleMine.Owner = &other     // the cache has it as agent-b's still
	staleAway.Owner = mine.Owner // and this one as agent-a's
	cache := &staleCache{nodes: map[int64]registry.Node{mine.PK: staleMine, handedAway.PK: staleAway}}
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Auth:   verifier, Heartbeats: heartbeat.New(st, heartbeat.Options{}), Nodes: cache}))
	t.Cleanup(ts.Close)
	b := &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, dbURL: dbURL,
		token: tokenFor(t, "agent-a", registry.RoleAgent)}
	for _, tc := range []struct {
		name         string
		pk           int64
		cacheControl string
		want         int
	}{
		{"its own, stale in the cache as another's, max-stale", mine.PK, "max-stale", http.StatusOK},
		{"its own, not in the cache, max-stale", fresh.PK, "max-stale", http.StatusOK},
		{"its own, consistent", mine.PK, "", http.StatusOK},
		{"handed away, stale in the cache as its own, max-stale", handedAway.PK, "max-stale", http.StatusOK},
		{"handed away, consistent", handedAway.PK, "", http.StatusForbidden},
	} {
		if r := b.do("GET", "/v1/nodes/ping", nil, "Node-Id", strconv.FormatInt(tc.pk, 10), "Cache-Control", tc.cacheControl); r.status != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, r.status, tc.want)
		}
	}
}

// laggingCache is working through a backlog of changes: it never proves
// itself current (Await waits for its context), and it holds only part
// of the fleet unless whole says otherwise.
type laggingCache struct {
	whole  bool
	awaits atomic.Int64
	// caughtUp: the cache is current (Proven, Await) and serves node.
	caughtUp atomic.Bool
	node     registry.Node
}

func (c *laggingCache) GetNode(context.Context, int64) (registry.Node, error) {
	if c.caughtUp.Load() {
		return c.node, nil
	}
	return registry.Node{}, errors.New("laggingCache: no reads")
}
func (c *laggingCache) ListNodesAt(context.Context, registry.NodeFilter) ([]registry.Node, registry.Position, error) {
	return nil, registry.Position{}, errors.New("laggingCache: no lists")
}
func (c *laggingCache) Recycle([]registry.Node) {}
func (c *laggingCache) Await(ctx context.Context, _ time.Time) bool {
	c.awaits.Add(1)
	if c.caughtUp.Load() {
		return true
	}
	<-ctx.Done()
	return false
}
func (c *laggingCache) Proven(time.Time) bool { return c.caughtUp.Load() }
func (c *laggingCache) ListsFromMemory(registry.NodeFilter) bool {
	return c.whole
}

// oneNode is a fresh database with one node (driver 550), its store and a
// token verifier.
func oneNode(t *testing.T) (string, *store.Store, *auth.Verifier, registry.Node) {
	t.Helper()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	n, _, err := st.CreateNode(context.Background(), registry.Actor{Principal: registry.Principal{Sub: "admin", Role: registry.RoleAdmin}},
		registry.NodeSpec{IP: "10.9.0.1", DriverVersion: "550"})
	if err != nil {
		t.Fatal(err)
	}
	return dbURL, st, verifier, n
}

// A consistent list that the node cache could not answer from memory
// anyway (it does not hold the whole fleet) reads PostgreSQL at once,
// however far behind the cache is: after a million-node import every
// list waited the full second for a cache that could not serve it. One
// the cache could answer still waits for it to prove itself current.
// Each kind of list gets a server of its own: the first wait in vain
// marks the cache as behind for the server's later reads.
func TestListDoesNotWaitForACacheThatCannotServeIt(t *testing.T) {
	t.Parallel()
	dbURL, st, verifier, n := oneNode(t)
	hub := startHub(t, st)
	for _, whole := range []bool{false, true} {
		cache := &laggingCache{whole: whole}
		ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			Auth:   verifier, Heartbeats: heartbeat.New(st, heartbeat.Options{}), Events: hub, Nodes: cache}))
		b := &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, dbURL: dbURL,
			token: tokenFor(t, "sched", registry.RoleScheduler)}
		for _, body := range []map[string]any{{"free": true, "limit": 10}, {}} {
			start := time.Now()
			var nodes []registry.Node
			b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", body)).json(t, &nodes)
			took := time.Since(start)
			if len(nodes) != 1 || nodes[0].PK != n.PK {
				t.Errorf("whole %t, list %v: %v, want node %d from PostgreSQL", whole, body, nodes, n.PK)
			}
			if !whole && (took > 500*time.Millisecond || cache.awaits.Load() != 0) {
				t.Errorf("list %v beside a partial cache took %s and waited for it %d times; want PostgreSQL at once", body, took, cache.awaits.Load())
			}
		}
		// The first waits the bound; the second, finding the cache known
		// to be behind, only a moment (TestReadsStopWaitingForACacheThatIsBehind).
		if whole && cache.awaits.Load() != 2 {
			t.Errorf("lists beside a cache of the whole fleet waited for it %d times, want each (2)", cache.awaits.Load())
		}
		ts.Close()
	}
}

// Once a consistent read has waited the whole bound for a node cache that
// is behind (working through an import's changes), the reads after it
// wait only a moment (a proof asked for) and go to PostgreSQL, until the
// cache is current again; then they are the cache's again. After a million-node import every GET by pk waited
// the full second for 20 s and more.
func TestReadsStopWaitingForACacheThatIsBehind(t *testing.T) {
	t.Parallel()
	dbURL, st, verifier, n := oneNode(t)
	cached := n
	cached.DriverVersion = "from-the-cache"
	cache := &laggingCache{node: cached}
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Auth:   verifier, Heartbeats: heartbeat.New(st, heartbeat.Options{}), Events: startHub(t, st), Nodes: cache}))
	t.Cleanup(ts.Close)
	b := &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, dbURL: dbURL,
		token: tokenFor(t, "sched", registry.RoleScheduler)}
	get := func() (registry.Node, time.Duration) {
		t.Helper()
		start := time.Now()
		var got registry.Node
		b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/nodes/%d", n.PK), nil)).json(t, &got)
		return got, time.Since(start)
	}
	if got, took := get(); got.DriverVersion != "550" || took < 900*time.Millisecond || cache.awaits.Load() != 1 {
		t.Fatalf("the first read: %q after %s, %d waits; want PostgreSQL's after waiting the bound once", got.DriverVersion, took, cache.awaits.Load())
	}
	for range 3 {
		if got, took := get(); got.DriverVersion != "550" || took > 500*time.Millisecond {
			t.Errorf("a read while the cache is behind: %q after %s; want PostgreSQL's at once", got.DriverVersion, took)
		}
	}
	// Each of them asked for a proof (a short wait), so the cache can be
	// found current again.
	if w := cache.awaits.Load(); w != 4 {
		t.Errorf("%d waits, want the first and a short one per read after it (4)", w)
	}
	cache.caughtUp.Store(true)
	for range 2 {
		if got, _ := get(); got.DriverVersion != "from-the-cache" {
			t.Errorf("a read once the cache is current: %q; want the cache's", got.DriverVersion)
		}
	}
}
