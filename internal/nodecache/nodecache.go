// Package nodecache serves reads of a node by pk from memory: a bounded
// copy of recently read nodes, kept current from the change feed the
// watch hub follows (it is the hub's Follower), after the model of
// kube-apiserver's watch cache.
//
// The consistency a reader gets (docs/api.md, "Read consistency"):
//
//   - Every write acknowledged before a read arrived is in what the read
//     gets, whichever replica took it (Await): the read waits until the
//     cache has applied the feed up to a position read after its arrival.
//     The proof: a sequencing pass or a position look-up (watch.Hub.Prove)
//     that started at T and whose events have all been applied proves
//     every change committed before T is in (current). Reads that accept
//     staleness check Proven(arrival - S) instead; GetNode itself serves
//     from memory only while a proof is at most MaxStale old.
//   - The cache changes only through the feed and fills from PostgreSQL
//     (no write-through: a copy ahead of the feed would make a list's
//     position inexact; see filledAt). Versions only move forward: an
//     older version never replaces a newer one, whichever of the feed or
//     a fill brings it.
//   - After a gap (the LISTEN connection failed, events were pruned
//     before this replica read them, the hub stopped) everything cached
//     is dropped and reads go to PostgreSQL until the LISTEN connection
//     is back and a new proof has arrived.
//   - last_seen comes from heartbeat flushes, which skip the change feed:
//     every flush notifies its batch (store.LivenessChannel) in the same
//     statement, and cached copies take the newer time. A GET shows a
//     heartbeat once its flush commits, as when it read PostgreSQL.
//
// Misses read through (Loader) and fill the cache. A fill must never
// install a version older than the feed already delivered: while a read
// is in flight, every event and heartbeat for its pk is noted on the fill,
// and the fill installs the newer of what it read and what it noted.
//
// Lists (list.go) are answered from memory only while the cache holds the
// whole fleet (Cache.tracking, Cache.complete), with the same consistency
// as a read by pk; otherwise they read PostgreSQL.
package nodecache

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// Loader reads nodes from PostgreSQL. *store.Store implements it.
type Loader interface {
	GetNode(ctx context.Context, pk int64) (registry.Node, error)
	ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error)
}

// Options tune a Cache.
type Options struct {
	// Size bounds the cached nodes; default DefaultSize. When full, a
	// fill evicts a node at random.
	Size int
	// MaxStale is how old the feed's last proof of being current may be
	// while the cache serves; default DefaultMaxStale.
	MaxStale time.Duration
	// LivenessChannel is the channel heartbeat flushes notify.
	LivenessChannel string
	Logger          *slog.Logger
	// Prove asks the feed for proof that the cache is current as of a
	// read's arrival (watch.Hub.Prove); Await calls it. Without it Await
	// waits for the sequencer's own passes.
	Prove func(since time.Time)
}

// Defaults of Options.
const (
	DefaultSize     = 200_000
	DefaultMaxStale = 2 * time.Second
)

// Stats counts what the cache did.
type Stats struct {
	Hits, Misses, Bypassed int64 // served, read through and filled, read through (not serving)
	ListHits, ListMisses   int64 // list pages served from memory, read from PostgreSQL
	Drops                  int64 // times everything was dropped after a gap
	Size                   int
	Serving                bool
	// Complete: the cache holds the whole fleet, so it answers lists.
	Complete bool
	// AwaitsProved and AwaitsBehind count Await's answers: proven current
	// in time, or not (the read goes to PostgreSQL).
	AwaitsProved, AwaitsBehind int64
}

