package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// The sweeper serve wires gives its advisory lock back when its lead ends,
// so that another replica can lead: the release its Locker returns really
// unlocks. internal/sweeper's tests use a Locker of their own; this one is
// serve's.
func TestSweeperGivesItsLockBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	sw, err := newSweeper(config{NodeTTL: time.Minute}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// advisory counts the advisory locks held in the test's database, by
	// sessions in state (any state when "").
	advisory := func(state string) int {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND (a.state = $1 OR $1 = '')
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, state).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	stop := lifecycle.Go(ctx, sw.Run)
	t.Cleanup(stop)
	// Stopped between passes (its session idle), the sweeper's session
	// lives on: only the release can let the lock go.
	apitest.Eventually(t, 5*time.Second, "the sweeper leads, between passes", func() bool { return advisory("idle") > 0 })
	stop()
	// A release that fails mid-pass closes the session instead, which the
	// server notices a moment later: the lock must be gone within seconds.
	deadline := time.Now().Add(5 * time.Second)
	for advisory("") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d advisory locks still held 5 s after the sweeper stopped: its lock was not given back", advisory(""))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
