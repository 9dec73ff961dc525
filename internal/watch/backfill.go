package watch

import (
	"container/list"
	"context"
	"sync"

	"github.com/registryd/registryd/internal/registry"
)

// page is the BackfillPage events after some id, encoded. Only full pages
// are kept: the events after an id never change once a full page of them
// is stamped (ids only grow in commit order), while a short page at the
// end of the log grows.
type page struct {
	after  int64
	events []*event
	bytes  int
}

// pageCache keeps recently read pages, least recently used out first,
// within a budget of encoded bytes.
type pageCache struct {
	mu      sync.Mutex
	budget  int
	size    int
	lru     list.List // *page, most recent first
	byAfter map[int64]*list.Element
}

func (c *pageCache) get(after int64) *page {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byAfter[after]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(e)
	return e.Value.(*page)
}

// put keeps p and returns it, or returns the same page another backfill
// kept meanwhile, so that both send the same bytes.
func (c *pageCache) put(p *page) *page {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byAfter[p.after]; ok {
		return e.Value.(*page)
	}
	if p.bytes > c.budget {
		return p
	}
	c.byAfter[p.after] = c.lru.PushFront(p)
	c.size += p.bytes
	for c.size > c.budget {
		old := c.lru.Remove(c.lru.Back()).(*page)
		delete(c.byAfter, old.after)
		c.size -= old.bytes
	}
	return p
}

// clear forgets every page.
func (c *pageCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.byAfter)
	c.size = 0
}

// query runs f, which reads the store for a backfill, once one of the
// BackfillConcurrency slots is free.
func (h *Hub) query(ctx context.Context, f func() error) error {
	select {
	case h.backfills <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-h.backfills }()
	return f()
}

// page returns the events after the id, encoded: from the cache, or read
// and encoded under a backfill slot. The query gives its connection back
// to the pool before page returns.
func (h *Hub) page(ctx context.Context, after int64) (*page, error) {
	if p := h.pages.get(after); p != nil {
		return p, nil
	}
	var p *page
	err := h.query(ctx, func() error {
		// Another backfill may have read it while this one waited.
		if p = h.pages.get(after); p != nil {
			return nil
		}
		events, err := h.store.NodeEventsAfter(ctx, after, h.opts.BackfillPage)
		if err != nil {
			return err
		}
		p = &page{after: after, events: make([]*event, len(events))}
		for i, e := range events {
			frame, err := h.opts.Encode(e)
			if err != nil {
				return err
			}
			p.events[i] = &event{NodeEvent: e, frame: frame}
			p.bytes += weight(e, frame)
		}
		if len(events) == h.opts.BackfillPage {
			p = h.pages.put(p)
		}
		return nil
	})
	return p, err
}

// Backfill calls fn for every event in (after, upto], in order, from the
// change log, with the event's encoding. It reads pages of BackfillPage
// events, each read and encoded under one of the BackfillConcurrency
// slots (or taken from the pages other backfills read recently), and
// calls fn only after the slot is free again, so a client that reads
// slowly holds neither a slot nor a connection. ErrOtherEpoch when after
// is of an earlier epoch of the feed; ErrTooOld when retention already
// pruned some of the events.
func (h *Hub) Backfill(ctx context.Context, after, upto int64, fn func(e registry.NodeEvent, frame []byte) error) error {
	var feed registry.Feed
	err := h.query(ctx, func() (err error) {
		feed, err = h.store.EventHorizon(ctx)
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case after < feed.Epoch:
		return ErrOtherEpoch
	case after < feed.Pruned:
		return ErrTooOld
	}
	for after < upto {
		p, err := h.page(ctx, after)
		if err != nil {
			return err
		}
		if len(p.events) == 0 {
			return nil
		}
		for _, e := range p.events {
			if e.ID > upto {
				return nil
			}
			if err := fn(e.NodeEvent, e.frame); err != nil {
				return err
			}
			after = e.ID
		}
	}
	return nil
}