// Cache is one replica's cache of nodes.
type Cache struct {
	load     Loader
	size     int
	maxStale time.Duration
	liveness string
	logger   *slog.Logger

	prove func(since time.Time)

	hits, misses, bypassed, drops atomic.Int64
	listHits, listMisses          atomic.Int64
	awaitsProved, awaitsBehind    atomic.Int64

	mu    sync.RWMutex
	nodes map[int64]*registry.Node // each packed (see pack)
	index index                    // nodes' pks in order (list.go)
	fills map[int64]*fill          // reads in flight, by pk
	// tracking: a preload pass began in this epoch, and since then every
	// node the feed or a write brings is installed, cached or not (not only
	// updated when cached), except those deleted meanwhile (tombs). Once
	// that pass has read the whole fleet without an eviction since
	// tracking began, the cache is complete: it holds every node, and
	// answers lists.
	tracking, complete, evicted bool
	tombs                       map[int64]time.Time // deleted, when (kept through drops)
	tombsPruned                 time.Time
	beats                       map[int64]beat // heartbeats of nodes not cached, while tracking
	beatsPruned                 time.Time
	// touched, while a preload batch is being read (non-nil), notes the
	// pks the feed changed or deleted (zero time) or heartbeats touched
	// (the newest last_seen) meanwhile; see Preload.
	touched map[int64]time.Time
	epoch   uint64 // bumped by every drop; fills of an older epoch install nothing

	started   bool          // the hub told where its feed starts
	delivered int64         // the newest event applied
	listening bool          // the LISTEN connection is up
	since     time.Time     // the last drop; proofs must be newer
	current   time.Time     // every change committed before it is applied; zero: none since the drop
	proofs    []proof       // sequencing passes not yet confirmed by delivered events
	advanced  chan struct{} // closed (and replaced) whenever current moves: Await's wake-up
	// filledAt is when the newest read from PostgreSQL that the cache
	// installed (a fill, a preload page) ended. Such a copy may be ahead
	// of the feed: it can show a change whose event is not applied yet.
	// Once current is after filledAt every such change is applied, so the
	// cache shows exactly the events up to delivered (see ListNodesAt).
	filledAt time.Time
}

type proof struct {
	at     time.Time
	latest int64
}

// fill is what the feed brought for a pk while reads of it were in flight.
type fill struct {
	readers  int
	node     *registry.Node // the newest version the feed delivered
	deleted  int64          // > 0: deleted at this version
	lastSeen time.Time      // the newest heartbeat
}

// New returns a Cache reading misses through load. Register it as the
// watch hub's Follower (with LivenessChannel among its FollowChannels).
func New(load Loader, opts Options) *Cache {
	if opts.Size <= 0 {
		opts.Size = DefaultSize
	}
	if opts.MaxStale <= 0 {
		opts.MaxStale = DefaultMaxStale
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Cache{load: load, size: opts.Size, maxStale: opts.MaxStale, liveness: opts.LivenessChannel,
		logger: opts.Logger, prove: opts.Prove, nodes: map[int64]*registry.Node{}, index: newIndex(), fills: map[int64]*fill{},
		tombs: map[int64]time.Time{}, beats: map[int64]beat{}, advanced: make(chan struct{})}
}

// Await waits until the cache is proven current as of since (a read's
// arrival): it has applied every change committed before since, so every
// write acknowledged before the read arrived. It asks for the proof
// (Options.Prove) and reports whether it came before ctx ended; false
// means the read must go to PostgreSQL.
//
// This is the consistent read of kube-apiserver's watch cache (KEP-2340):
// the proof is a position of the feed read after since, and the cache
// having applied the feed up to it.
func (c *Cache) Await(ctx context.Context, since time.Time) bool {
	c.mu.RLock()
	ok, wake := c.provenLocked(since), c.advanced
	c.mu.RUnlock()
	if !ok && c.prove != nil {
		c.prove(since)
	}
	for !ok {
		select {
		case <-ctx.Done():
			c.awaitsBehind.Add(1)
			return false
		case <-wake:
		}
		c.mu.RLock()
		ok, wake = c.provenLocked(since), c.advanced
		c.mu.RUnlock()
	}
	c.awaitsProved.Add(1)
	return true
}

// Proven reports, without waiting, whether the cache is proven current as
// of since: what a read that accepts staleness (max-stale) checks.
func (c *Cache) Proven(since time.Time) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.provenLocked(since)
}

// provenLocked: every change committed before since is applied; c.mu held.
func (c *Cache) provenLocked(since time.Time) bool {
	return c.listening && !c.current.IsZero() && !c.current.Before(since)
}

