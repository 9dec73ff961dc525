package nodecache

import (
	"context"

	"github.com/registryd/registryd/internal/registry"
)

// pauseAfterRead makes c's next read through its Loader call fn with the
// pk after the read returns and before the cache installs what it read:
// the window of the stale-fill race. fn runs once. Only GetNode is
// hooked: a Cache so hooked no longer sees its Loader as a PageLender.
func (c *Cache) pauseAfterRead(fn func(pk int64)) {
	c.load = &afterReadLoader{Loader: c.load, fn: fn}
}

// afterReadLoader is a Loader that runs fn after its first GetNode.
type afterReadLoader struct {
	Loader
	fn func(pk int64)
}

func (l *afterReadLoader) GetNode(ctx context.Context, pk int64) (registry.Node, error) {
	n, err := l.Loader.GetNode(ctx, pk)
	if fn := l.fn; fn != nil {
		l.fn = nil
		fn(pk)
	}
	return n, err
}

// Wrote applies nodes as changes, as an event would, without an event id:
// what the API's write-through did before consistent reads removed it
// (the cache now changes only through the feed and fills from
// PostgreSQL). Tests still use it to change the cache at a chosen moment.
func (c *Cache) Wrote(nodes ...registry.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range nodes {
		c.changeLocked(n, false)
	}
}

// Deleted applies the deletion of n as Wrote applies changes.
func (c *Cache) Deleted(n registry.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changeLocked(n, true)
}
