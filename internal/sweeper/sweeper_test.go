package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/sweeper"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// locker is serve's Locker: the advisory lock on a session of its own.
func locker(st *store.Store) sweeper.Locker {
	return func(ctx context.Context) (sweeper.Store, func(), bool, error) {
		l, ok, err := st.TryLock(ctx, sweeper.LockKey)
		if err != nil || !ok {
			return nil, nil, ok, err
		}
		return l.Store(), func() { l.Release(context.WithoutCancel(ctx)) }, true, nil
	}
}

func start(t *testing.T, st *store.Store) *sweeper.Sweeper {
	t.Helper()
	s, err := sweeper.New(sweeper.Config{Locker: locker(st), TTL: time.Minute, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lifecycle.Go(context.Background(), s.Run))
	return s
}

func TestNew(t *testing.T) {
	if _, err := sweeper.New(sweeper.Config{TTL: time.Minute}); err == nil {
		t.Error("no Locker accepted")
	}
	if _, err := sweeper.New(sweeper.Config{Locker: locker(nil)}); err == nil {
		t.Error("no TTL accepted")
	}
}

// Two replicas' sweepers on one database: one leads, the other never runs
// a pass. Killing the leader's session in the middle of a pass rolls that
// pass back and hands the lead over, and the transition is applied once.
func TestOneSweeperAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	admin := pgtest.Open(t, dbURL, store.Options{})
	a := start(t, pgtest.Open(t, dbURL, store.Options{}))
	b := start(t, pgtest.Open(t, dbURL, store.Options{}))

	apitest.Eventually(t, 10*time.Second, "a sweeper leads", func() bool { return a.Passes()+b.Passes() >= 5 })
	leader, follower := a, b
	if b.Passes() > 0 {
		leader, follower = b, a
	}
	if follower.Passes() != 0 {
		t.Fatalf("both sweepers ran passes: %d and %d", a.Passes(), b.Passes())
	}

	// Block the leader's next pass on the audit log, after it has marked
	// the node and written the event, and terminate its session there.
	n, blocker := stallOnAuditLog(t, admin)
	var pid int
	apitest.Eventually(t, 10*time.Second, "the leader's pass waits on the audit log", func() bool {
		err := admin.Pool().QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO audit_log%'`).Scan(&pid)
		return err == nil
	})
	var changesInFlight int
	if err := blocker.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'`, pid).Scan(&changesInFlight); err != nil || changesInFlight != 1 {
		t.Fatalf("the waiting session holds %d advisory locks (%v); want the sweeper's", changesInFlight, err)
	}
	passes := leader.Passes()
	if _, err := admin.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	apitest.Eventually(t, 10*time.Second, "the node is lost", func() bool {
		got, err := admin.GetNode(ctx, n.PK)
		return err == nil && got.State == registry.StateLost
	})
	apitest.Eventually(t, 10*time.Second, "the other sweeper takes the lead", func() bool { return follower.Passes() > 0 })
	if leader.Passes() != passes {
		// It may lead again later; not while the follower holds the lock.
		t.Logf("old leader passes %d → %d", passes, leader.Passes())
	}
	var events, entries int
	if err := admin.Pool().QueryRow(ctx, `SELECT count(*) FROM node_change_events WHERE node_pk = $1 AND kind = 'lost'`, n.PK).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if err := admin.Pool().QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE target_pk = $1 AND action = 'node.lost'`, n.PK).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if events != 1 || entries != 1 {
		t.Fatalf("the transition was recorded %d times in the change log and %d in the audit log; want once each", events, entries)
	}
	// From now on one of them leads and the other waits.
	pa, pb := a.Passes(), b.Passes()
	apitest.Eventually(t, 10*time.Second, "more passes", func() bool { return a.Passes()+b.Passes() >= pa+pb+5 })
	if a.Passes() > pa && b.Passes() > pb {
		t.Errorf("both sweepers ran passes after the handover: %d→%d and %d→%d", pa, a.Passes(), pb, b.Passes())
	}
}
