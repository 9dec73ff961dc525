package nodecache

import (
	"context"
	"slices"
	"time"

	"github.com/google/btree"

	"github.com/registryd/registryd/internal/registry"
)

// Lists are served from memory only while the cache holds the whole fleet
// (complete): a preload pass read every node, and since that pass began
// the feed has installed every node it brought, cached or not (tracking),
// and nothing was evicted. Pages come in pk order from two ordered sets of
// pks: every cached node, and the free ones (the page schedulers read all
// day). A list the cache cannot answer exactly reads PostgreSQL.

// maxExamined bounds the nodes one cached page looks at: a filter that
// matches few of them (one ip, one job) is what PostgreSQL's indexes are
// for.
const maxExamined = 20_000

// tombstoneAge is how long a deletion is remembered while tracking, so
// that a write of this replica that committed before it, applied late,
// does not bring the node back.
const tombstoneAge = time.Minute

// index is the cache's ordered view: the pks of every cached node and of
// the free ones.
type index struct {
	all, free *btree.BTreeG[int64]
}

func newIndex() index {
	less := func(a, b int64) bool { return a < b }
	return index{all: btree.NewG(32, less), free: btree.NewG(32, less)}
}

// setLocked caches n (packed) as node pk, keeping the index; c.mu held.
func (c *Cache) setLocked(n *registry.Node) {
	old, had := c.nodes[n.PK]
	c.nodes[n.PK] = n
	if !had {
		c.index.all.ReplaceOrInsert(n.PK)
	}
	wasFree, isFree := had && old.State == registry.StateFree, n.State == registry.StateFree
	switch {
	case isFree && !wasFree:
		c.index.free.ReplaceOrInsert(n.PK)
	case wasFree && !isFree:
		c.index.free.Delete(n.PK)
	}
}

// deleteLocked forgets node pk, keeping the index; c.mu held.
func (c *Cache) deleteLocked(pk int64) {
	if _, had := c.nodes[pk]; !had {
		return
	}
	delete(c.nodes, pk)
	c.index.all.Delete(pk)
	c.index.free.Delete(pk)
}

// buryLocked remembers for tombstoneAge that node pk was deleted, drops
// or not: a write of this replica applied late must not bring it back,
// whenever tracking starts; c.mu held.
func (c *Cache) buryLocked(pk int64, now time.Time) {
	if len(c.tombs) >= 4096 && now.Sub(c.tombsPruned) > time.Second {
		for pk, at := range c.tombs {
			if now.Sub(at) > tombstoneAge {
				delete(c.tombs, pk)
			}
		}
		c.tombsPruned = now
	}
	c.tombs[pk] = now
}

// beatAge is how long a heartbeat of a node not cached is kept while
// tracking, for the node's creation event to arrive and take it: the
// notification of a flush can come before the event that creates the
// node, which is sequenced after its commit.
const beatAge = 10 * time.Second

// noteBeatLocked keeps a heartbeat of node pk, not cached, while tracking;
// c.mu held.
func (c *Cache) noteBeatLocked(pk int64, seen, now time.Time) {
	if !c.tracking {
		return
	}
	if len(c.beats) >= 4096 && now.Sub(c.beatsPruned) > time.Second {
		for pk, b := range c.beats {
			if now.Sub(b.at) > beatAge {
				delete(c.beats, pk)
			}
		}
		c.beatsPruned = now
	}
	if b, ok := c.beats[pk]; !ok || seen.After(b.seen) {
		c.beats[pk] = beat{seen: seen, at: now}
	}
}

// beat is a heartbeat kept for a node not cached yet.
type beat struct{ seen, at time.Time }

// ListNodes returns the nodes matching f in pk order, as the Loader's
// ListNodes would: from memory when the cache serves and holds the whole
// fleet and can evaluate f, otherwise from PostgreSQL. A list from memory
// gives the consistency of a cached GetNode (docs/api.md, "Read consistency").
func (c *Cache) ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	nodes, _, err := c.ListNodesAt(ctx, f)
	return nodes, err
}

// ListNodesAt is ListNodes with the page's position. A page from memory is
// exact when every copy read from PostgreSQL has since been overtaken by
// a proof (filledAt): it shows the events up to delivered, no more. A
// page from PostgreSQL is at least at the events applied before it was
// read, and may show later changes.
func (c *Cache) ListNodesAt(ctx context.Context, f registry.NodeFilter) ([]registry.Node, registry.Position, error) {
	if err := f.Normalize(); err != nil {
		return nil, registry.Position{}, err
	}
	nodes, at, ok := c.listCached(f)
	if ok {
		c.listHits.Add(1)
		return nodes, at, nil
	}
	c.listMisses.Add(1)
	at = registry.Position{ID: c.Delivered()}
	if l, ok := c.load.(PageLender); ok {
		nodes, err := l.ListPage(ctx, f)
		return nodes, at, err
	}
	nodes, err := c.load.ListNodes(ctx, f)
	return nodes, at, err
}

