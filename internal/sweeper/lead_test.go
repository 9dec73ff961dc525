package sweeper_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/sweeper"
)

// stallOnAuditLog creates a node silent for an hour and locks the audit
// log in the transaction it returns, so that the pass marking the node lost
// waits on the audit log until that transaction ends.
func stallOnAuditLog(t *testing.T, admin *store.Store) (registry.Node, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	n, _, err := admin.CreateNode(ctx, registry.Actor{Principal: registry.Principal{Sub: "t", Role: registry.RoleAdmin}},
		registry.NodeSpec{IP: "10.2.0.1", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := admin.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Rollback(ctx) })
	if _, err := blocker.Exec(ctx, `LOCK TABLE audit_log IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Pool().Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, now() - interval '1 hour')`, n.PK); err != nil {
		t.Fatal(err)
	}
	return n, blocker
}

// A pass that fails while its session lives on (here: it waits past
// lock_timeout on the audit log) gives up the lead, so that a sweeper, the
// other replica's or the same one, leads again at once. In
// TestOneSweeperAtATime the failing session is terminated, which frees the
// lock whether the sweeper releases it or not.
func TestFailedPassGivesUpTheLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	admin := pgtest.Open(t, dbURL, store.Options{})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("lock_timeout", "100ms") // the sweepers' sessions only
	u.RawQuery = q.Encode()
	var logs apitest.Buffer
	var sweepers []*sweeper.Sweeper
	for range 2 {
		s, err := sweeper.New(sweeper.Config{Locker: locker(pgtest.Open(t, u.String(), store.Options{})), TTL: time.Minute,
			Interval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lifecycle.Go(context.Background(), s.Run))
		sweepers = append(sweepers, s)
	}
	passes := func() int64 { return sweepers[0].Passes() + sweepers[1].Passes() }
	apitest.Eventually(t, 5*time.Second, "a sweeper leads", func() bool { return passes() > 0 })

	n, blocker := stallOnAuditLog(t, admin)
	apitest.Eventually(t, 5*time.Second, "a pass fails on the locked audit log", func() bool {
		return strings.Contains(logs.String(), "pass failed")
	})
	failed := passes()
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "a sweeper leads again after a failed pass (the failed leader kept the lock)", func() bool {
		return passes() > failed
	})
	apitest.Eventually(t, 5*time.Second, "the node is lost", func() bool {
		got, err := admin.GetNode(ctx, n.PK)
		return err == nil && got.State == registry.StateLost
	})
}
