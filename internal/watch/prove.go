package watch

import (
	"context"
	"sync"
	"time"
)

// maxLookups bounds the position look-ups in flight at once.
const maxLookups = 2

// lookupTimeout bounds one look-up; a reader waiting on it gives up
// sooner (it reads PostgreSQL instead).
const lookupTimeout = 2 * time.Second

// prover shares position look-ups among the reads that need one.
type prover struct {
	mu       sync.Mutex
	ctx      context.Context // Run's; nil before Run and after it ends
	want     time.Time       // the newest arrival a reader asked to be proven
	started  time.Time       // when the newest look-up started
	inflight int
}

// Prove asks for proof that the follower is current as of since (a
// read's arrival): a look-up of the feed's position that starts after
// since, whose result reaches the follower as Sequenced(at, latest) with
// at the look-up's start. When changes wait to be sequenced, the look-up
// kicks the sequencer instead, whose next pass (which starts later still)
// brings the proof.
//
// Reads arriving together share look-ups: one starts only if none started
// after since, and at most maxLookups are in flight; a read that finds
// them all busy is served by the next one, started as one ends. The
// caller waits for the follower (nodecache.Cache.Await), not for Prove.
func (h *Hub) Prove(since time.Time) {
	p := &h.prover
	p.mu.Lock()
	defer p.mu.Unlock()
	if since.After(p.want) {
		p.want = since
	}
	h.lookupLocked()
}

// lookupLocked starts a look-up if one is wanted and a slot is free;
// h.prover.mu held.
func (h *Hub) lookupLocked() {
	p := &h.prover
	if p.ctx == nil || p.inflight >= maxLookups || p.started.After(p.want) {
		return
	}
	at := time.Now()
	p.started = at
	p.inflight++
	go h.lookup(p.ctx, at)
}

// lookup reads the feed's position (after at) and hands the proof on.
func (h *Hub) lookup(ctx context.Context, at time.Time) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	// Every id up to seen was read from the database before the look-up:
	// one that no longer has it is not the one they came from.
	h.mu.RLock()
	seen := h.last
	h.mu.RUnlock()
	latest, pending, err := h.store.FeedPosition(ctx, seen)
	cancel()
	p := &h.prover
	p.mu.Lock()
	p.inflight--
	h.lookupLocked()
	p.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			h.opts.Logger.Debug("watch: feed position look-up failed", "err", err)
		}
	case pending:
		// Changes committed before at may be among the pending ones: the
		// sequencer's next pass starts after at and proves them.
		signal(h.kick)
	default:
		// Every change committed before at has an id of at most latest.
		h.opts.Follower.Sequenced(at, latest)
		h.mu.RLock()
		behind := latest > h.last
		h.mu.RUnlock()
		if behind { // fanOut reads up to latest; otherwise nothing is new
			signal(h.events)
		}
	}
}

// setProving lets look-ups run under ctx (nil: none may start).
func (h *Hub) setProving(ctx context.Context) {
	p := &h.prover
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx = ctx
}