// advanceLocked moves current to at if later, waking Await; c.mu held
// for writing.
func (c *Cache) advanceLocked(at time.Time) {
	if !at.After(c.current) {
		return
	}
	c.current = at
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// Delivered returns the newest event id applied: every event up to it is
// in what the cache serves, and in anything read from PostgreSQL after.
func (c *Cache) Delivered() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.delivered
}

// servingLocked reports whether the feed is proven current enough to
// serve from memory; c.mu held (either way).
func (c *Cache) servingLocked(now time.Time) bool {
	return c.listening && !c.current.IsZero() && now.Sub(c.current) <= c.maxStale
}

// GetNode returns node pk: from memory when the cache serves and holds
// it, otherwise from the Loader (filling the cache). Errors are the
// Loader's (ErrNotFound for a missing node).
func (c *Cache) GetNode(ctx context.Context, pk int64) (registry.Node, error) {
	now := time.Now()
	c.mu.RLock()
	if c.servingLocked(now) {
		if n, ok := c.nodes[pk]; ok {
			c.mu.RUnlock()
			c.hits.Add(1)
			return *n, nil
		}
	}
	c.mu.RUnlock()
	return c.readThrough(ctx, pk)
}

// readThrough reads pk from PostgreSQL and, when the cache serves, installs
// the newer of what it read and what the feed brought meanwhile.
func (c *Cache) readThrough(ctx context.Context, pk int64) (registry.Node, error) {
	c.mu.Lock()
	serving := c.servingLocked(time.Now())
	epoch := c.epoch
	var f *fill
	if serving {
		if f = c.fills[pk]; f == nil {
			f = &fill{}
			c.fills[pk] = f
		}
		f.readers++
	}
	c.mu.Unlock()
	if !serving {
		c.bypassed.Add(1)
		return c.load.GetNode(ctx, pk)
	}
	c.misses.Add(1)
	n, err := c.load.GetNode(ctx, pk)
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.readers--; f.readers == 0 {
		delete(c.fills, pk)
	}
	if err != nil || epoch != c.epoch || !c.servingLocked(time.Now()) {
		return n, err
	}
	best := n
	if f.node != nil && f.node.Version > best.Version {
		best = *f.node
	}
	if f.deleted > 0 && f.deleted >= best.Version {
		return n, nil // deleted since: nothing to install
	}
	best = withLastSeen(best, f.lastSeen)
	c.installLocked(best)
	c.filledAt = later(c.filledAt, time.Now())
	return best, nil
}

// installLocked puts n in the cache unless a newer version is there,
// evicting at random when full; c.mu held.
func (c *Cache) installLocked(n registry.Node) {
	if b, ok := c.beats[n.PK]; ok {
		n = withLastSeen(n, b.seen)
		delete(c.beats, n.PK)
	}
	if cur, ok := c.nodes[n.PK]; ok {
		c.setLocked(pack(newer(*cur, n)))
		return
	}
	if len(c.nodes) >= c.size {
		for pk := range c.nodes { // map order is random enough
			c.deleteLocked(pk)
			break
		}
		c.evicted, c.complete = true, false
	}
	c.setLocked(pack(n))
}

// newer is the newer version of a node, with the later of the two
// last_seen times (heartbeats do not change the version).
func newer(cur, n registry.Node) registry.Node {
	if n.Version < cur.Version {
		n, cur = cur, n
	}
	if cur.LastSeen != nil {
		n = withLastSeen(n, *cur.LastSeen)
	}
	return n
}

// packed is a cached node in one object: the node and what its pointer
// fields point at; its strings' bytes share one more. So the garbage
// collector marks two objects per cached node, not the dozen a node as
// the store scans it takes (see docs/design.md).
type packed struct {
	n   registry.Node
	opt [7]string    // owner, cordon_reason, external_id, provider_state, gpu_model, gpu_uuid, fabric
	i64 [3]int64     // hardware_generation, gpu_mem, current_job
	ts  [2]time.Time // last_seen, lease_expires_at, in UTC (no location pointer)
}

