// Package watch fans node change events out to watchers. Each replica runs
// one Hub: it listens for PostgreSQL notifications, takes its turn at
// sequencing committed changes into events, reads new events once, encodes
// each once and shares the bytes among every subscriber.
//
// Everything a watcher can make the hub hold is bounded: the number of
// subscriptions (in total and per principal), how far behind a subscriber
// may fall (in bytes of encoded events; beyond that it is cut off and its
// client resumes from the change log with Last-Event-ID) and how many
// backfills read the change log at once (so that a crowd of resuming
// watchers leaves the database pool, and the CPUs, to normal traffic).
// Resuming watchers share the pages they read: a crowd resuming from the
// same id costs one query and one encoding per page.
package watch

import (
	"container/list"
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// Store is the change log. *store.Store implements it.
type Store interface {
	// SequenceEvents stamps committed changes; seen is the highest id
	// this hub has seen (the store begins a new epoch if it is ahead of
	// the database).
	SequenceEvents(ctx context.Context, seen int64) (registry.Feed, error)
	NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error)
	EventHorizon(ctx context.Context) (registry.Feed, error)
	PruneEvents(ctx context.Context, before time.Time) (int64, error)
	// FeedPosition is the feed's position for a consistent read's proof;
	// seen as for SequenceEvents (a database behind it answers pending).
	FeedPosition(ctx context.Context, seen int64) (latest int64, pending bool, err error)
	Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error
}

// Channels the hub listens on; see store.ChangesChannel and EventsChannel.
type Channels struct {
	Changes, Events string
}

// Options tune a Hub.
type Options struct {
	Channels Channels
	// Encode turns an event into the bytes a watcher is sent. Required.
	// The hub calls it once per live event and shares the result, read
	// only, among every subscriber.
	Encode func(registry.NodeEvent) ([]byte, error)
	// Retention is how long events stay resumable; default 24h.
	Retention time.Duration
	// MaxPending is how many bytes of encoded events a subscriber may have
	// not yet taken before it is cut off; default 1 MiB. A renewed event
	// counts the nodes it holds as well (see weight).
	MaxPending int
	// MaxStreams caps the subscriptions of this hub; default 1000.
	MaxStreams int
	// MaxPerPrincipal caps the subscriptions of one principal; default 64.
	MaxPerPrincipal int
	// BackfillConcurrency is how many backfills may query the store (and
	// encode what they read) at once; default 1.
	BackfillConcurrency int
	// BackfillPage is how many events a backfill reads per query; default
	// 100. The connection goes back to the pool between pages.
	BackfillPage int
	// Poll is the fallback interval when notifications are lost; default 1s.
	Poll   time.Duration
	Logger *slog.Logger
	// Follower, when set, follows the change feed from the hub's own
	// goroutines (internal/nodecache does), and gets the notifications of
	// FollowChannels on the hub's connection.
	Follower       Follower
	FollowChannels []string
}

// Follower keeps something current from the change feed: every event in
// order, proof of how current the feed is, and word of every gap. Its
// methods run on the hub's goroutines and must be quick.
type Follower interface {
	// Start: from now on the hub delivers every event after last.
	Start(last int64)
	// Apply gets events after the previous ones, in order, each once.
	Apply(events []registry.NodeEvent)
	// Sequenced: every change committed before at has an event id of at
	// most latest (a sequencing pass started at at and saw them all).
	Sequenced(at time.Time, latest int64)
	// Listening reports the notification connection: up (LISTEN is in
	// place; notifications from now on arrive) or down (some may be lost).
	Listening(up bool)
	// Gap: events may have been missed (pruned before the hub read them,
	// or the hub stopped), or, when the feed began a new epoch, what the
	// follower applied may be lost (a failover, a restore). A Start
	// follows when the hub goes on.
	Gap(reason string)
	// Notified gets a notification on one of Options.FollowChannels.
	Notified(channel, payload string)
}

type noFollower struct{}

func (noFollower) Start(int64)                {}
func (noFollower) Apply([]registry.NodeEvent) {}
func (noFollower) Sequenced(time.Time, int64) {}
func (noFollower) Listening(bool)             {}
func (noFollower) Gap(string)                 {}
func (noFollower) Notified(string, string)    {}

// Defaults of Options.
const (
	DefaultMaxPending      = 1 << 20
	DefaultMaxStreams      = 1000
	DefaultMaxPerPrincipal = 64
	DefaultBackfillPage    = 100
)

