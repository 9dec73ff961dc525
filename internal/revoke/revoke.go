// Package revoke keeps a replica's in-memory copy of the token revocation
// list, so that checking a token never costs a query. The list is loaded
// whole at start (until then every check fails, so no token is accepted
// unchecked), reloaded whole whenever a PostgreSQL notification says a
// revocation was stored on any replica, and reloaded every Reload interval
// in case a notification was lost. Revocations are rare and the table is
// small (see store.PruneRevocations), so a full reload stays cheap; see
// BenchmarkLoad for the numbers.
package revoke

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// Store is where revocations live. *store.Store implements it.
type Store interface {
	Revocations(ctx context.Context) ([]registry.Revocation, error)
	PruneRevocations(ctx context.Context, expiredBefore, unknownBefore time.Time) (int64, error)
	Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error
}

// Options tune a List.
type Options struct {
	// Channel is notified when a revocation is stored; see
	// store.RevocationsChannel.
	Channel string
	// Reload is the fallback interval of full reloads; default 30s.
	Reload time.Duration
	// Keep is how long a token-id revocation of unknown expiry is kept:
	// the longest lifetime a token may have plus clock leeway. Zero never
	// prunes.
	Keep time.Duration
	// Leeway is added to a token's expiry before its revocation is pruned,
	// matching the verifier's clock skew allowance; default 1m.
	Leeway time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// List is one replica's revocation list.
type List struct {
	store Store
	opts  Options

	set    atomic.Pointer[registry.RevocationSet]
	loaded chan struct{}
	once   sync.Once
	kick   chan struct{}
	loads  atomic.Int64
	// loadedAt is when the last load succeeded (Unix nanoseconds).
	loadedAt atomic.Int64
}

// New returns a List; call Run.
func New(store Store, opts Options) *List {
	if opts.Reload <= 0 {
		opts.Reload = 30 * time.Second
	}
	if opts.Leeway <= 0 {
		opts.Leeway = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &List{store: store, opts: opts, loaded: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// ErrNotLoaded is returned by Revoked before the first load.
var ErrNotLoaded = fmt.Errorf("the token revocation list is not loaded yet: %w", registry.ErrUnavailable)

// Revoked reports from memory whether a token is revoked; see
// registry.RevocationSet.Revokes. It returns ErrNotLoaded (which matches
// registry.ErrUnavailable) until the first load succeeded.
func (l *List) Revoked(sub, jti string, iat *time.Time) (bool, error) {
	s := l.set.Load()
	if s == nil {
		return false, ErrNotLoaded
	}
	return s.Revokes(sub, jti, iat), nil
}

// Current returns nil when the list was loaded within maxAge, and an
// error matching registry.ErrUnavailable otherwise (the database has not
// been reachable since): what is refused by a revocation stored meanwhile
// would still be accepted.
func (l *List) Current(maxAge time.Duration) error {
	at := l.loadedAt.Load()
	if at == 0 {
		return ErrNotLoaded
	}
	if age := l.opts.Now().Sub(time.Unix(0, at)); age > maxAge {
		return registry.Errorf(registry.ErrUnavailable, "the token revocation list was last loaded %s ago; the database is needed to renew tokens", age.Round(time.Second))
	}
	return nil
}

// Loaded is closed once the list has been loaded the first time.
func (l *List) Loaded() <-chan struct{} { return l.loaded }

// Loads counts the loads so far, for tests and measurements.
func (l *List) Loads() int64 { return l.loads.Load() }

// Run loads the list and keeps it current until ctx ends. Database
// failures are retried with backoff; the last list loaded stays in force
// meanwhile.
func (l *List) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { l.listen(ctx) })
	wg.Go(func() { l.reload(ctx) })
	wg.Wait()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// listen asks for a reload on every notification, and on every
// (re)connection: whatever was stored while the connection was down is
// read then.
func (l *List) listen(ctx context.Context) {
	lifecycle.Retry(ctx, lifecycle.Backoff{}, l.opts.Logger, "revoke: lost the notification connection; reconnecting",
		func(ctx context.Context, alive func()) error {
			return l.store.Listen(ctx, []string{l.opts.Channel}, func(string, string) {
				alive()
				signal(l.kick)
			})
		})
}

func (l *List) reload(ctx context.Context) {
	tick := time.NewTicker(l.opts.Reload)
	defer tick.Stop()
	var backoff lifecycle.Backoff
	var lastPrune time.Time
	for ctx.Err() == nil {
		if err := l.Load(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := backoff.Next()
			l.opts.Logger.Warn("revoke: loading the revocation list failed; retrying", "err", err, "in", wait.String())
			lifecycle.Sleep(ctx, wait)
			continue
		}
		backoff.Reset()
		if l.opts.Keep > 0 && l.opts.Now().Sub(lastPrune) > 10*time.Minute {
			lastPrune = l.opts.Now()
			l.prune(ctx)
		}
		select {
		case <-ctx.Done():
		case <-l.kick:
		case <-tick.C:
		}
	}
}

// Load reads the whole list once and puts it in force.
func (l *List) Load(ctx context.Context) error {
	start := l.opts.Now() // what is loaded is as old as the query's start
	rs, err := l.store.Revocations(ctx)
	if err != nil {
		return err
	}
	l.set.Store(registry.NewRevocationSet(rs))
	l.loadedAt.Store(start.UnixNano())
	l.loads.Add(1)
	l.once.Do(func() { close(l.loaded) })
	return nil
}

func (l *List) prune(ctx context.Context) {
	now := l.opts.Now()
	n, err := l.store.PruneRevocations(ctx, now.Add(-l.opts.Leeway), now.Add(-l.opts.Keep))
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		l.opts.Logger.Warn("revoke: pruning expired revocations failed", "err", err)
	case n > 0:
		l.opts.Logger.Info("revoke: pruned revocations of expired tokens", "rows", n)
	}
}
