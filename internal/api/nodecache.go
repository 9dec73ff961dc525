package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/registryd/registryd/internal/registry"
)

// NodeCache serves reads of one node by pk from memory, kept current by
// the change feed and by this replica's own writes. *nodecache.Cache
// implements it; see docs/api.md, "Read consistency", for what a reader gets.
type NodeCache interface {
	// GetNode returns node pk, reading PostgreSQL when it must.
	GetNode(ctx context.Context, pk int64) (registry.Node, error)
	// ListNodes returns a page of nodes as Store.ListNodes does, from
	// memory when the cache holds the whole fleet.
	ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error)
	// Recycle takes back a page ListNodes returned, once it is written.
	Recycle(page []registry.Node)
	// Wrote and Deleted take what this replica's committed writes
	// returned, so that its own reads see them at once.
	Wrote(nodes ...registry.Node)
	Deleted(n registry.Node)
}

// strongRead reports whether the request asks to bypass the node cache
// (Cache-Control: no-cache, RFC 9111 §5.2.1.4): the node is read from
// PostgreSQL, as current as the database.
func strongRead(r *http.Request) bool {
	for _, v := range r.Header.Values("Cache-Control") {
		for part := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), "no-cache") {
				return true
			}
		}
	}
	return false
}

// readNode is node pk for GET and Node-Id: from the node cache, or from
// PostgreSQL when there is none or the client asks for a strong read.
func (s *Server) readNode(r *http.Request, pk int64) (registry.Node, error) {
	if s.nodes == nil || strongRead(r) {
		return s.store.GetNode(r.Context(), pk)
	}
	return s.nodes.GetNode(r.Context(), pk)
}

// listPage is a page of nodes for a list: from the node cache, or from
// PostgreSQL when there is none or the client asks for a strong read.
func (s *Server) listPage(r *http.Request, f registry.NodeFilter) ([]registry.Node, error) {
	if s.nodes == nil || strongRead(r) {
		return s.store.ListNodes(r.Context(), f)
	}
	return s.nodes.ListNodes(r.Context(), f)
}

// writeThrough is the Store with every committed node write handed to the
// node cache.
type writeThrough struct {
	Store
	nodes NodeCache
}

func (w writeThrough) CreateNode(ctx context.Context, a registry.Actor, spec registry.NodeSpec) (registry.Node, bool, error) {
	n, adopted, err := w.Store.CreateNode(ctx, a, spec)
	if err == nil {
		w.nodes.Wrote(n) // an adopted node changed owner
	}
	return n, adopted, err
}

func (w writeThrough) UpdateNode(ctx context.Context, a registry.Actor, pk int64, fn func(cur registry.Node) (registry.NodeSpec, error)) (registry.Node, error) {
	n, err := w.Store.UpdateNode(ctx, a, pk, fn)
	if err == nil {
		w.nodes.Wrote(n)
	}
	return n, err
}

func (w writeThrough) DeleteNode(ctx context.Context, a registry.Actor, pk int64, force bool, check func(cur registry.Node) error) (registry.Node, error) {
	n, err := w.Store.DeleteNode(ctx, a, pk, force, check)
	if err == nil {
		w.nodes.Deleted(n)
	}
	return n, err
}

func (w writeThrough) ClaimNodes(ctx context.Context, a registry.Actor, c registry.Claim) ([]registry.Node, error) {
	nodes, err := w.Store.ClaimNodes(ctx, a, c)
	w.nodes.Wrote(nodes...)
	return nodes, err
}

func (w writeThrough) ReleaseNodes(ctx context.Context, a registry.Actor, r registry.Release) ([]registry.Node, []registry.NotReleased, error) {
	nodes, not, err := w.Store.ReleaseNodes(ctx, a, r)
	w.nodes.Wrote(nodes...)
	return nodes, not, err
}

func (w writeThrough) RenewLeases(ctx context.Context, a registry.Actor, r registry.Renewal) ([]registry.Node, error) {
	nodes, err := w.Store.RenewLeases(ctx, a, r)
	w.nodes.Wrote(nodes...)
	return nodes, err
}

func (w writeThrough) CordonNodes(ctx context.Context, a registry.Actor, c registry.Cordon) ([]registry.Node, []registry.NotDone, error) {
	nodes, not, err := w.Store.CordonNodes(ctx, a, c)
	w.nodes.Wrote(nodes...)
	return nodes, not, err
}

func (w writeThrough) UncordonNodes(ctx context.Context, a registry.Actor, u registry.Uncordon) ([]registry.Node, []registry.NotDone, error) {
	nodes, not, err := w.Store.UncordonNodes(ctx, a, u)
	w.nodes.Wrote(nodes...)
	return nodes, not, err
}