// event is one live event, encoded once and shared by every subscriber.
type event struct {
	registry.NodeEvent
	frame []byte
	end   int64 // the hub's byte offset after this event
}

// Hub is one replica's event fan-out.
type Hub struct {
	store     Store
	opts      Options
	backfills chan struct{} // semaphore of backfill queries
	pages     pageCache     // recent backfill pages, encoded

	// mu guards what follows; subscribers taking events share it for
	// reading, so thousands of them woken at once do not queue.
	mu    sync.RWMutex
	last  int64 // newest event delivered to subscribers
	epoch int64 // the feed's epoch (registry.Feed.Epoch) last follows
	// newEpoch, when above epoch, is an epoch the sequencer found and
	// fanOut has yet to reset to; newEpochWhy says why it began.
	newEpoch    int64
	newEpochWhy string
	// head counts the bytes of every encoded event broadcast so far;
	// a subscriber's lag is head minus its position.
	head int64
	// window holds the recent events that a subscriber not yet cut off
	// may still need: those ending within MaxPending of head.
	window      []*event
	subs        map[*Subscription]struct{} // not cut off
	streams     int                        // open subscriptions, cut off or not
	byPrincipal map[string]int
	stopped     bool
	ready       chan struct{} // closed once last is known
	kick        chan struct{} // new changes were committed somewhere
	events      chan struct{} // new events were stamped somewhere

	prover prover // look-ups of the feed's position (Prove)
}