// pack returns a copy of n that shares nothing with n and takes two
// objects, neither pointing outside the pair but for its labels, an
// interned immutable text the nodes of a host share (registry.Labels). It
// is never modified: a change packs a new copy.
func pack(n registry.Node) *registry.Node {
	p := &packed{n: n}
	fields := []*string{&p.n.IP, &p.n.DriverVersion, &p.n.Source, (*string)(&p.n.State)}
	for i, dst := range [...]**string{&p.n.Owner, &p.n.CordonReason, &p.n.ExternalID, &p.n.ProviderState,
		&p.n.GPUModel, &p.n.GPUUUID, &p.n.Fabric} {
		if *dst != nil {
			p.opt[i] = **dst
			*dst = &p.opt[i]
			fields = append(fields, &p.opt[i])
		}
	}
	var b strings.Builder
	for _, f := range fields {
		b.Grow(len(*f))
	}
	for _, f := range fields {
		b.WriteString(*f)
	}
	text, at := b.String(), 0
	for _, f := range fields {
		l := len(*f)
		*f = text[at : at+l]
		at += l
	}
	for i, dst := range [...]**int64{&p.n.HardwareGeneration, &p.n.GPUMem, &p.n.CurrentJob} {
		if *dst != nil {
			p.i64[i] = **dst
			*dst = &p.i64[i]
		}
	}
	for i, dst := range [...]**time.Time{&p.n.LastSeen, &p.n.LeaseExpiresAt} {
		if *dst != nil {
			p.ts[i] = (**dst).UTC()
			*dst = &p.ts[i]
		}
	}
	return &p.n
}

// withLastSeen is n with last_seen at least t.
func withLastSeen(n registry.Node, t time.Time) registry.Node {
	if t.IsZero() || n.LastSeen != nil && !n.LastSeen.Before(t) {
		return n
	}
	t = t.UTC()
	n.LastSeen = &t
	return n
}

// changeLocked applies one change: to the fills in flight and to the
// cached copy, versions only moving forward; c.mu held.
func (c *Cache) changeLocked(n registry.Node, deleted bool) {
	if c.touched != nil {
		c.touched[n.PK] = time.Time{}
	}
	if f := c.fills[n.PK]; f != nil {
		switch {
		case deleted:
			f.deleted = max(f.deleted, n.Version)
		case f.node == nil || n.Version > f.node.Version:
			f.node = &n
		}
	}
	cur, ok := c.nodes[n.PK]
	switch {
	case deleted:
		if !ok || n.Version >= cur.Version {
			c.deleteLocked(n.PK)
			c.buryLocked(n.PK, time.Now())
		}
	case ok:
		c.setLocked(pack(newer(*cur, n)))
	case c.tracking:
		if _, gone := c.tombs[n.PK]; !gone {
			c.installLocked(n)
		}
	}
}

// Start implements watch.Follower.
func (c *Cache) Start(last int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started, c.delivered = true, last
	c.confirmLocked()
}

// Apply implements watch.Follower.
func (c *Cache) Apply(events []registry.NodeEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range events {
		if e.Kind == registry.EventRenewed {
			for _, n := range e.Nodes {
				c.changeLocked(n, false)
			}
		} else {
			c.changeLocked(e.Node, e.Kind == "deleted")
		}
		c.delivered = max(c.delivered, e.ID)
	}
	c.confirmLocked()
}

// confirmLocked advances on every proof whose events are all applied;
// c.mu held for writing. (A look-up may start after a pass and see less:
// its snapshot came before the pass committed. So any may confirm
// first.) A proof that came between a drop and the Start after it (at a
// new epoch's start, which no event brings) is confirmed by that Start.
func (c *Cache) confirmLocked() {
	keep := c.proofs[:0]
	for _, p := range c.proofs {
		if p.latest <= c.delivered {
			c.advanceLocked(p.at)
		} else {
			keep = append(keep, p)
		}
	}
	clear(c.proofs[len(keep):])
	c.proofs = keep
}

// maxProofs bounds the passes waiting for their events.
const maxProofs = 16

