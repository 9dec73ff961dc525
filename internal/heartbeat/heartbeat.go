// Package heartbeat coalesces node heartbeats (last_seen updates) into
// batched writes. A fleet of agents pinging every few seconds would
// otherwise cost one UPDATE per ping; here each node's latest time is kept
// in memory and all of them are written in one statement per interval, and
// once more on shutdown.
//
// Durability: a heartbeat is acknowledged before it is written. What the
// process holds when it dies (at most one interval's worth plus a flush in
// flight, 500 ms by default) is lost; Pending and PendingAge say how much
// that is at any moment, and a stop whose final flush fails reports what it
// drops to Observer.HeartbeatsLost.
package heartbeat

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Store writes a batch of heartbeats: pks sorted ascending, seen[i] the
// time of pks[i].
type Store interface {
	TouchNodes(ctx context.Context, pks []int64, seen []time.Time) error
}

// Observer is told what the Recorder does, for metrics.
// *metrics.Metrics implements it.
type Observer interface {
	// HeartbeatRecorded runs on every heartbeat's request: it must be
	// quick (an atomic add).
	HeartbeatRecorded()
	// HeartbeatFlushed gets a flush's batch size, duration and failure.
	HeartbeatFlushed(nodes int, d time.Duration, err error)
	// HeartbeatsLost gets the nodes whose acknowledged heartbeat was
	// dropped unwritten (the final flush at stop failed).
	HeartbeatsLost(nodes int)
}

type noObserver struct{}

func (noObserver) HeartbeatRecorded()                         {}
func (noObserver) HeartbeatFlushed(int, time.Duration, error) {}
func (noObserver) HeartbeatsLost(int)                         {}

// Options tune a Recorder.
type Options struct {
	// Interval between flushes; default 500ms, so a heartbeat reaches the
	// database within a second.
	Interval time.Duration
	Logger   *slog.Logger
	Now      func() time.Time
	Observer Observer // optional
}

// Recorder collects heartbeats and flushes them in batches.
type Recorder struct {
	store    Store
	interval time.Duration
	logger   *slog.Logger
	now      func() time.Time
	observer Observer

	mu      sync.Mutex
	pending map[int64]time.Time
	// oldest is when the earliest heartbeat in pending was recorded (zero
	// when pending is empty): how long a crash now would set nodes back.
	oldest  time.Time
	flushMu sync.Mutex // one flush at a time keeps writes in time order
}

// New returns a Recorder; call Run to flush in the background.
func New(store Store, opts Options) *Recorder {
	r := &Recorder{store: store, interval: opts.Interval, logger: opts.Logger, now: opts.Now,
		observer: opts.Observer, pending: map[int64]time.Time{}}
	if r.observer == nil {
		r.observer = noObserver{}
	}
	if r.interval <= 0 {
		r.interval = 500 * time.Millisecond
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r
}

// Record notes that node pk was seen now. It never blocks on the database.
func (r *Recorder) Record(pk int64) {
	t := r.now()
	r.mu.Lock()
	if cur, ok := r.pending[pk]; !ok || t.After(cur) {
		r.pending[pk] = t
	}
	if r.oldest.IsZero() {
		r.oldest = t
	}
	r.mu.Unlock()
	r.observer.HeartbeatRecorded()
}

// Pending reports how many nodes wait to be written.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// PendingAge reports how long the oldest heartbeat not yet written has
// waited: the window of acknowledged heartbeats a crash would lose. Zero
// when nothing waits.
func (r *Recorder) PendingAge() time.Duration {
	r.mu.Lock()
	oldest := r.oldest
	r.mu.Unlock()
	if oldest.IsZero() {
		return 0
	}
	return max(r.now().Sub(oldest), 0)
}

// Flush writes every pending heartbeat. On failure they are kept (merged
// with any newer ones) for the next flush, so an outage loses nothing that
// the process still holds.
func (r *Recorder) Flush(ctx context.Context) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	batch, oldest := r.pending, r.oldest
	r.pending, r.oldest = make(map[int64]time.Time, len(batch)), time.Time{}
	r.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	pks := make([]int64, 0, len(batch))
	for pk := range batch {
		pks = append(pks, pk)
	}
	slices.Sort(pks)
	seen := make([]time.Time, len(pks))
	for i, pk := range pks {
		seen[i] = batch[pk]
	}
	start := time.Now()
	err := r.store.TouchNodes(ctx, pks, seen)
	r.observer.HeartbeatFlushed(len(pks), time.Since(start), err)
	if err != nil {
		r.mu.Lock()
		for pk, t := range batch {
			if cur, ok := r.pending[pk]; !ok || t.After(cur) {
				r.pending[pk] = t
			}
		}
		if r.oldest.IsZero() || oldest.Before(r.oldest) {
			r.oldest = oldest
		}
		r.mu.Unlock()
		return err
	}
	return nil
}

// Run flushes every interval until ctx ends, then flushes once more with a
// short grace period of its own.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := r.Flush(ctx); err != nil && ctx.Err() == nil {
				r.logger.Warn("heartbeat flush failed; will retry", "pending", r.Pending(), "err", err)
			}
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := r.Flush(final); err != nil {
				lost := r.Pending()
				r.observer.HeartbeatsLost(lost)
				r.logger.Error("final heartbeat flush failed; acknowledged heartbeats are lost", "lost", lost, "err", err)
			}
			return
		}
	}
}