// New returns a Hub; call Run. It panics without Options.Encode.
func New(store Store, opts Options) *Hub {
	if opts.Encode == nil {
		panic("watch: Options.Encode is required")
	}
	if opts.Retention <= 0 {
		opts.Retention = 24 * time.Hour
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxPerPrincipal <= 0 {
		opts.MaxPerPrincipal = DefaultMaxPerPrincipal
	}
	if opts.BackfillConcurrency <= 0 {
		opts.BackfillConcurrency = 1
	}
	if opts.BackfillPage <= 0 {
		opts.BackfillPage = DefaultBackfillPage
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Follower == nil {
		opts.Follower = noFollower{}
	}
	return &Hub{store: store, opts: opts, backfills: make(chan struct{}, opts.BackfillConcurrency),
		pages: pageCache{budget: opts.MaxPending, byAfter: map[int64]*list.Element{}},
		subs:  map[*Subscription]struct{}{}, byPrincipal: map[string]int{},
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
	h.setProving(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { h.listen(ctx) })
	wg.Go(func() { h.sequence(ctx) })
	wg.Go(func() { h.fanOut(ctx) })
	wg.Wait()
	h.setProving(nil)
	h.opts.Follower.Gap(registry.HubStoppedReason)
	h.mu.Lock()
	h.stopped = true
	for s := range h.subs {
		s.cut()
		delete(h.subs, s)
	}
	h.mu.Unlock()
}

func (h *Hub) listen(ctx context.Context) {
	lifecycle.Retry(ctx, lifecycle.Backoff{}, h.opts.Logger, "watch: lost the notification connection; reconnecting",
		func(ctx context.Context, alive func()) error {
			channels := append([]string{h.opts.Channels.Changes, h.opts.Channels.Events}, h.opts.FollowChannels...)
			err := h.store.Listen(ctx, channels, func(ch, payload string) {
				alive()
				switch ch {
				case h.opts.Channels.Changes:
					signal(h.kick)
				case h.opts.Channels.Events:
					signal(h.events)
				case "": // (re)connected: catch up on anything missed
					h.opts.Follower.Listening(true)
					signal(h.kick)
					signal(h.events)
				default:
					h.opts.Follower.Notified(ch, payload)
				}
			})
			// Notifications sent while the connection was down are lost;
			// at a stop, that is no fault.
			if ctx.Err() != nil {
				// Dropped quietly first; then down, which finds nothing
				// left to warn about.
				h.opts.Follower.Gap(registry.HubStoppedReason)
			}
			h.opts.Follower.Listening(false)
			return err
		})
}

// sequence stamps new changes, at most once per few milliseconds however
// many notifications arrive, and prunes old events now and then.
func (h *Hub) sequence(ctx context.Context) {
	tick := time.NewTicker(h.opts.Poll)
	defer tick.Stop()
	lastPrune := time.Time{}
	select { // the epoch a pass answers is compared with fanOut's first
	case <-h.ready:
	case <-ctx.Done():
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-tick.C:
		}
		at := time.Now()
		h.mu.RLock()
		seen, epoch := h.last, h.epoch
		h.mu.RUnlock()
		feed, err := h.store.SequenceEvents(ctx, seen)
		if err != nil {
			if ctx.Err() == nil {
				h.opts.Logger.Warn("watch: sequencing failed; will retry", "err", err)
			}
			continue
		}
		if feed.Epoch > epoch {
			// fanOut resets: it alone tells the follower of events.
			why := feed.NewEpoch
			if why == "" {
				why = "another replica found it"
			}
			h.mu.Lock()
			if feed.Epoch > h.newEpoch {
				h.newEpoch, h.newEpochWhy = feed.Epoch, why
			}
			h.mu.Unlock()
		} else {
			h.opts.Follower.Sequenced(at, feed.Latest)
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
		lifecycle.Sleep(ctx, 5*time.Millisecond) // coalesce bursts of commits into one pass
	}
}

// fanOut reads events newer than the last delivered and hands them out.
func (h *Hub) fanOut(ctx context.Context) {
	for ctx.Err() == nil {
		feed, err := h.store.EventHorizon(ctx)
		if err == nil {
			h.mu.Lock()
			h.last, h.epoch = feed.Latest, feed.Epoch
			h.mu.Unlock()
			h.opts.Follower.Start(feed.Latest)
			close(h.ready)
			break
		}
		h.opts.Logger.Warn("watch: cannot read the event horizon; retrying", "err", err)
		lifecycle.Sleep(ctx, time.Second)
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
			h.resetToNewEpoch()
			h.mu.Lock()
			after := h.last
			h.mu.Unlock()
			events, err := h.store.NodeEventsAfter(ctx, after, h.batch())
			if err != nil {
				if ctx.Err() == nil {
					h.opts.Logger.Warn("watch: reading events failed; will retry", "err", err)
				}
				break
			}
			if len(events) == 0 {
				break
			}
			if events[0].ID > after+1 && h.checkGap(ctx, after) {
				continue // a new epoch: start over in it
			}
			events = h.fit(events) // the rest is read again next
			h.opts.Follower.Apply(events)
			h.broadcast(events)
		}
	}
}

// resetToNewEpoch, when the sequencer found a new epoch of the feed,
// starts over in it: the follower drops what it applied (Gap) and starts
// at the epoch's start, the cached backfill pages go, and every
// subscription ends with a reset (Stream.Reset). Events of the epoch are
// then read from its start. Only fanOut calls it, between reads.
func (h *Hub) resetToNewEpoch() {
	h.mu.Lock()
	if h.newEpoch <= h.epoch {
		h.mu.Unlock()
		return
	}
	epoch, why := h.newEpoch, h.newEpochWhy
	h.mu.Unlock()
	reason := registry.NewEpochReason + ": " + why
	h.opts.Logger.Warn("watch: the change feed began a new epoch; every watcher and cache starts over", "reason", why, "epoch_start", epoch)
	h.opts.Follower.Gap(reason)
	h.pages.clear()
	h.mu.Lock()
	h.epoch, h.last = epoch, max(h.last, epoch)
	clear(h.window)
	h.window = h.window[:0]
	for s := range h.subs {
		s.resetTo(h.last, reason)
		delete(h.subs, s)
	}
	last := h.last
	h.mu.Unlock()
	h.opts.Follower.Start(last)
}

// checkGap tells the follower when events after after were pruned before
// the hub read them. Ids have holes of their own (a sequencing pass that
// rolled back), so only the horizon tells. The first event of a new epoch
// is such a jump too: checkGap reports true when the feed is in an epoch
// the hub has not reset to yet (another replica's pass began it), for
// fanOut to reset before it applies any of its events.
func (h *Hub) checkGap(ctx context.Context, after int64) (newEpoch bool) {
	feed, err := h.store.EventHorizon(ctx)
	if err == nil {
		h.mu.Lock()
		if newEpoch = feed.Epoch > h.epoch; newEpoch && feed.Epoch > h.newEpoch {
			h.newEpoch, h.newEpochWhy = feed.Epoch, "another replica's sequencing pass began it"
		}
		h.mu.Unlock()
	}
	switch {
	case newEpoch:
	case err != nil:
		h.opts.Follower.Gap("cannot read the event horizon: " + err.Error())
	case feed.Pruned > after:
		h.opts.Logger.Warn("watch: events were pruned before this replica read them", "after", after, "pruned_through", feed.Pruned)
		h.opts.Follower.Gap("events were pruned before this replica read them")
	}
	return newEpoch
}

// batch is how many events fanOut reads at once: up to 500, fewer for a
// small MaxPending so that one batch (at about 2 KiB an event, more than a
// node's document takes) cannot cut off a subscriber that keeps up.
func (h *Hub) batch() int {
	return min(500, max(8, h.opts.MaxPending/2/2048))
}

// fit is the longest prefix of events (one at least) that weighs at most
// half of MaxPending, as batch counts them (2 KiB an event, a renewed one
// its nodes' worth): a subscriber that keeps up is never cut off by one
// broadcast.
func (h *Hub) fit(events []registry.NodeEvent) []registry.NodeEvent {
	total := 0
	for i, e := range events {
		total += max(2048, (heldNodeBytes+64)*len(e.Nodes))
		if i > 0 && total > h.opts.MaxPending/2 {
			return events[:i]
		}
	}
	return events
}

// broadcast encodes events once, appends them to the shared window, cuts
// off every subscriber now lagging by more than MaxPending bytes and wakes
// the others.
func (h *Hub) broadcast(events []registry.NodeEvent) {
	encoded := make([]*event, 0, len(events))
	failed := false
	for _, e := range events {
		frame, err := h.opts.Encode(e)
		if err != nil {
			// Never skip an event silently: every subscriber resumes from
			// the log instead (where the failure shows again, in the log).
			h.opts.Logger.Error("watch: cannot encode an event; ending every stream", "event", e.ID, "err", err)
			failed = true
			break
		}
		encoded = append(encoded, &event{NodeEvent: e, frame: frame})
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = events[len(events)-1].ID
	if failed {
		for s := range h.subs {
			s.cut()
			delete(h.subs, s)
		}
		return
	}
	for _, e := range encoded {
		h.head += int64(weight(e.NodeEvent, e.frame))
		e.end = h.head
	}
	h.window = append(h.window, encoded...)
	// Events ending at or before head-MaxPending are needed only by
	// subscribers that are cut off below.
	floor := h.head - int64(h.opts.MaxPending)
	if drop := sort.Search(len(h.window), func(i int) bool { return h.window[i].end > floor }); drop > 0 {
		clear(h.window[:drop])
		h.window = h.window[drop:]
	}
	for s := range h.subs {
		if h.head-s.pos.Load() > int64(h.opts.MaxPending) {
			// Too slow: cut it off rather than hold more for it.
			s.cut()
			delete(h.subs, s)
			continue
		}
		signal(s.wake)
	}
}

// heldNodeBytes is about what a node of a renewed event costs the hub to
// hold besides the event's encoding (its document, decoded).
const heldNodeBytes = 512

// weight is what an event counts for against MaxPending and the backfill
// page cache's budget: its encoding, and for a renewed event the nodes it
// holds, whose encoding is a few dozen bytes each (pk and version) while
// the hub keeps each whole node for the watch filters.
func weight(e registry.NodeEvent, frame []byte) int {
	return len(frame) + heldNodeBytes*len(e.Nodes)
}

// Stream is one watcher's subscription as the HTTP layer uses it. It is
// an alias of an unnamed interface so that a consumer declaring the same
// method set (internal/api does) accepts *Hub without importing this
// package.
type Stream = interface {
	// Wake is signalled when Next may have events.
	Wake() <-chan struct{}
	// Done is closed when the subscriber is cut off (it fell more than
	// MaxPending bytes behind) or the hub stopped: the stream must end
	// and the client resume from its last id. Or when the feed began a
	// new epoch: see Reset.
	Done() <-chan struct{}
	// Reset, once Done is closed, tells why when the subscription ended
	// because the feed began a new epoch (a failover, a restore, a reset
	// of the sequence): what the watcher saw may be lost, so it must
	// re-list, then watch after last (the epoch's start). "" otherwise.
	Reset() (reason string, last int64)
	// Last is the id of the newest event the subscription will not
	// deliver; backfill (after, Last] from the log when resuming.
	Last() int64
	// Next calls fn with each pending event, oldest first, and its shared
	// encoding (never modify it), until none is left or fn fails.
	Next(fn func(e registry.NodeEvent, frame []byte) error) error
	// Close ends the subscription and frees its slot.
	Close()
}

// Subscription receives every event after Last.
type Subscription struct {
	hub       *Hub
	principal string
	last      int64
	pos       atomic.Int64 // the hub's byte offset this subscriber has taken up to
	wake      chan struct{}
	done      chan struct{}
	cutOnce   sync.Once
	closeOnce sync.Once
	// Set before done closes, by resetTo.
	resetWhy  string
	resetLast int64
}

func (s *Subscription) cut() { s.cutOnce.Do(func() { close(s.done) }) }

// resetTo ends the subscription with a reset to last, unless it already
// ended.
func (s *Subscription) resetTo(last int64, reason string) {
	s.cutOnce.Do(func() {
		s.resetWhy, s.resetLast = reason, last
		close(s.done)
	})
}

// Reset implements Stream.
func (s *Subscription) Reset() (reason string, last int64) {
	select {
	case <-s.done:
		return s.resetWhy, s.resetLast
	default:
		return "", 0
	}
}

// Wake implements Stream.
func (s *Subscription) Wake() <-chan struct{} { return s.wake }

// Done implements Stream.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Last implements Stream.
func (s *Subscription) Last() int64 { return s.last }

// maxBatch bounds the events one Next takes under the hub's lock.
const maxBatch = 256

// Next implements Stream. Events count as taken as fn returns for each,
// so a subscriber blocked in fn (writing to a client that does not read)
// lags, and is cut off once the lag passes MaxPending.
func (s *Subscription) Next(fn func(e registry.NodeEvent, frame []byte) error) error {
	h := s.hub
	for {
		h.mu.RLock()
		select {
		case <-s.done:
			// Cut off: the window may no longer hold what it missed.
			h.mu.RUnlock()
			return nil
		default:
		}
		pos := s.pos.Load()
		i := sort.Search(len(h.window), func(i int) bool { return h.window[i].end > pos })
		batch := h.window[i:min(len(h.window), i+maxBatch)]
		batch = append([]*event(nil), batch...)
		h.mu.RUnlock()
		if len(batch) == 0 {
			return nil
		}
		for _, e := range batch {
			if err := fn(e.NodeEvent, e.frame); err != nil {
				return err
			}
			s.pos.Store(e.end)
		}
	}
}

// Close implements Stream.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		h := s.hub
		h.mu.Lock()
		delete(h.subs, s)
		h.streams--
		if h.byPrincipal[s.principal]--; h.byPrincipal[s.principal] <= 0 {
			delete(h.byPrincipal, s.principal)
		}
		h.mu.Unlock()
		s.cut()
	})
}