// Sequenced implements watch.Follower.
func (c *Cache) Sequenced(at time.Time, latest int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || !c.listening || !at.After(c.since) {
		return // a pass that started before the drop proves nothing after it
	}
	if latest <= c.delivered {
		// Behind what was applied is no sign of a lost feed: the look-up
		// that read latest vouched for every id the hub had read before
		// it (watch.Store.FeedPosition's seen), and the feed applied more
		// since.
		c.advanceLocked(at)
		return
	}
	if len(c.proofs) == maxProofs {
		c.proofs[maxProofs-1] = proof{at, latest} // the oldest confirm first; keep them
		return
	}
	c.proofs = append(c.proofs, proof{at, latest})
}

// Listening implements watch.Follower: down drops everything (heartbeat
// notifications may be lost); up starts the wait for a new proof.
func (c *Cache) Listening(up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !up {
		c.dropLocked("the notification connection was lost")
	}
	c.listening = up
}

// Gap implements watch.Follower.
// After a new epoch the deletions it remembers may be lost with the
// rest: a pk deleted then may name a node again (the deletion undone, or
// the pk issued anew), so the tombs go too.
func (c *Cache) Gap(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(reason)
	if strings.HasPrefix(reason, registry.NewEpochReason) {
		clear(c.tombs)
	}
}

// dropLocked forgets every node and proof: until a pass that starts after
// now is confirmed, reads go to PostgreSQL; c.mu held.
func (c *Cache) dropLocked(reason string) {
	if len(c.nodes) > 0 || !c.current.IsZero() {
		level := slog.LevelWarn
		if reason == registry.HubStoppedReason {
			level = slog.LevelDebug // the replica is stopping
		}
		c.logger.Log(context.Background(), level, "node cache: dropped; reads go to PostgreSQL until the change feed is current again",
			"reason", reason, "nodes", len(c.nodes))
	}
	c.drops.Add(1)
	c.epoch++
	clear(c.nodes)
	c.index = newIndex()
	c.tracking, c.complete, c.evicted = false, false, false
	clear(c.beats) // tombs stay: see buryLocked
	c.proofs = c.proofs[:0]
	c.current = time.Time{}
	c.since = time.Now()
}

// Notified implements watch.Follower: heartbeat flushes.
func (c *Cache) Notified(channel, payload string) {
	if channel != c.liveness {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	err := registry.ParseLiveness(payload, func(pk int64, seen time.Time) {
		if f := c.fills[pk]; f != nil && seen.After(f.lastSeen) {
			f.lastSeen = seen
		}
		if c.touched != nil {
			if t, ok := c.touched[pk]; !ok || !t.IsZero() && seen.After(t) {
				c.touched[pk] = seen
			}
		}
		n, ok := c.nodes[pk]
		switch {
		case !ok:
			c.noteBeatLocked(pk, seen, now)
		case n.LastSeen == nil || seen.After(*n.LastSeen):
			c.setLocked(pack(withLastSeen(*n, seen)))
		}
	})
	if err != nil {
		// Heartbeats were lost: cached last_seen could stay behind.
		c.dropLocked(err.Error())
	}
}

// Stats returns counts and the cache's state.
func (c *Cache) Stats() Stats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return Stats{Hits: c.hits.Load(), Misses: c.misses.Load(), Bypassed: c.bypassed.Load(),
		ListHits: c.listHits.Load(), ListMisses: c.listMisses.Load(), Drops: c.drops.Load(),
		Size: len(c.nodes), Serving: c.servingLocked(time.Now()), Complete: c.complete,
		AwaitsProved: c.awaitsProved.Load(), AwaitsBehind: c.awaitsBehind.Load()}
}

// Lister reads a page of nodes in pk order, after a pk. *store.Store's
// ListNodes does, through a closure.
type Lister func(ctx context.Context, after int64, limit int) ([]registry.Node, error)

// preloadBatch is how many nodes a preload reads at a time.
const preloadBatch = 1000 // the most ListNodes reads at once

// preloadPoll is how often a preload checks whether the cache serves.
const preloadPoll = 100 * time.Millisecond

