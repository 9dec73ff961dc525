package nodecache

import (
	"context"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A sequencing pass that began before a drop proves nothing after it,
// however its report reaches the cache: after the drop, or before it and
// waiting for events the feed delivers after. Until a pass that began
// after the drop is confirmed, reads go to PostgreSQL and fill nothing.
func TestPassBeforeDropProvesNothing(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n := createNode(t, st, "10.0.0.1")
	for _, tc := range []struct {
		name string
		// pass runs a pass that began at began, around a drop.
		pass func(c *Cache, began time.Time)
	}{
		{"reported after a gap", func(c *Cache, began time.Time) {
			c.Gap("test")
			c.Sequenced(began, 0)
		}},
		{"reported after the notification connection came back", func(c *Cache, began time.Time) {
			c.Listening(false)
			c.Listening(true)
			c.Sequenced(began, 0)
		}},
		{"waiting for its events across a gap", func(c *Cache, began time.Time) {
			c.Sequenced(began, 1)
			c.Gap("test")
			c.Apply([]registry.NodeEvent{{ID: 1, Kind: "updated", Node: n}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(st, Options{Size: 10, MaxStale: time.Hour})
			c.Start(0)
			c.Listening(true)
			c.Sequenced(time.Now(), 0)
			get(t, c, n.PK)
			if s := c.Stats(); !s.Serving || s.Size != 1 {
				t.Fatalf("%+v: want serving with the node cached before the drop", s)
			}
			tc.pass(c, time.Now())
			if s := c.Stats(); s.Serving {
				t.Fatalf("%+v: serving on a pass that began before the drop", s)
			}
			before := c.Stats()
			get(t, c, n.PK)
			get(t, c, n.PK)
			if s := c.Stats(); s.Hits != before.Hits || s.Bypassed != before.Bypassed+2 || s.Size != 0 {
				t.Fatalf("%+v (before the reads %+v): reads after the drop must go to PostgreSQL and fill nothing", s, before)
			}
			// A pass begun after the drop does prove the feed current
			// (at the position the cache reached: a feed behind it proves
			// nothing).
			c.mu.RLock()
			at := c.delivered
			c.mu.RUnlock()
			c.Sequenced(time.Now(), at)
			if s := c.Stats(); !s.Serving {
				t.Fatalf("%+v: not serving on a pass begun after the drop", s)
			}
		})
	}
}

// A deletion is remembered across a drop, so that a late write cannot
// bring the node back; but not across a new epoch of the feed, whose
// database may have lost the deletion or issued the pk again: the node
// the feed then brings is cached, or a complete cache would list a fleet
// without it.
func TestNewEpochForgetsDeletions(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n := createNode(t, st, "10.0.0.1")
	none := func(context.Context, int64, int) ([]registry.Node, error) { return nil, nil }
	for _, tc := range []struct {
		reason string
		want   int
	}{
		{"events were pruned before this replica read them", 0},
		{registry.NewEpochReason + ": a failover", 1},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			t.Parallel()
			c := New(st, Options{Size: 10, MaxStale: time.Hour})
			c.Start(0)
			c.Listening(true)
			c.Sequenced(time.Now(), 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go c.Preload(ctx, none)
			apitest.Eventually(t, 5*time.Second, "the cache is complete", func() bool { return c.Stats().Complete })
			c.Deleted(n)
			c.Gap(tc.reason)
			c.Sequenced(time.Now(), 0)
			apitest.Eventually(t, 5*time.Second, "the cache is complete again", func() bool { return c.Stats().Complete })
			c.Wrote(n)
			if s := c.Stats(); s.Size != tc.want {
				t.Fatalf("%+v: want %d node(s) cached after the change", s, tc.want)
			}
		})
	}
}

// A proof that comes between a drop and the hub's Start after it (the
// look-up read a new epoch's start, which no event brings) is confirmed
// by that Start: the cache serves again without waiting for an event.
func TestStartConfirmsProofs(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	c := New(st, Options{Size: 10, MaxStale: time.Hour})
	c.Start(5)
	c.Listening(true)
	c.Sequenced(time.Now(), 5)
	c.Gap(registry.NewEpochReason + ": a failover")
	const epochStart = 1 << 40
	c.Sequenced(time.Now(), epochStart)
	if s := c.Stats(); s.Serving {
		t.Fatalf("%+v: serving before the hub started in the new epoch", s)
	}
	c.Start(epochStart)
	if s := c.Stats(); !s.Serving {
		t.Fatalf("%+v: a proof at the epoch's start is not confirmed by the Start there", s)
	}
}
