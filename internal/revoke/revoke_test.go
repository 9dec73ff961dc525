package revoke_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/revoke"
	"github.com/registryd/registryd/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var admin = registry.Actor{Principal: registry.Principal{Sub: "root", Role: registry.RoleAdmin}}

// counting counts the loads that reach the database.
type counting struct {
	*store.Store
	loads     atomic.Int64
	listening atomic.Bool // the LISTEN session is up (its first callback ran)
}

func (c *counting) Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error {
	return c.Store.Listen(ctx, channels, func(channel, payload string) {
		c.listening.Store(true)
		fn(channel, payload)
	})
}

func (c *counting) Revocations(ctx context.Context) ([]registry.Revocation, error) {
	c.loads.Add(1)
	return c.Store.Revocations(ctx)
}

// start runs l until the test ends, and waits for its first load.
func start(t *testing.T, l *revoke.List) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of its context ending")
		}
	})
	select {
	case <-l.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the list did not load within 10s")
	}
}

func revoked(t *testing.T, l *revoke.List, sub, jti string, iat *time.Time) bool {
	t.Helper()
	r, err := l.Revoked(sub, jti, iat)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Until its first load the list refuses to answer: no token is accepted
// unchecked.
func TestFailsClosedUntilLoaded(t *testing.T) {
	t.Parallel()
	l := revoke.New(pgtest.Open(t, pgtest.New(t), store.Options{}), revoke.Options{Channel: store.RevocationsChannel})
	if _, err := l.Revoked("anyone", "", nil); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("before loading: %v", err)
	}
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Revoked("anyone", "", nil); err != nil || r {
		t.Fatalf("after loading: %v %v", r, err)
	}
}

// A revocation stored through one replica reaches another replica's list
// through NOTIFY: the fallback reload is an hour away, so nothing else
// could deliver it in time.
func TestNotificationReachesEveryReplica(t *testing.T) {
	t.Parallel()
	url := pgtest.New(t)
	writer := pgtest.Open(t, url, store.Options{})
	lists := []*revoke.List{
		revoke.New(pgtest.Open(t, url, store.Options{}), revoke.Options{Channel: store.RevocationsChannel, Reload: time.Hour}),
		revoke.New(pgtest.Open(t, url, store.Options{}), revoke.Options{Channel: store.RevocationsChannel, Reload: time.Hour}),
	}
	for _, l := range lists {
		start(t, l)
	}
	before := time.Now().Add(-time.Hour)
	if _, err := writer.RevokeTokens(context.Background(), admin, registry.Revocation{Sub: "leaked"}); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.RevokeTokens(context.Background(), admin, registry.Revocation{JTI: "tok-1"}); err != nil {
		t.Fatal(err)
	}
	for i, l := range lists {
		apitest.Eventually(t, 5*time.Second, "replica sees the revocations", func() bool {
			return revoked(t, l, "leaked", "", &before) && revoked(t, l, "x", "tok-1", nil)
		})
		if revoked(t, l, "other", "tok-2", &before) {
			t.Errorf("replica %d revokes an unrelated token", i)
		}
	}
}

