package nodecache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// startPreload runs r's preload, its pages read through during (nil:
// none), until the test ends.
func startPreload(t *testing.T, r *replica, during func(page []registry.Node)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.cache.Preload(ctx, lister(r.store, during)) }()
	t.Cleanup(func() { cancel(); <-done })
}

// preload runs r's preload until the test ends and waits until the cache
// holds the whole fleet.
func preload(t *testing.T, r *replica) {
	t.Helper()
	startPreload(t, r, nil)
	apitest.Eventually(t, 10*time.Second, "the cache holds the whole fleet", func() bool { return r.cache.Stats().Complete })
}

// seedMixed inserts n nodes of every state and a spread of attributes
// straight with SQL: hosts of 8 (a tenth of them IPv6), gpu_mem NULL or
// one of four sizes, three sources, two hardware generations or none,
// some lost, gone, cordoned, busy, draining, some with heartbeats.
func seedMixed(t *testing.T, st *store.Store, n int) {
	t.Helper()
	if _, err := st.Pool().Exec(context.Background(), `INSERT INTO hardware_generations (name) VALUES ('h100'), ('a100')`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(context.Background(), `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, source,
			schedulable, lost, cordon_reason, current_job, fabric, labels, owner)
		SELECT CASE WHEN g % 10 = 0 THEN '2001:db8::'::inet + g ELSE '10.2.0.0'::inet + (g / 8) END, g % 8,
			(g % 5) * 1024, '550',
			(SELECT pk FROM hardware_generations ORDER BY pk OFFSET (g % 3) LIMIT 1),
			CASE WHEN g % 7 = 0 THEN NULL ELSE (g % 4) * 20480 END,
			(ARRAY['api', 'scp', 'e2e'])[g % 3 + 1],
			g % 17 <> 0, g % 13 = 0, CASE WHEN g % 11 = 0 THEN 'maintenance' END,
			CASE WHEN g % 4 = 1 THEN 1000 + g % 9 END,
			CASE WHEN g % 5 > 0 THEN 'ib-' || g % 3 END,
			CASE WHEN g % 6 = 0 THEN '{}' ELSE jsonb_build_object('team', 't' || g % 4, 'rack', 'r' || g % 3) END,
			CASE WHEN g % 3 = 0 AND g % 2 = 0 THEN 'agent-' || g % 4 END
		FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(context.Background(), `
		INSERT INTO node_liveness (node_pk, last_seen) SELECT pk, now() - pk * interval '1 second' FROM nodes WHERE pk % 3 = 0`); err != nil {
		t.Fatal(err)
	}
}

// randomFilter is a filter over seedMixed's attributes, with a limit.
func randomFilter(rnd *rand.Rand, st *store.Store, pks []int64) registry.NodeFilter {
	var f registry.NodeFilter
	pick := func() bool { return rnd.IntN(3) == 0 }
	if pick() {
		v := rnd.IntN(2) == 0
		f.Free = &v
	}
	if pick() && (f.Free == nil || !*f.Free) {
		states := []registry.State{registry.StateGone, registry.StateLost, registry.StateDraining, registry.StateCordoned, registry.StateBusy}
		if f.Free == nil {
			states = append(states, registry.StateFree)
		}
		for range 1 + rnd.IntN(2) {
			f.State = append(f.State, states[rnd.IntN(len(states))])
		}
	}
	if pick() {
		v := []string{"api", "scp", "e2e"}[rnd.IntN(3)]
		f.Source = &v
	}
	if pick() {
		v := int64(1000 + rnd.IntN(10))
		f.CurrentJob = &v
	}
	if pick() {
		var gens []int64
		if err := pgxscan(st, &gens, `SELECT pk FROM hardware_generations`); err != nil || len(gens) == 0 {
			panic(fmt.Sprint(gens, err))
		}
		v := gens[rnd.IntN(len(gens))]
		f.HardwareGeneration = &v
	}
	if pick() {
		v := int64(rnd.IntN(4)) * 20480
		f.MinGPUMem = &v
	}
	if pick() {
		v := int64(rnd.IntN(6)) * 1024
		f.MinCPUMem = &v
	}
	if rnd.IntN(8) == 0 {
		v := fmt.Sprintf("10.2.0.%d", rnd.IntN(40))
		switch rnd.IntN(4) {
		case 0:
			v = fmt.Sprintf("2001:DB8:0::%x", 10*rnd.IntN(30)) // not canonical: Normalize makes it so
		case 1: // a range of hosts
			bits := 24 + rnd.IntN(9)
			v = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, 0, byte(rnd.IntN(40))}), bits).Masked().String()
		case 2:
			v = netip.PrefixFrom(netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", 10*rnd.IntN(30))), 116+rnd.IntN(13)).Masked().String()
		}
		f.IP = &v
	}
	if pick() {
		v := rnd.IntN(8)
		f.Index = &v
	}
	if rnd.IntN(10) == 0 {
		v := pks[rnd.IntN(len(pks))]
		f.PK = &v
	}
	if rnd.IntN(5) == 0 {
		v := fmt.Sprintf("ib-%d", rnd.IntN(4))
		f.Fabric = &v
	}
	if rnd.IntN(5) == 0 {
		v := fmt.Sprintf("agent-%d", rnd.IntN(5))
		f.Owner = &v
	}
	if rnd.IntN(5) == 0 {
		text := []string{"team=t1", "team!=t1", "team in (t0,t2)", "team notin (t3)", "rack", "!rack", "team=t2,rack!=r0"}[rnd.IntN(7)]
		sel, err := registry.ParseSelector(text)
		if err != nil {
			panic(err)
		}
		f.Selector = sel
	}
	if pick() {
		f.After = pks[rnd.IntN(len(pks))]
	}
	f.Limit = []int{1, 7, 100, 1000}[rnd.IntN(4)]
	return f
}

// Pages from memory are the pages PostgreSQL answers, for every filter the
// cache evaluates, over a fleet of every state; none of them is read from
// PostgreSQL.
func TestListMatchesStore(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 10_000)
	seedMixed(t, a.store, 2000)
	preload(t, a)
	var pks []int64
	if err := pgxscan(a.store, &pks, `SELECT pk FROM nodes ORDER BY pk`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(1, 2))
	nonEmpty := 0
	for i := range 800 {
		f := randomFilter(rnd, a.store, pks)
		want, err := a.store.ListNodes(ctx, f)
		if err != nil {
			if _, cerr := a.cache.ListNodes(ctx, f); cerr == nil || cerr.Error() != err.Error() {
				t.Fatalf("filter %d %+v: store refused it with %v, the cache answered %v", i, f, err, cerr)
			}
			continue
		}
		before := a.cache.Stats()
		got, err := a.cache.ListNodes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if s := a.cache.Stats(); s.ListHits != before.ListHits+1 {
			t.Fatalf("filter %d %+v: read from PostgreSQL (%+v), want from memory", i, f, s)
		}
		if len(want) > 0 {
			nonEmpty++
		}
		if !sameNodes(got, want) {
			t.Fatalf("filter %d %+v:\n cache %d nodes %v\n store %d nodes %v", i, f, len(got), pksOf(got), len(want), pksOf(want))
		}
	}
	if nonEmpty < 250 {
		t.Fatalf("only %d of the filters matched anything: the comparison proves little", nonEmpty)
	}
}

// sameNode reports whether a and b are the same version of a node with
// the same document: what a client is shown. (Lost is not in a change's
// document, so a node from the feed has it false; its State tells.)
func sameNode(a, b registry.Node) bool {
	return a.Version == b.Version && string(a.AppendJSON(nil)) == string(b.AppendJSON(nil))
}

func sameNodes(a, b []registry.Node) bool {
	return slices.EqualFunc(a, b, sameNode)
}

func pksOf(nodes []registry.Node) []int64 {
	pks := make([]int64, len(nodes))
	for i, n := range nodes {
		pks[i] = n.PK
	}
	return pks
}

// What the cache cannot answer exactly is read from PostgreSQL: a list
// before the cache holds the fleet, seen_within, no limit, a filter that
// matches too few of the nodes it would look at, a cache that has evicted
// a node.
func TestListReadsThrough(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a := newReplica(t, dbURL, 30_000)
	seedMixed(t, a.store, 25_000)
	ctx := context.Background()
	one := 1
	fromStore := func(what string, f registry.NodeFilter) {
		t.Helper()
		before := a.cache.Stats()
		if _, err := a.cache.ListNodes(ctx, f); err != nil {
			t.Fatal(err)
		}
		if s := a.cache.Stats(); s.ListMisses != before.ListMisses+1 || s.ListHits != before.ListHits {
			t.Fatalf("%s: %+v, want it read from PostgreSQL", what, s)
		}
	}
	fromStore("before the preload", registry.NodeFilter{Limit: 10})
	preload(t, a)
	within := time.Hour
	fromStore("seen_within", registry.NodeFilter{SeenWithin: &within, Limit: 10})
	fromStore("no limit", registry.NodeFilter{Index: &one})
	ip := "10.9.9.9" // no node: every node would be looked at
	fromStore("a filter matching none of 25,000", registry.NodeFilter{IP: &ip, Limit: 10})
	if _, err := a.cache.ListNodes(ctx, registry.NodeFilter{Limit: 10}); err != nil {
		t.Fatal(err)
	}
	if s := a.cache.Stats(); s.ListHits != 1 {
		t.Fatalf("%+v: want the plain page from memory", s)
	}
	// Evicting a node ends it: the cache no longer holds the whole fleet.
	a.cache.mu.Lock()
	a.cache.size = len(a.cache.nodes)
	a.cache.mu.Unlock()
	n := createNode(t, a.store, "10.9.9.10")
	apitest.Eventually(t, 5*time.Second, "the feed brings the new node, evicting another", func() bool { return !a.cache.Stats().Complete })
	fromStore("after an eviction", registry.NodeFilter{PK: &n.PK, Limit: 1})
}

// While the cache holds the whole fleet, nodes another replica creates,
// changes and deletes reach its lists through the feed, nodes it creates
// itself at once; a drop ends list answers until a new preload.
func TestListFollowsFeed(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 1000), newReplica(t, dbURL, 1000)
	seedMixed(t, a.store, 100)
	preload(t, a)
	ctx := context.Background()
	page := func(f registry.NodeFilter) []int64 {
		t.Helper()
		f.Limit = 1000
		before := a.cache.Stats().ListHits
		nodes, err := a.cache.ListNodes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if a.cache.Stats().ListHits != before+1 {
			t.Fatalf("list %+v read from PostgreSQL, want from memory", f)
		}
		return pksOf(nodes)
	}
	yes := true
	n := createNode(t, b.store, "10.3.0.1")
	ip := n.IP
	apitest.Eventually(t, 5*time.Second, "another replica's new node is listed", func() bool { return len(page(registry.NodeFilter{IP: &ip, Free: &yes})) == 1 })
	job := int64(77)
	if _, err := b.store.ClaimNodes(ctx, admin, registry.Claim{Job: job, Count: 1, Filter: registry.NodeFilter{IP: &ip}}); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "its claim takes it off the free list", func() bool {
		return len(page(registry.NodeFilter{IP: &ip, Free: &yes})) == 0 && len(page(registry.NodeFilter{CurrentJob: &job})) == 1
	})
	if _, _, err := b.store.ReleaseNodes(ctx, admin, registry.Release{Job: job}); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "its release puts it back on the free list", func() bool {
		return len(page(registry.NodeFilter{IP: &ip, Free: &yes})) == 1
	})
	if _, err := b.store.DeleteNode(ctx, admin, n.PK, true, nil); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "its deletion takes it off every list", func() bool { return len(page(registry.NodeFilter{IP: &ip})) == 0 })

	// This replica's own creation is listed at once, without the feed.
	mine := createNode(t, a.store, "10.3.0.2")
	a.cache.Wrote(mine)
	if got := page(registry.NodeFilter{PK: &mine.PK}); len(got) != 1 {
		t.Fatalf("own new node listed %v, want it at once", got)
	}
	// A write applied after the node's deletion does not bring it back.
	if _, err := b.store.DeleteNode(ctx, admin, mine.PK, true, nil); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "the deletion reaches the cache", func() bool { return len(page(registry.NodeFilter{PK: &mine.PK})) == 0 })
	a.cache.Wrote(mine)
	if got := page(registry.NodeFilter{PK: &mine.PK}); len(got) != 0 {
		t.Fatalf("a late write brought deleted node %d back", mine.PK)
	}

	a.cache.Gap("test")
	if s := a.cache.Stats(); s.Complete {
		t.Fatalf("%+v: complete after a drop", s)
	}
	apitest.Eventually(t, 10*time.Second, "the preload makes the cache whole again", func() bool { return a.cache.Stats().Complete })
}

// A preload racing writers of every kind (creates whose pks commit out of
// order, updates, claims, deletes, heartbeats) ends with the cache's lists
// equal to PostgreSQL's.
func TestListPreloadRace(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	a, b := newReplica(t, dbURL, 100_000), newReplica(t, dbURL, 100_000)
	seedMixed(t, a.store, 20_000)
	var seeded []int64
	if err := pgxscan(a.store, &seeded, `SELECT pk FROM nodes`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; ctx.Err() == nil; i++ {
				pk := seeded[rnd.IntN(len(seeded))]
				switch rnd.IntN(5) {
				case 0:
					_, _, _ = b.store.CreateNode(ctx, admin, registry.NodeSpec{IP: fmt.Sprintf("10.4.%d.%d", w, i%250), Index: i / 250, CPUMem: 1, DriverVersion: "550"})
				case 1:
					_, _ = b.store.UpdateNode(ctx, admin, pk, func(cur registry.Node) (registry.NodeSpec, error) {
						spec := cur.Spec()
						spec.DriverVersion = fmt.Sprint(i)
						return spec, nil
					})
				case 2:
					_, _ = b.store.ClaimNodes(ctx, admin, registry.Claim{Job: int64(5000 + i), Count: 1, Filter: registry.NodeFilter{PK: &pk}})
				case 3:
					_, _ = b.store.DeleteNode(ctx, admin, pk, true, nil)
				case 4:
					_ = b.store.TouchNodes(ctx, []int64{pk}, []time.Time{time.Now()})
				}
			}
		})
	}
	preload(t, a)
	time.Sleep(500 * time.Millisecond) // writers keep going after the preload
	cancel()
	wg.Wait()
	apitest.Eventually(t, 10*time.Second, "the cache's fleet is PostgreSQL's", func() bool {
		var want, got []registry.Node
		var after int64
		for {
			w, err := a.store.ListNodes(context.Background(), registry.NodeFilter{After: after, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			g, _, ok := a.cache.listCached(registry.NodeFilter{After: after, Limit: 1000})
			if !ok {
				return false
			}
			want, got = append(want, w...), append(got, g...)
			if len(w) < 1000 {
				break
			}
			after = w[len(w)-1].PK
		}
		return a.cache.Stats().Complete && sameNodes(got, want)
	})
}

// lending counts what a cache asks of its PageLender.
type lending struct {
	*store.Store
	mu             sync.Mutex
	lent, returned int
}

func (l *lending) ListPage(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	l.mu.Lock()
	l.lent++
	l.mu.Unlock()
	return l.Store.ListPage(ctx, f)
}

func (l *lending) RecyclePage(page []registry.Node) bool {
	ok := l.Store.RecyclePage(page)
	if ok {
		l.mu.Lock()
		l.returned++
		l.mu.Unlock()
	}
	return ok
}

// A list the cache cannot answer is read through a Loader that lends
// pages as a lent page, and Recycle gives it back to the Loader; a page
// from memory stays the cache's. Faults caught (each tried once): the
// miss read with ListNodes; Recycle keeping the lent page.
func TestListMissLentPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	seedMixed(t, st, 100)
	l := &lending{Store: st}
	c := New(l, Options{Size: 1000})
	page, err := c.ListNodes(ctx, registry.NodeFilter{Limit: 10})
	if err != nil || len(page) != 10 {
		t.Fatalf("list: %d nodes, %v", len(page), err)
	}
	c.Recycle(page)
	mem := []registry.Node{{PK: 1}}
	c.Recycle(mem)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lent != 1 || l.returned != 1 {
		t.Errorf("%d pages lent and %d given back, want 1 and 1", l.lent, l.returned)
	}
}
