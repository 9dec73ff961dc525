package api

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// NodeCache serves reads of nodes from memory, kept current by the change
// feed alone (and fills from PostgreSQL). *nodecache.Cache implements it;
// see docs/api.md, "Read consistency", for what a reader gets.
//
// There is no write-through: this replica's writes reach the cache through
// the feed like any other replica's. A copy installed from a write's
// result would show a change whose event the cache has not applied, so a
// list from memory could no longer say exactly where in the feed it stands
// (X-Event-Id), and a watch from there would repeat the change. A reader
// loses nothing by it: a consistent read waits for the feed to bring every
// write acknowledged before it arrived, this replica's included.
type NodeCache interface {
	// GetNode returns node pk, reading PostgreSQL when it must.
	GetNode(ctx context.Context, pk int64) (registry.Node, error)
	// ListNodesAt returns a page of nodes as Store.ListNodes does, from
	// memory when the cache holds the whole fleet, and where in the
	// change feed the page stands.
	ListNodesAt(ctx context.Context, f registry.NodeFilter) ([]registry.Node, registry.Position, error)
	// Recycle takes back a page ListNodesAt returned, once it is written.
	Recycle(page []registry.Node)
	// Await waits until the cache has applied every change committed
	// before since; false when ctx ended first.
	Await(ctx context.Context, since time.Time) bool
	// Proven reports, without waiting, whether the cache has applied
	// every change committed before since.
	Proven(since time.Time) bool
	// ListsFromMemory reports whether a list with filter f would be
	// answered from memory (the cache holds the whole fleet and can
	// evaluate f) once the cache is current: when not, a list goes to
	// PostgreSQL, and waiting for the cache would only delay it.
	ListsFromMemory(f registry.NodeFilter) bool
}

// Read freshness a request asks for with Cache-Control (RFC 9111 §5.2.1).
type freshness int

const (
	// consistent (the default): the read reflects every write any
	// replica acknowledged before it arrived.
	consistent freshness = iota
	// bounded (max-stale): the read may miss writes acknowledged up to
	// the staleness asked for (at most MaxStale) before it arrived.
	bounded
	// strong (no-cache): the read goes to PostgreSQL.
	strong
)

// MaxStale is the most staleness Cache-Control: max-stale buys: a bare
// max-stale, or a larger value, means this much.
const MaxStale = 2 * time.Second

// awaitBound is how long a consistent read waits for the node cache to
// prove itself current before it reads PostgreSQL instead.
const awaitBound = time.Second

// readFreshness is the freshness r asks for and, for bounded, how stale.
// Directives are case-insensitive and may come in one header or several;
// no-cache wins over max-stale, and a max-stale whose value is not a
// number of seconds (or is 0) asks for nothing.
func readFreshness(r *http.Request) (freshness, time.Duration) {
	mode, stale := consistent, time.Duration(0)
	for _, v := range r.Header.Values("Cache-Control") {
		for part := range strings.SplitSeq(v, ",") {
			name, arg, hasArg := strings.Cut(strings.TrimSpace(part), "=")
			name = strings.TrimSpace(name)
			switch {
			case strings.EqualFold(name, "no-cache"):
				return strong, 0
			case strings.EqualFold(name, "max-stale"):
				d := MaxStale
				if hasArg {
					digits := strings.Trim(strings.TrimSpace(arg), `"`)
					n, err := strconv.ParseUint(digits, 10, 63)
					if errors.Is(err, strconv.ErrRange) && strings.Trim(digits, "0123456789") == "" {
						n, err = math.MaxInt64, nil // digits beyond int64: more than the cap
					}
					if err != nil || n == 0 {
						continue
					}
					if n < uint64(MaxStale/time.Second) {
						d = time.Duration(n) * time.Second
					}
				}
				mode, stale = bounded, max(stale, d)
			}
		}
	}
	return mode, stale
}

// cacheMayServe reports whether the node cache may answer r, which
// arrived at (or before) arrival: it is current as r asks (waiting for
// proof for a consistent read, up to awaitBound). False: read PostgreSQL.
func (s *Server) cacheMayServe(r *http.Request, arrival time.Time) bool {
	if s.nodes == nil {
		return false
	}
	switch mode, stale := readFreshness(r); mode {
	case strong:
		return false
	case bounded:
		return s.nodes.Proven(arrival.Add(-stale))
	}
	return s.awaitCache(r, arrival)
}

