package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// Lease is the leadership of one kind of background work (the sweeper,
// sync), held in the leader_leases table until it expires in the
// database's clock. Unlike a session's advisory lock, it lasts only while
// its holder keeps renewing it: a replica that freezes (SIGSTOP, a VM
// pause, a long GC) loses it within its TTL, whatever its sessions do.
//
// Fencing: every transaction of the Store a Lease returns checks, as its
// last statement before COMMIT, that the lease row still carries this
// leadership's token and an expiry in the future, and holds the row
// (FOR SHARE) until it commits. So work commits only while the lease is
// valid, and no other replica can take the lease over between that check
// and the commit: a leader that froze past its TTL commits nothing after
// another took over, its transaction failing with registry.ErrLeaseLost.
type Lease struct {
	name, holder string
	token        int64
	ttl          time.Duration
	store        *Store // fenced
	stop         func() // ends the renewals

	mu   sync.Mutex
	lost bool
	done chan struct{} // closed once the lease is known lost or released
}

// fence is what a leader's transactions check before they commit.
type fence struct {
	name  string
	token int64
}

// check verifies, in the transaction tx, that the lease is still valid,
// and holds its row until the transaction ends.
func (f *fence) check(ctx context.Context, tx querier) error {
	rows, err := tx.Exec(ctx, `SELECT 1 FROM leader_leases
		WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp() FOR SHARE`, f.name, f.token)
	if err != nil {
		return translate(err)
	}
	if rows.RowsAffected() == 0 {
		return fmt.Errorf("store: lease %q (leadership %d) ran out or was taken over: %w", f.name, f.token, registry.ErrLeaseLost)
	}
	return nil
}

// TryLead takes the lease name for holder (a name for people: which
// replica leads) for ttl, without waiting: ok is false while another
// holder's lease has not expired. Taken, the lease is renewed every third
// of ttl until Release, or until a renewal finds it lost or ttl passes
// without one succeeding; Done then closes. ttl is at least a second.
func (s *Store) TryLead(ctx context.Context, name, holder string, ttl time.Duration) (l *Lease, ok bool, err error) {
	if ttl < time.Second {
		return nil, false, fmt.Errorf("store: lead %q: a lease of %s is too short (at least 1s)", name, ttl)
	}
	var token int64
	err = s.pool.QueryRow(ctx, `INSERT INTO leader_leases AS l (name, holder, token, expires_at)
		VALUES ($1, $2, 1, clock_timestamp() + $3::bigint * interval '1 millisecond')
		ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at <= clock_timestamp()
		RETURNING token`, name, holder, ttl.Milliseconds()).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: lead %q: %w", name, translate(err))
	}
	f := &fence{name: name, token: token}
	l = &Lease{name: name, holder: holder, token: token, ttl: ttl, done: make(chan struct{}),
		store: &Store{pool: s.pool, db: s.pool, unvacuumed: s.unvacuumed, fence: f}}
	renewCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	renewed := make(chan struct{})
	go func() { defer close(renewed); l.renew(renewCtx) }()
	l.stop = func() { cancel(); <-renewed }
	return l, true, nil
}

// Token is the leadership's fencing token: it grows with every takeover.
func (l *Lease) Token() int64 { return l.token }

// Store returns a Store whose transactions (WithTx, and the writes made
// through it) commit only while this lease is valid; see Lease.
func (l *Lease) Store() *Store { return l.store }

// Done is closed once the lease is lost (a renewal found it expired or
// taken over, or ttl passed without a successful renewal) or released.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Lost reports whether the lease was found lost (not released).
func (l *Lease) Lost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

func (l *Lease) end(lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
	default:
		l.lost = lost
		close(l.done)
	}
}

// renew extends the lease every third of its ttl until ctx ends or the
// lease is lost.
func (l *Lease) renew(ctx context.Context) {
	valid := time.Now().Add(l.ttl) // at most: the row's expiry was set after this
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		err := l.Renew(ctx)
		switch {
		case err == nil:
			valid = start.Add(l.ttl)
		case ctx.Err() != nil:
			return
		case errors.Is(err, registry.ErrLeaseLost) || time.Now().After(valid):
			l.end(true)
			return
		}
	}
}

// Renew extends the lease to ttl from now. It fails with
// registry.ErrLeaseLost when the lease expired or another holder took it.
func (l *Lease) Renew(ctx context.Context) error {
	tag, err := l.store.pool.Exec(ctx, `UPDATE leader_leases SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
		WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp()`, l.name, l.token, l.ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("store: renew lease %q: %w", l.name, translate(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: renew lease %q (leadership %d): %w", l.name, l.token, registry.ErrLeaseLost)
	}
	return nil
}

// Release stops the renewals and ends the lease at once, so another
// replica may lead without waiting for it to expire. A lease already
// taken over is left to its new holder.
func (l *Lease) Release(ctx context.Context) {
	l.stop()
	l.end(false)
	// Best effort: a lease not ended here expires by itself.
	l.store.pool.Exec(ctx, `UPDATE leader_leases SET expires_at = clock_timestamp() WHERE name = $1 AND token = $2`, //nolint:errcheck
		l.name, l.token)
}
