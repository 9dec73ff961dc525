// Package watch fans node change events out to watchers. Each replica runs
// one Hub: it listens for PostgreSQL notifications, takes its turn at
// sequencing committed changes into events, reads new events once and hands
// them to every subscriber. A subscriber that cannot keep up is cut off
// (its client resumes from the change log with Last-Event-ID) instead of
// holding back the others.
package watch

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// Store is the change log. *store.Store implements it.
type Store interface {
	SequenceEvents(ctx context.Context) (latest int64, err error)
	NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error)
	EventHorizon(ctx context.Context) (pruned, latest int64, err error)
	PruneEvents(ctx context.Context, before time.Time) (int64, error)
	Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error
}

// Channels the hub listens on; see store.ChangesChannel and EventsChannel.
type Channels struct {
	Changes, Events string
}

// Options tune a Hub.
type Options struct {
	Channels Channels
	// Retention is how long events stay resumable; default 24h.
	Retention time.Duration
	// Buffer is how many events a subscriber may lag behind before it is
	// cut off; default 1024.
	Buffer int
	// Poll is the fallback interval when notifications are lost; default 1s.
	Poll   time.Duration
	Logger *slog.Logger
}

// Hub is one replica's event fan-out.
type Hub struct {
	store Store
	opts  Options

	mu     sync.Mutex
	last   int64 // newest event delivered to subscribers
	subs   map[*Subscription]struct{}
	ready  chan struct{} // closed once last is known
	kick   chan struct{} // new changes were committed somewhere
	events chan struct{} // new events were stamped somewhere
}

// New returns a Hub; call Run.
func New(store Store, opts Options) *Hub {
	if opts.Retention <= 0 {
		opts.Retention = 24 * time.Hour
	}
	if opts.Buffer <= 0 {
		opts.Buffer = 1024
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{store: store, opts: opts, subs: map[*Subscription]struct{}{},
		ready: make(chan struct{}), kick: make(chan struct{}, 1), events: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run listens, sequences, fans out and prunes until ctx ends. Database
// failures are retried with backoff; subscribers keep their streams.
func (h *Hub) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { h.listen(ctx) })
	wg.Go(func() { h.sequence(ctx) })
	wg.Go(func() { h.fanOut(ctx) })
	wg.Wait()
	h.mu.Lock()
	for s := range h.subs {
		s.cut()
	}
	h.mu.Unlock()
}

func (h *Hub) listen(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := h.store.Listen(ctx, []string{h.opts.Channels.Changes, h.opts.Channels.Events}, func(ch, _ string) {
			backoff = 100 * time.Millisecond
			switch ch {
			case h.opts.Channels.Changes:
				signal(h.kick)
			case h.opts.Channels.Events:
				signal(h.events)
			default: // (re)connected: catch up on anything missed
				signal(h.kick)
				signal(h.events)
			}
		})
		if ctx.Err() != nil {
			return
		}
		h.opts.Logger.Warn("watch: lost the notification connection; reconnecting", "err", err, "in", backoff.String())
		sleep(ctx, backoff)
		backoff = min(backoff*2, 5*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// sequence stamps new changes, at most once per few milliseconds however
// many notifications arrive, and prunes old events now and then.
func (h *Hub) sequence(ctx context.Context) {
	tick := time.NewTicker(h.opts.Poll)
	defer tick.Stop()
	lastPrune := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-tick.C:
		}
		if _, err := h.store.SequenceEvents(ctx); err != nil {
			if ctx.Err() == nil {
				h.opts.Logger.Warn("watch: sequencing failed; will retry", "err", err)
			}
			continue
		}
		signal(h.events)
		if time.Since(lastPrune) > time.Minute {
			lastPrune = time.Now()
			if n, err := h.store.PruneEvents(ctx, time.Now().Add(-h.opts.Retention)); err != nil {
				h.opts.Logger.Warn("watch: pruning failed", "err", err)
			} else if n > 0 {
				h.opts.Logger.Info("watch: pruned old events", "events", n)
			}
		}
		sleep(ctx, 5*time.Millisecond) // coalesce bursts of commits into one pass
	}
}

// fanOut reads events newer than the last delivered and hands them out.
func (h *Hub) fanOut(ctx context.Context) {
	for ctx.Err() == nil {
		_, latest, err := h.store.EventHorizon(ctx)
		if err == nil {
			h.mu.Lock()
			h.last = latest
			h.mu.Unlock()
			close(h.ready)
			break
		}
		h.opts.Logger.Warn("watch: cannot read the event horizon; retrying", "err", err)
		sleep(ctx, time.Second)
	}
	tick := time.NewTicker(h.opts.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.events:
		case <-tick.C:
		}
		for ctx.Err() == nil {
			h.mu.Lock()
			after := h.last
			h.mu.Unlock()
			events, err := h.store.NodeEventsAfter(ctx, after, 500)
			if err != nil {
				if ctx.Err() == nil {
					h.opts.Logger.Warn("watch: reading events failed; will retry", "err", err)
				}
				break
			}
			if len(events) == 0 {
				break
			}
			h.broadcast(events)
		}
	}
}

