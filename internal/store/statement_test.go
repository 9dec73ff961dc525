package store_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A statement on a connection the pool already handed out used to wait
// for the server without bound: a database that stops answering (a
// frozen host, a network partition without resets) held each request
// until its client gave up. Every statement is now bounded by
// Options.StatementTimeout and fails as unavailable (503 upstream).
func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	open := func(t *testing.T, opts store.Options) *store.Store {
		t.Helper()
		st, err := store.Open(context.Background(), dbURL, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	within := func(t *testing.T, limit time.Duration, what string, fn func() error) error {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- fn() }()
		select {
		case err := <-done:
			t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
			return err
		case <-time.After(limit):
			t.Fatalf("%s: still waiting after %v", what, limit)
			return nil
		}
	}

	t.Run("slow statement", func(t *testing.T) {
		st := open(t, store.Options{StatementTimeout: 300 * time.Millisecond})
		err := within(t, 5*time.Second, "pg_sleep(30)", func() error {
			_, err := st.Pool().Exec(context.Background(), "SELECT pg_sleep(30)")
			return store.Translate(err)
		})
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Errorf("a statement over the bound: %v, want one matching ErrUnavailable", err)
		}
		// A quick statement is not bothered, and the pool goes on.
		if _, err := st.GetNode(context.Background(), 1); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("after the timeout: %v, want not found", err)
		}
	})

	// A claim's statements go in batches (one round trip each): the
	// batch is bounded as a statement is, and counted when it fails.
	t.Run("claim behind a lock", func(t *testing.T) {
		var classes []string
		var mu sync.Mutex
		st := open(t, store.Options{StatementTimeout: 300 * time.Millisecond, ObserveQuery: func(class string) {
			mu.Lock()
			classes = append(classes, class)
			mu.Unlock()
		}})
		ctx := context.Background()
		locker, err := st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Rollback(ctx) //nolint:errcheck // ends the lock
		if _, err := locker.Exec(ctx, "LOCK TABLE nodes IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		err = within(t, 5*time.Second, "a claim behind a lock on nodes", func() error {
			_, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 1, Count: 1})
			return err
		})
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Errorf("a claim over the bound: %v, want one matching ErrUnavailable", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(classes, "timeout") {
			t.Errorf("the failed batch was not observed as a timeout: %q", classes)
		}
	})

	t.Run("server stops answering", func(t *testing.T) {
		st := open(t, store.Options{MaxConns: 1, StatementTimeout: 300 * time.Millisecond})
		ctx := context.Background()
		var pid int
		var local bool
		if err := st.Pool().QueryRow(ctx, "SELECT pg_backend_pid(), inet_server_addr() IS NULL").Scan(&pid, &local); err != nil {
			t.Fatal(err)
		}
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if !local || strings.TrimSpace(string(comm)) != "postgres" {
			t.Skip("the test database's server is not on this machine; cannot freeze its backend")
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Skipf("cannot stop the backend: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		err := within(t, 5*time.Second, "GetNode on a frozen backend", func() error {
			_, err := st.GetNode(ctx, 1)
			return err
		})
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Errorf("a frozen backend: %v, want one matching ErrUnavailable", err)
		}
	})
}

// What may rightly take long is not bounded: with a bound no statement can
// meet, migrations, an import pass and pruning events still work, while
// an ordinary read fails as unavailable.
func TestStatementTimeoutExemptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, pgtest.New(t), store.Options{StatementTimeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.GetNode(ctx, 1); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("an ordinary read under a 1ns bound: %v, want unavailable", err)
	}
	m, err := st.NewMigrator(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Errorf("migrate up: %v", err)
	}
	if _, err := m.Status(ctx); err != nil {
		t.Errorf("migrate status: %v", err)
	}
	if _, err := st.ApplyImport(ctx, syncSCP, "scp", gpuHost("h", "10.9.0.1", 2, "A100", 80, true), nil); err != nil {
		t.Errorf("import pass: %v", err)
	}
	if _, err := st.PruneEvents(ctx, time.Now()); err != nil {
		t.Errorf("prune events: %v", err)
	}
}