// ErrTooOld means a resume point lies before events retention pruned. It
// matches registry.ErrGone.
var ErrTooOld = registry.Errorf(registry.ErrGone, "the events after that id were removed by retention; re-list and watch from now")

// ErrOtherEpoch means a resume point is of an earlier epoch of the feed
// (before a failover, a restore or a reset of the sequence): what the
// watcher saw may be lost. It matches registry.ErrGone.
var ErrOtherEpoch = registry.Errorf(registry.ErrGone, "that event id is from before the change feed began a new epoch (a failover, a restore or a reset); re-list and watch from now")

// Subscribe starts a subscription for principal, or refuses it with an
// error matching registry.ErrTooMany when this hub already has
// MaxStreams subscriptions, or the principal MaxPerPrincipal.
func (h *Hub) Subscribe(ctx context.Context, principal string) (Stream, error) {
	select {
	case <-h.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.admitLocked(principal); err != nil {
		return nil, err
	}
	s := &Subscription{hub: h, principal: principal, last: h.last,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.pos.Store(h.head)
	h.streams++
	h.byPrincipal[principal]++
	if h.stopped {
		s.cut()
	} else {
		h.subs[s] = struct{}{}
	}
	return s, nil
}

// Admit reports whether Subscribe would take a subscription of principal
// now, without taking one: an error matching registry.ErrTooMany when a
// cap is reached (what HEAD of a watch answers).
func (h *Hub) Admit(principal string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.admitLocked(principal)
}

// admitLocked is Admit with h.mu held.
func (h *Hub) admitLocked(principal string) error {
	if h.streams >= h.opts.MaxStreams {
		return registry.Errorf(registry.ErrTooMany,
			"this server already has %d watch streams open, its maximum; retry later or watch through another replica", h.streams)
	}
	if n := h.byPrincipal[principal]; n >= h.opts.MaxPerPrincipal {
		return registry.Errorf(registry.ErrTooMany,
			"%q already has %d watch streams open on this server, the maximum per principal; close one or retry later", principal, n)
	}
	return nil
}

// Streams returns how many subscriptions are open.
func (h *Hub) Streams() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streams
}

// Latest returns the newest event id in the change log (at least its
// epoch's start), which may be ahead of what this hub has handed out yet.
func (h *Hub) Latest(ctx context.Context) (int64, error) {
	feed, err := h.store.EventHorizon(ctx)
	return feed.Latest, err
}
