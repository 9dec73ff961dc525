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
	advisory := func() int {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	stop := lifecycle.Go(ctx, sw.Run)
	t.Cleanup(stop)
	apitest.Eventually(t, 5*time.Second, "the sweeper leads (holds its lock)", func() bool { return advisory() > 0 })
	stop()
	held := advisory()
	if held != 0 {
		t.Fatalf("%d advisory locks still held after the sweeper stopped: its lock was not given back", held)
	}
}
