package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// Every session of the pool carries the bounds: the settings given, and
// server-side keepalives.
func TestSessionBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{IdleInTransactionTimeout: 1500 * time.Millisecond, LockTimeout: 2 * time.Second})
	var idle, lock, kaIdle, kaInterval, kaCount string
	if err := st.Pool().QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout'),
		current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count')`).
		Scan(&idle, &lock, &kaIdle, &kaInterval, &kaCount); err != nil {
		t.Fatal(err)
	}
	if idle != "1500ms" || lock != "2s" {
		t.Errorf("idle_in_transaction_session_timeout %s, lock_timeout %s; want 1500ms, 2s", idle, lock)
	}
	// Over a Unix socket the server reports 0 for the keepalive settings
	// whatever was asked; over TCP, what was asked.
	var unix bool
	if err := st.Pool().QueryRow(ctx, `SELECT inet_client_addr() IS NULL`).Scan(&unix); err != nil {
		t.Fatal(err)
	}
	if !unix && (kaIdle != "10" || kaInterval != "5" || kaCount != "3") {
		t.Errorf("tcp_keepalives idle %s interval %s count %s; want 10, 5, 3", kaIdle, kaInterval, kaCount)
	}
}

// A statement that waits on a lock another session holds for longer than
// the lock timeout fails as ErrBusy (which matches ErrUnavailable too, for
// callers that retry on it), having changed nothing.
func TestLockWaitIsBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	st := pgtest.Open(t, url, store.Options{LockTimeout: 300 * time.Millisecond})
	n := lockedNode(t, pgtest.Open(t, url, store.Options{}))
	start := time.Now()
	_, _, err := st.CordonNodes(ctx, sys, registry.Cordon{Nodes: []int64{n.PK}, Reason: "fan"})
	if !errors.Is(err, registry.ErrBusy) || !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("cordon of a locked node: %v; want ErrBusy (and ErrUnavailable)", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %s, want about 300ms", d)
	}
	if got := store.ErrorClass(err); got != "55" {
		t.Errorf("ErrorClass %q, want 55 (lock not available)", got)
	}
}

// A session of ours left idle in a transaction holding a row lock is
// ended by the server after the idle-in-transaction timeout: the lock no
// longer blocks others.
func TestIdleTransactionLosesItsLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	n := lockedNode(t, pgtest.Open(t, url, store.Options{IdleInTransactionTimeout: 500 * time.Millisecond}))
	// The frozen holder does nothing more; a cordon from another store
	// (its own lock timeout far above the idle timeout) gets the row.
	other := pgtest.Open(t, url, store.Options{LockTimeout: 20 * time.Second})
	start := time.Now()
	got, _, err := other.CordonNodes(ctx, sys, registry.Cordon{Nodes: []int64{n.PK}, Reason: "fan"})
	if err != nil || len(got) != 1 {
		t.Fatalf("cordon: %v, %d nodes", err, len(got))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the cordon waited %s for a transaction idle past its 500ms timeout", d)
	}
}

// lockedNode creates a node through st and locks its row in a transaction
// on one of st's sessions, left open until the test ends (or the server
// ends it).
func lockedNode(t *testing.T, st *store.Store) registry.Node {
	t.Helper()
	ctx := context.Background()
	n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // the test's end, or its session is gone
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = $1 FOR UPDATE`, n.PK); err != nil {
		t.Fatal(err)
	}
	return n
}
