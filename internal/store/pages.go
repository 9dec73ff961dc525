package store

import (
	"context"
	"sync"
	"unsafe"

	"github.com/registryd/registryd/internal/registry"
)

// Pages of nodes read from PostgreSQL are lent, their memory reused once
// the caller is done with them (ListPage, RecyclePage); why: docs/design.md.

// pageBuf is the memory of one lent page: its nodes, and what their
// pointer fields point at.
type pageBuf struct {
	nodes    []registry.Node
	backings []nodeBacking
	used     int // nodes (and so at most backings) the last page filled
}

const (
	maxLentPage = 1000 // the largest page lent; larger ones are ListNodes'
	maxLent     = 256  // pages out at once that are tracked
	maxKept     = 64   // pages kept for reuse
)

// pageLender lends pages and keeps those given back.
type pageLender struct {
	kept chan *pageBuf
	mu   sync.Mutex
	// lent maps each page out to its memory, by its first element. A page
	// never given back stays here until more than maxLent are out; then
	// all are forgotten (given back later, they are not taken: RecyclePage
	// says so, and the caller treats them as any page not lent), so a
	// caller that keeps one costs no more than that.
	lent map[*registry.Node]*pageBuf
}

func newPageLender() *pageLender {
	return &pageLender{kept: make(chan *pageBuf, maxKept), lent: map[*registry.Node]*pageBuf{}}
}

// ListPage is ListNodes for a caller that gives the page back with
// RecyclePage once done with it: the page's memory (its nodes and what
// their pointer fields point at, not their strings) is then reused for
// another page, so nothing may use the page or its nodes' pointer fields
// after that. A page RecyclePage is never given is the caller's, as one of
// ListNodes.
func (s *Store) ListPage(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	if s.pages == nil || f.Limit <= 0 || f.Limit > maxLentPage {
		return s.ListNodes(ctx, f)
	}
	var buf *pageBuf
	select {
	case buf = <-s.pages.kept:
		if cap(buf.nodes) < f.Limit {
			buf = nil
		}
	default:
	}
	if buf == nil {
		buf = &pageBuf{nodes: make([]registry.Node, 0, f.Limit), backings: make([]nodeBacking, f.Limit)}
	}
	nodes, err := s.listInto(ctx, f, buf.nodes[:0], buf.backings)
	if err != nil {
		buf.used = cap(buf.nodes) // what a failed read filled is not known
		s.pages.keep(buf)
		return nil, err
	}
	if unsafe.SliceData(nodes) != unsafe.SliceData(buf.nodes) {
		return nodes, nil // outgrew the buffer (cannot, with its LIMIT): the caller's
	}
	buf.used = len(nodes)
	s.pages.mu.Lock()
	if len(s.pages.lent) >= maxLent {
		clear(s.pages.lent)
	}
	s.pages.lent[unsafe.SliceData(nodes)] = buf
	s.pages.mu.Unlock()
	return nodes, nil
}

// RecyclePage takes back a page ListPage lent, and reports whether it was
// one; nothing may use the page after. A page is given back once: given
// back twice, it could be another caller's by then.
func (s *Store) RecyclePage(page []registry.Node) bool {
	if s.pages == nil || cap(page) == 0 {
		return false
	}
	key := unsafe.SliceData(page)
	s.pages.mu.Lock()
	buf, ok := s.pages.lent[key]
	delete(s.pages.lent, key)
	s.pages.mu.Unlock()
	if ok {
		s.pages.keep(buf)
	}
	return ok
}

// keep clears what buf's last page filled (it then points at nothing)
// and keeps it for reuse, unless enough are kept.
func (l *pageLender) keep(buf *pageBuf) {
	clear(buf.nodes[:buf.used])
	clear(buf.backings[:min(buf.used, len(buf.backings))])
	buf.used = 0
	select {
	case l.kept <- buf:
	default:
	}
}
