package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// Lock waits for the holder of an advisory lock: it gets the lock as soon
// as the holder lets go (even past the statement timeout, which does not
// apply to the wait), and gives up with ok false after its wait.
func TestLockWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{StatementTimeout: 200 * time.Millisecond})
	const key = 42
	held, ok, err := st.TryLock(ctx, key)
	if err != nil || !ok {
		t.Fatalf("TryLock: %v %v", ok, err)
	}
	// Released once, by the test or, when it fails early, before the
	// store closes (which waits for every connection).
	var releaseOnce sync.Once
	releaseHeld := func() { releaseOnce.Do(func() { held.Release(ctx) }) }
	t.Cleanup(releaseHeld)

	// Still held after the wait: ok false, promptly.
	start := time.Now()
	if _, ok, err := st.Lock(ctx, key, 300*time.Millisecond); err != nil || ok {
		t.Fatalf("Lock on a held lock: ok %v, %v; want not ok", ok, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %s, want about 300ms", d)
	}

	// Released while waiting, after the statement timeout has passed:
	// taken at once.
	type got struct {
		l   *store.Lock
		ok  bool
		err error
		at  time.Time
	}
	done := make(chan got, 1)
	go func() {
		l, ok, err := st.Lock(ctx, key, 20*time.Second)
		done <- got{l, ok, err, time.Now()}
	}()
	// Once the waiter queues on the server, let the statement timeout
	// pass: it must not end the wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(400 * time.Millisecond) // twice the statement timeout
	select {
	case g := <-done:
		if g.l != nil {
			g.l.Release(ctx)
		}
		t.Fatalf("Lock returned while the lock was held: %+v", g)
	default:
	}
	released := time.Now()
	releaseHeld()
	var g got
	select {
	case g = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return within 10s of the release")
	}
	if g.err != nil || !g.ok {
		t.Fatalf("Lock after the release: ok %v, %v", g.ok, g.err)
	}
	defer g.l.Release(ctx)
	if d := g.at.Sub(released); d > 2*time.Second {
		t.Errorf("took the lock %s after its release", d)
	}
	// It is held: a try from elsewhere fails; and the connection is back
	// to normal (the statement timeout applies again).
	if _, ok, err := st.TryLock(ctx, key); err != nil || ok {
		t.Errorf("TryLock while Lock holds it: %v %v", ok, err)
	}
}