// ListsFromMemory reports whether a list with filter f is answered from
// memory once the cache is current: the cache holds the whole fleet and
// evaluates f exactly as the store's SQL does.
func (c *Cache) ListsFromMemory(f registry.NodeFilter) bool {
	if !cachedFilter(f) {
		return false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.complete
}

// PageLender is a Loader that lends the pages it reads (as the store
// does): ListPage is ListNodes whose page's memory is reused once
// RecyclePage takes it back, which reports whether the page was one it
// lent. The cache reads its list misses with ListPage and gives every
// page back through Recycle.
type PageLender interface {
	ListPage(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error)
	RecyclePage(page []registry.Node) bool
}

// cachedFilter reports whether f is one the cache evaluates exactly as
// the store's SQL does: seen_within compares with the database's clock,
// and a list with no limit is a stream of pages read from PostgreSQL.
func cachedFilter(f registry.NodeFilter) bool {
	return f.SeenWithin == nil && f.Limit > 0
}

// pages hold the slices pages from memory are returned in, for reuse
// (Recycle), so that the pages schedulers read all day do not make the
// garbage collector run, marking the whole cache each time. A bounded free
// list, not a sync.Pool: pages read from PostgreSQL by a Loader that does
// not lend them are handed back too, and while the cache does not answer
// lists nothing takes them out again, so a pool would keep them all until
// the next collection (see docs/design.md).
var pages = make(chan []registry.Node, 64)

// maxRecycled bounds the pages kept for reuse, in nodes.
const maxRecycled = 1024

// Recycle takes back a page ListNodes returned, once its caller is done
// with it (nothing may use it after): its nodes are cleared and the slice
// is reused by a later page.
func (c *Cache) Recycle(page []registry.Node) {
	if l, ok := c.load.(PageLender); ok && l.RecyclePage(page) {
		return
	}
	if cap(page) == 0 || cap(page) > maxRecycled {
		return
	}
	page = page[:cap(page)]
	clear(page)
	select {
	case pages <- page[:0]:
	default: // enough kept
	}
}

// listCached is a page of f from memory and its position; false when the
// cache cannot answer it.
func (c *Cache) listCached(f registry.NodeFilter) ([]registry.Node, registry.Position, bool) {
	if !cachedFilter(f) {
		return nil, registry.Position{}, false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.complete || !c.servingLocked(time.Now()) {
		return nil, registry.Position{}, false
	}
	at := registry.Position{ID: c.delivered, Exact: c.current.After(c.filledAt)}
	var out []registry.Node
	select {
	case out = <-pages:
	default:
		out = make([]registry.Node, 0, min(f.Limit, 128))
	}
	if f.PK != nil {
		if n, ok := c.nodes[*f.PK]; ok && *f.PK > f.After && matches(f, n) {
			out = append(out, *n)
		}
		return out, at, true
	}
	set := c.index.all
	if onlyFree(f) {
		set = c.index.free
	}
	examined, whole := 0, true
	set.AscendGreaterOrEqual(f.After+1, func(pk int64) bool {
		if examined++; examined > maxExamined {
			whole = false
			return false
		}
		if n := c.nodes[pk]; matches(f, n) {
			out = append(out, *n)
		}
		return len(out) < f.Limit
	})
	return out, at, whole
}

// onlyFree reports whether f selects free nodes only.
func onlyFree(f registry.NodeFilter) bool {
	return f.Free != nil && *f.Free || len(f.State) > 0 && !slices.ContainsFunc(f.State, func(s registry.State) bool { return s != registry.StateFree })
}

// matches is the store's WHERE clause for f (store.query.where) in Go, for
// a cached node, whose State is current (the feed's documents carry it).
func matches(f registry.NodeFilter, n *registry.Node) bool {
	switch {
	case n.PK <= f.After:
		return false
	case f.Free != nil && *f.Free != (n.State == registry.StateFree):
		return false
	case len(f.State) > 0 && !slices.Contains(f.State, n.State):
		return false
	case f.Source != nil && *f.Source != n.Source:
		return false
	case f.CurrentJob != nil && (n.CurrentJob == nil || *n.CurrentJob != *f.CurrentJob):
		return false
	case f.HardwareGeneration != nil && (n.HardwareGeneration == nil || *n.HardwareGeneration != *f.HardwareGeneration):
		return false
	case f.MinGPUMem != nil && (n.GPUMem == nil || *n.GPUMem < *f.MinGPUMem):
		return false
	case f.MinCPUMem != nil && n.CPUMem < *f.MinCPUMem:
		return false
	case f.IP != nil && !registry.IPMatches(*f.IP, n.IP):
		return false
	case f.Index != nil && *f.Index != n.Index:
		return false
	case f.PK != nil && *f.PK != n.PK:
		return false
	case f.Fabric != nil && (n.Fabric == nil || *n.Fabric != *f.Fabric):
		return false
	case f.Owner != nil && (n.Owner == nil || *n.Owner != *f.Owner):
		return false
	case !f.Selector.Matches(n.Labels):
		return false
	}
	return true
}
