package client

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"
)

// Informer keeps a local view of every node, current to a known position
// of the change feed: it lists the fleet at a position
// (ListNodesWithPosition), watches from that position, applies each event
// to its view, and lists again whenever the watch says it must (a reset:
// events lost to retention or a failover, or a new feed epoch). Its view
// is always one the registry was in: the list at its position, then the
// events after it in order (an event older, by the node's version, than
// what a list read from PostgreSQL already showed is skipped).
//
// Run it in a goroutine; read its view from any number of goroutines.
type Informer struct {
	c *Client
	o InformerOptions

	// progress says the current watch applied something after its list;
	// only Run's goroutine uses it.
	progress bool

	mu     sync.RWMutex // guards nodes and pos, written only by Run's goroutine
	nodes  map[int64]Node
	pos    int64
	synced chan struct{}
	once   sync.Once
}

// InformerOptions configures an Informer. The zero value is ready.
type InformerOptions struct {
	// Handler, if set, is called after each change of the view, from
	// Run's goroutine and without the view's lock held (it may read the
	// view). It must not block for long: the watch waits for it.
	Handler func(InformerUpdate)
	// Reconnect and IdleTimeout are the watch's (see WatchOptions).
	Reconnect   time.Duration
	IdleTimeout time.Duration
}

// InformerUpdate is one change of an Informer's view.
type InformerUpdate struct {
	// Listed is true when a list replaced the whole view: on start, and
	// after every reset. Event is then nil.
	Listed bool
	// Event is the node event applied: for EventDeleted its node left
	// the view, for EventRenewed the leases of its nodes in the view
	// moved, otherwise its node is now in it as the event carries it.
	Event *Event
	// EventID is the view's position after the change.
	EventID int64
}

// NewInformer returns an informer of the nodes c serves. It does nothing
// until Run.
func NewInformer(c *Client, o InformerOptions) *Informer {
	return &Informer{c: c, o: o, nodes: map[int64]Node{}, pos: -1, synced: make(chan struct{})}
}

// errRelist ends a watch whose events can no longer be applied.
var errRelist = errors.New("client: informer: re-list")

// Run lists and watches until ctx ends (it returns ctx.Err()) or the
// server refuses in a way retrying cannot cure (an *Error such as 401 or
// 403, or ErrNoPosition from a server that gives lists no position).
// While the server is unreachable or overloaded it keeps trying, backing
// off as Watch does. The view stays as it was while Run is away. Call
// Run once per Informer.
func (in *Informer) Run(ctx context.Context) error {
	failures := 0
	for {
		err := in.list(ctx)
		if err == nil {
			in.progress = false
			err = in.c.Watch(ctx, WatchOptions{After: Ptr(in.Position()), Reconnect: in.o.Reconnect, IdleTimeout: in.o.IdleTimeout}, in.apply)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wait time.Duration
		switch {
		case errors.Is(err, errRelist) && in.progress:
			failures = 0
			continue
		case errors.Is(err, errRelist):
			// A reset at once after a list: the registry is settling (a
			// failover), so back off before listing again.
		default:
			var ok bool
			if wait, ok = transient(err); !ok {
				return err
			}
		}
		failures++
		if err := sleep(ctx, max(wait, in.c.retry.backoff(failures))); err != nil {
			return err
		}
	}
}

// list replaces the view with a consistent list of every node.
func (in *Informer) list(ctx context.Context) error {
	l, err := in.c.ListNodesWithPosition(ctx, NodeFilter{})
	if err != nil {
		return err
	}
	nodes := make(map[int64]Node, len(l.Nodes))
	for _, n := range l.Nodes {
		nodes[n.PK] = n
	}
	in.mu.Lock()
	in.nodes, in.pos = nodes, l.EventID
	in.mu.Unlock()
	in.once.Do(func() { close(in.synced) })
	in.notify(InformerUpdate{Listed: true, EventID: l.EventID})
	return nil
}

// apply takes one event of the watch into the view.
func (in *Informer) apply(ev Event) error {
	switch {
	case ev.Reset != nil:
		return errRelist
	case ev.ID < in.pos || (ev.Node != nil || ev.Renewal != nil) && ev.ID == in.pos:
		// The feed went backwards, which a reset should have said: what
		// the view holds can no longer be trusted.
		return errRelist
	case ev.Node != nil:
		n := ev.Node.Node
		in.mu.Lock()
		old, had := in.nodes[n.PK]
		// A list read from PostgreSQL may already show changes after its
		// position: a change not newer than the node the view holds is
		// one (every change moves the version; 0 is a server without). A
		// deletion carries the last version and always applies.
		deleted := ev.Node.Kind == EventDeleted
		stale := !deleted && had && n.Version > 0 && n.Version <= old.Version
		switch {
		case stale:
		case deleted:
			delete(in.nodes, n.PK)
		default:
			in.nodes[n.PK] = n
		}
		in.pos = ev.ID
		in.mu.Unlock()
		in.progress = true
		if !stale {
			in.notify(InformerUpdate{Event: &ev, EventID: ev.ID})
		}
	case ev.Renewal != nil:
		// Moves the lease of nodes in the view; a node the view does not
		// hold (deleted since, or outside the informer's interest) stays
		// out, and a node already at or past the version is left alone.
		r := ev.Renewal
		changed := false
		in.mu.Lock()
		for _, v := range r.Nodes {
			n, had := in.nodes[v.PK]
			if !had || n.Version > 0 && v.Version <= n.Version {
				continue
			}
			lease := r.LeaseExpiresAt
			n.LeaseExpiresAt, n.UpdatedAt, n.Version = &lease, r.At, v.Version
			in.nodes[v.PK] = n
			changed = true
		}
		in.pos = ev.ID
		in.mu.Unlock()
		in.progress = true
		if changed {
			in.notify(InformerUpdate{Event: &ev, EventID: ev.ID})
		}
	case ev.Bookmark != nil:
		// A position, not progress: a reset right after a stream's
		// opening bookmark still backs off before the next list.
		in.mu.Lock()
		in.pos = ev.ID
		in.mu.Unlock()
	}
	return nil
}

func (in *Informer) notify(u InformerUpdate) {
	if in.o.Handler != nil {
		in.o.Handler(u)
	}
}

// Synced is closed once the first list is in the view.
func (in *Informer) Synced() <-chan struct{} { return in.synced }

// Position is the view's position in the change feed: it reflects every
// event up to this id, none after; -1 before the first list.
func (in *Informer) Position() int64 {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.pos
}

// Get returns node pk as the view holds it.
func (in *Informer) Get(pk int64) (Node, bool) {
	in.mu.RLock()
	defer in.mu.RUnlock()
	n, ok := in.nodes[pk]
	return n, ok
}

// Nodes returns the view, by pk, and its position. The nodes are copies,
// but their pointer members are shared with the view: read them, do not
// change them.
func (in *Informer) Nodes() ([]Node, int64) {
	in.mu.RLock()
	defer in.mu.RUnlock()
	out := make([]Node, 0, len(in.nodes))
	for _, pk := range slices.Sorted(maps.Keys(in.nodes)) {
		out = append(out, in.nodes[pk])
	}
	return out, in.pos
}
