// Package sweeper runs the node lifecycle's background pass (docs/scheduling.md,
// "Node states"): every second or so it marks silent nodes lost, finds them again
// when they heartbeat, and ends claims whose lease ran out. The rules are
// the registry package's (DecideSweep); the store selects candidates and
// applies the decisions in one transaction per pass.
//
// One replica sweeps at a time: the sweeper leads while its Locker says so
// and runs every pass through the Store the Locker returned. Serve's Locker
// takes a leader lease that its holder renews (cmd/registryd, takeLease):
// a leader that freezes loses it within the lease's TTL, and its passes
// commit only while the lease is valid, so no transition is applied by a
// leader that another replica has replaced.
package sweeper

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// Store runs one pass. *store.Store implements it.
type Store interface {
	SweepLifecycle(ctx context.Context, ttl time.Duration) (registry.Sweep, error)
}

// Locker takes the cluster-wide sweeper leadership (a lease, or in tests
// an advisory lock) without waiting. While held, passes run through the
// returned Store, which commits only while the leadership holds. ok is
// false when another replica leads.
type Locker func(ctx context.Context) (st Store, release func(), ok bool, err error)

// LockKey keys an advisory lock that lets one sweeper lead at a time, for
// Lockers built on one (tests); serve leads through a lease instead.
const LockKey = 0x7265676973747377

// DefaultInterval is the time between passes, and between a follower's
// attempts to take the lead.
const DefaultInterval = time.Second

// Config configures a Sweeper.
type Config struct {
	Locker   Locker
	TTL      time.Duration // the node TTL (REGISTRY_NODE_TTL)
	Interval time.Duration // between passes; default DefaultInterval
	Logger   *slog.Logger
	// OnPass, when set, gets every pass this replica runs as it ends:
	// how long it took, what it changed, and its error (for metrics).
	OnPass func(d time.Duration, done registry.Sweep, err error)
}

// Sweeper runs lifecycle passes while it holds the lock.
type Sweeper struct {
	cfg    Config
	passes atomic.Int64 // completed passes; read by tests (export_test.go)
}

// New validates cfg.
func New(cfg Config) (*Sweeper, error) {
	if cfg.Locker == nil {
		return nil, errors.New("sweeper: no Locker")
	}
	if cfg.TTL <= 0 {
		return nil, errors.New("sweeper: no TTL")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{cfg: cfg}, nil
}

// Run sweeps until ctx ends: it leads while it holds the lock, and
// otherwise tries to take it every interval.
func (s *Sweeper) Run(ctx context.Context) {
	backoff := lifecycle.Backoff{Min: s.cfg.Interval, Max: 30 * time.Second}
	for ctx.Err() == nil {
		st, release, ok, err := s.cfg.Locker(ctx)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			wait := backoff.Next()
			s.cfg.Logger.Warn("sweeper: cannot take the lead; retrying", "err", err, "in", wait.String())
			lifecycle.Sleep(ctx, wait)
		case !ok:
			backoff.Reset()
			lifecycle.Sleep(ctx, s.cfg.Interval) // another replica sweeps
		default:
			backoff.Reset()
			err := s.lead(ctx, st)
			release()
			if ctx.Err() != nil {
				return
			}
			wait := backoff.Next()
			s.cfg.Logger.Warn("sweeper: a pass failed (or the lease was lost); the lead is given up", "err", err, "in", wait.String())
			lifecycle.Sleep(ctx, wait)
		}
	}
}

// lead runs passes through st until one fails or ctx ends.
func (s *Sweeper) lead(ctx context.Context, st Store) error {
	for {
		start := time.Now()
		done, err := st.SweepLifecycle(ctx, s.cfg.TTL)
		if s.cfg.OnPass != nil && ctx.Err() == nil {
			s.cfg.OnPass(time.Since(start), done, err)
		}
		if err != nil {
			return err
		}
		s.passes.Add(1)
		if !done.Empty() {
			s.cfg.Logger.Info("sweeper: nodes changed state", "lost", len(done.Lost), "found", len(done.Found), "expired", len(done.Expired))
		}
		if !lifecycle.Sleep(ctx, s.cfg.Interval) {
			return ctx.Err()
		}
	}
}