func (h *Hub) broadcast(events []registry.NodeEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		for _, e := range events {
			select {
			case s.ch <- e:
			default:
				// Too slow: cut it off rather than wait or drop silently.
				s.cut()
				delete(h.subs, s)
			}
			if s.isCut() {
				break
			}
		}
	}
	h.last = events[len(events)-1].ID
}

// Subscription receives every event after the id Subscribe returned. Its
// done channel closes when the subscriber fell too far behind or the hub
// stopped: the stream must end and the client resume from its last id.
type Subscription struct {
	hub  *Hub
	ch   chan registry.NodeEvent
	done chan struct{}
	once sync.Once
}

func (s *Subscription) cut() { s.once.Do(func() { close(s.done) }) }

func (s *Subscription) isCut() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Close unsubscribes.
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	delete(s.hub.subs, s)
	s.hub.mu.Unlock()
	s.cut()
}

// ErrTooOld means a resume point lies before events retention pruned. It
// matches registry.ErrGone.
var ErrTooOld = registry.Errorf(registry.ErrGone, "the events after that id were removed by retention; re-list and watch from now")

// Subscribe starts a subscription. It returns its events (in id order), a
// channel closed when the subscriber is cut off, the id of the newest event
// it will not receive (the caller backfills (after, last] with Backfill
// when resuming), and a function that ends the subscription.
func (h *Hub) Subscribe(ctx context.Context) (events <-chan registry.NodeEvent, cut <-chan struct{}, last int64, cancel func(), err error) {
	select {
	case <-h.ready:
	case <-ctx.Done():
		return nil, nil, 0, nil, ctx.Err()
	}
	s := &Subscription{hub: h, ch: make(chan registry.NodeEvent, h.opts.Buffer), done: make(chan struct{})}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	last = h.last
	h.mu.Unlock()
	return s.ch, s.done, last, s.Close, nil
}

// Latest returns the newest event id in the change log, which may be ahead
// of what this hub has handed out yet.
func (h *Hub) Latest(ctx context.Context) (int64, error) {
	_, latest, err := h.store.EventHorizon(ctx)
	return latest, err
}

// Backfill calls fn for every event in (after, upto], in order, from the
// change log. ErrTooOld when retention already pruned some of them.
func (h *Hub) Backfill(ctx context.Context, after, upto int64, fn func(registry.NodeEvent) error) error {
	pruned, _, err := h.store.EventHorizon(ctx)
	if err != nil {
		return err
	}
	if after < pruned {
		return ErrTooOld
	}
	for after < upto {
		events, err := h.store.NodeEventsAfter(ctx, after, 500)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return nil
		}
		for _, e := range events {
			if e.ID > upto {
				return nil
			}
			if err := fn(e); err != nil {
				return err
			}
			after = e.ID
		}
	}
	return nil
}
