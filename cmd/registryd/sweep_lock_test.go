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

// The sweeper serve wires gives its lease back when its lead ends, so
// that another replica can lead at once rather than after the lease's
// TTL: the release its Locker returns really ends the lease.
// internal/sweeper's tests use a Locker of their own; this one is serve's.
func TestSweeperGivesItsLeaseBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	sw, err := newSweeper(config{NodeTTL: time.Minute, LeaderTTL: time.Minute}, st, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		var held bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM leader_leases WHERE name = $1 AND expires_at > clock_timestamp())`,
			sweeperLease).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return held
	}
	stop := lifecycle.Go(ctx, sw.Run)
	t.Cleanup(stop)
	apitest.Eventually(t, 5*time.Second, "the sweeper leads", held)
	stop()
	// Its TTL is a minute: only the release can free it this soon.
	if held() {
		t.Fatal("the sweeper's lease is still held after it stopped: it was not given back")
	}
}