// Preload fills the cache with the fleet, lowest pk first, up to its
// size, as kube-apiserver's watch cache lists before it watches: a
// long-running replica's reads are then hits from the start, not misses
// that fill it one by one. It waits until the cache serves (the feed is
// proven current), and starts again after every drop, until ctx ends.
//
// A page read from PostgreSQL may be older than what the feed delivers
// while it is read. So each page is read with the feed noting the pks it
// changes (touched); a noted pk is not installed (its next read fills it),
// and a heartbeat noted meanwhile is merged in. A page is installed only
// if no drop happened since its read began.
func (c *Cache) Preload(ctx context.Context, list Lister) {
	for ctx.Err() == nil {
		if !c.waitServing(ctx) {
			return
		}
		c.mu.RLock()
		epoch := c.epoch
		c.mu.RUnlock()
		if !c.preloadOnce(ctx, list) {
			// Cut short (the feed lapsed, a drop, an error): again.
			select {
			case <-ctx.Done():
			case <-time.After(preloadPoll):
			}
			continue
		}
		// Done: wait for the next drop (or the end).
		for ctx.Err() == nil {
			c.mu.RLock()
			again := c.epoch != epoch
			c.mu.RUnlock()
			if again {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(preloadPoll):
			}
		}
	}
}

// waitServing waits until the cache serves; false when ctx ended first.
func (c *Cache) waitServing(ctx context.Context) bool {
	for {
		c.mu.RLock()
		ok := c.servingLocked(time.Now())
		c.mu.RUnlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(preloadPoll):
		}
	}
}

// preloadOnce reads pages until the fleet is read or the cache is full
// (true), or until the feed lapses, a drop or an error cuts it short.
func (c *Cache) preloadOnce(ctx context.Context, list Lister) bool {
	start := time.Now()
	var after int64
	installed := 0
	c.mu.Lock()
	if !c.servingLocked(time.Now()) {
		c.mu.Unlock()
		return false // dropped or lapsed since waitServing: wait again
	}
	if !c.tracking {
		// From here on the feed installs what it brings; the pages
		// bring the rest.
		c.tracking, c.evicted = true, false
	}
	passEpoch := c.epoch
	c.mu.Unlock()
	whole := false
	for ctx.Err() == nil {
		c.mu.Lock()
		epoch, full := c.epoch, len(c.nodes) >= c.size
		if epoch != passEpoch {
			c.mu.Unlock()
			return false // dropped: tracking starts again with the next pass
		}
		if !full {
			c.touched = map[int64]time.Time{}
		}
		c.mu.Unlock()
		if full {
			break
		}
		page, err := list(ctx, after, preloadBatch)
		c.mu.Lock()
		touched := c.touched
		c.touched = nil
		if err != nil || epoch != c.epoch || !c.servingLocked(time.Now()) {
			c.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				c.logger.Warn("node cache: preload interrupted; it starts again", "err", err)
			}
			return false
		}
		for _, n := range page {
			if len(c.nodes) >= c.size {
				full = true
				break
			}
			seen, ok := touched[n.PK]
			switch {
			case ok && seen.IsZero():
				// Changed while read: the page may be older. Its
				// last_seen may still be newer than the feed's copy's
				// (heartbeats skip the feed); it only moves forward.
				if cur := c.nodes[n.PK]; cur != nil && n.LastSeen != nil && (cur.LastSeen == nil || n.LastSeen.After(*cur.LastSeen)) {
					c.setLocked(pack(withLastSeen(*cur, *n.LastSeen)))
				}
				continue
			case ok:
				n = withLastSeen(n, seen)
			}
			c.installLocked(n)
			installed++
		}
		c.filledAt = later(c.filledAt, time.Now())
		if len(page) < preloadBatch || full {
			// The whole fleet read: complete unless a node was left out
			// or evicted.
			whole = !full
			c.complete = whole && c.tracking && !c.evicted
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		after = page[len(page)-1].PK
	}
	c.logger.Info("node cache: preloaded", "nodes", installed, "whole_fleet", whole, "took", time.Since(start).Round(time.Millisecond))
	return ctx.Err() == nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