// A notification lost while the listening connection was down is made up
// for: the reconnect reloads.
func TestReloadsAfterReconnect(t *testing.T) {
	t.Parallel()
	url := pgtest.New(t)
	st := pgtest.Open(t, url, store.Options{})
	l := revoke.New(pgtest.Open(t, url, store.Options{}), revoke.Options{Channel: store.RevocationsChannel, Reload: time.Hour})
	start(t, l)
	loads := l.Loads()
	// End the listening session from the server side, once it listens:
	// the first load can come before the session has sent its LISTEN.
	var n int
	apitest.Eventually(t, 5*time.Second, "the listening session is up and terminated", func() bool {
		if err := st.Pool().QueryRow(context.Background(), `
			SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if n != 1 {
		t.Fatalf("terminated %d listening sessions, want 1", n)
	}
	if _, err := st.RevokeTokens(context.Background(), admin, registry.Revocation{Sub: "leaked"}); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "the list reloads after reconnecting", func() bool {
		return revoked(t, l, "leaked", "", nil)
	})
	if l.Loads() == loads {
		t.Error("no reload counted")
	}
}

// Without any notification (a row written by hand), the periodic reload
// still brings the list up to date.
func TestPeriodicReload(t *testing.T) {
	t.Parallel()
	url := pgtest.New(t)
	st := pgtest.Open(t, url, store.Options{})
	l := revoke.New(pgtest.Open(t, url, store.Options{}), revoke.Options{Channel: "nobody_notifies_this", Reload: 100 * time.Millisecond})
	start(t, l)
	if _, err := st.Pool().Exec(context.Background(), `INSERT INTO token_revocations (jti) VALUES ('by-hand')`); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 5*time.Second, "the periodic reload sees the row", func() bool {
		return revoked(t, l, "x", "by-hand", nil)
	})
}

// Checking a token costs no query: the list answers from memory, even
// with the database gone.
func TestChecksCostNoQuery(t *testing.T) {
	t.Parallel()
	url := pgtest.New(t)
	st := &counting{Store: pgtest.Open(t, url, store.Options{})}
	if _, err := st.RevokeTokens(context.Background(), admin, registry.Revocation{Sub: "leaked"}); err != nil {
		t.Fatal(err)
	}
	l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel, Reload: time.Hour})
	start(t, l)
	// Connecting the LISTEN session asks for one more load (whatever was
	// stored while it was down); let that settle before counting.
	apitest.Eventually(t, 5*time.Second, "the LISTEN session is up and its reload done", func() bool {
		return st.listening.Load() && st.loads.Load() >= 2
	})
	loads := st.loads.Load()
	old := time.Now().Add(-time.Hour)
	for range 10000 {
		if !revoked(t, l, "leaked", "", &old) || revoked(t, l, "fine", "", &old) {
			t.Fatal("wrong answer")
		}
	}
	if got := st.loads.Load(); got != loads {
		t.Errorf("10000 checks made %d loads", got-loads)
	}
	st.Close()
	if !revoked(t, l, "leaked", "", &old) {
		t.Error("with the database closed the list forgot a revocation")
	}
}

// Run stops with its context and leaves no goroutine behind.
func TestRunStops(t *testing.T) {
	url := pgtest.New(t)
	st := pgtest.Open(t, url, store.Options{})
	base := runtime.NumGoroutine()
	l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel, Reload: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	<-l.Loaded()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s")
	}
	apitest.Eventually(t, 5*time.Second, "goroutines back to where they were", func() bool {
		return runtime.NumGoroutine() <= base
	})
}

// Pruning forgets token-id revocations once the longest lifetime has run
// since they were made (a lineage's renewals live that long) and their
// token expired (when known); subject revocations stay.
func TestPrune(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	ctx := context.Background()
	// A revocation's until may not lie in the past; "expired" is one whose
	// token expires in a second, pruned as if that second had passed.
	soon, future := time.Now().Add(time.Second), time.Now().Add(time.Hour)
	for _, r := range []registry.Revocation{
		{JTI: "expired", Until: &soon}, {JTI: "live", Until: &future}, {JTI: "unknown"}, {Sub: "someone"},
	} {
		if _, err := st.RevokeTokens(ctx, admin, r); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int64 {
		var n int64
		st.Pool().QueryRow(ctx, `SELECT count(*) FROM token_revocations`).Scan(&n)
		return n
	}
	later := soon.Add(time.Second)
	// Revoked just now: kept while the longest lifetime runs, even the one
	// whose token expired (its renewals may not have).
	if n, err := st.PruneRevocations(ctx, later, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("pruned %d: %v", n, err)
	}
	// The longest lifetime over: the expired one and the unknown one go.
	if n, err := st.PruneRevocations(ctx, later, time.Now().Add(time.Minute)); err != nil || n != 2 {
		t.Fatalf("pruned %d: %v", n, err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows left, want live and someone", n)
	}
	l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel})
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if !revoked(t, l, "x", "live", nil) || !revoked(t, l, "someone", "", nil) || revoked(t, l, "x", "expired", nil) {
		t.Error("wrong set after pruning")
	}
}

// Current says whether the list is recent enough to act on: not before
// its first load, and not once its last load is older than asked.
func TestCurrent(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel, Now: now})
	if err := l.Current(time.Minute); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("before the first load: %v", err)
	}
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Current(time.Minute); err != nil {
		t.Fatalf("just loaded: %v", err)
	}
	mu.Lock()
	clock = clock.Add(61 * time.Second)
	mu.Unlock()
	if err := l.Current(time.Minute); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("loaded 61s ago: %v", err)
	}
}