// awaitCache waits, up to awaitBound, for the node cache to prove itself
// current as of arrival: a consistent read may then be served from it.
// Once a wait has run out, the cache is behind (working through an
// import's million changes, or a mass release): reads then wait only
// behindProbe, which asks for a proof as every wait does, and go to
// PostgreSQL when it fails, until one proves the cache current again.
// Without that, every consistent read waited the whole second for 20 s
// and more after a million-node import.
func (s *Server) awaitCache(r *http.Request, arrival time.Time) bool {
	bound, behind := awaitBound, s.cacheBehind.Load()
	if behind {
		bound = behindProbe
	}
	ctx, cancel := context.WithTimeout(r.Context(), bound)
	defer cancel()
	ok := s.nodes.Await(ctx, arrival)
	switch {
	case ok && behind:
		s.cacheBehind.Store(false)
	case !ok && !behind && r.Context().Err() == nil:
		s.cacheBehind.Store(true)
	}
	return ok
}

// behindProbe is how long a consistent read waits for a node cache known
// to be behind: long enough for a current cache to prove itself (a
// millisecond or two), short enough not to matter while it is not.
const behindProbe = 10 * time.Millisecond

// readNodeConsistent is node pk by a consistent read, whatever the
// request's Cache-Control asks.
func (s *Server) readNodeConsistent(r *http.Request, pk int64) (registry.Node, error) {
	if s.nodes != nil && s.awaitCache(r, time.Now()) {
		return s.nodes.GetNode(r.Context(), pk)
	}
	return s.store.GetNode(r.Context(), pk)
}

// readNode is node pk for GET, HEAD and Node-Id, as fresh as the request
// asks (see readFreshness): from the node cache when it may answer,
// otherwise from PostgreSQL.
func (s *Server) readNode(r *http.Request, pk int64) (registry.Node, error) {
	if !s.cacheMayServe(r, time.Now()) {
		return s.store.GetNode(r.Context(), pk)
	}
	return s.nodes.GetNode(r.Context(), pk)
}

// pageReader reads the pages of one list, as fresh as the request asks:
// from the node cache when it may answer, otherwise from PostgreSQL.
type pageReader struct {
	s      *Server
	r      *http.Request
	cached bool
	// at is where the list stands in the change feed, set by its first
	// page when known.
	at    registry.Position
	known bool
	pages int
}

// listReader decides, once per list of filter f, where its pages come
// from. A list the cache could not answer from memory anyway reads
// PostgreSQL at once: it never waits for the cache to prove itself
// current (up to awaitBound), which after an import or a mass release,
// while the cache works through the changes, cost every list a second.
func (s *Server) listReader(r *http.Request, f registry.NodeFilter) *pageReader {
	arrival := time.Now()
	cached := s.nodes != nil && s.nodes.ListsFromMemory(f) && s.cacheMayServe(r, arrival)
	return &pageReader{s: s, r: r, cached: cached}
}

// page reads the next page. The list's position is its first page's: from
// memory, exactly the events that page shows (when nothing in the cache
// is ahead of the feed); from PostgreSQL, a lower bound read before the
// page: every event up to it is in the list, later changes may be too.
// Later pages may show later changes, so a list of several pages is at
// least at its position, never exactly.
func (p *pageReader) page(f registry.NodeFilter) ([]registry.Node, error) {
	ctx := p.r.Context()
	p.pages++
	first := p.pages == 1
	if p.cached {
		nodes, at, err := p.s.nodes.ListNodesAt(ctx, f)
		if first {
			p.at, p.known = at, true
		}
		return nodes, err
	}
	if first && p.s.events != nil {
		latest, err := p.s.events.Latest(ctx)
		if err != nil {
			return nil, err
		}
		p.at, p.known = registry.Position{ID: latest}, true
	}
	return p.s.store.ListNodes(ctx, f)
}

// setPosition writes the list's X-Event-Id header, when known.
func (p *pageReader) setPosition(h http.Header) {
	if p.known {
		h.Set("X-Event-Id", strconv.FormatInt(p.at.ID, 10))
	}
}
