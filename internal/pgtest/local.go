package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pglocal"
)

// Local is a PostgreSQL cluster of one test's own, for tests that stop,
// crash or fail over their database server — which they must never do to
// the shared server that New clones databases on. It lives under the system
// temp dir and is stopped and removed when the test ends.
//
// Its settings are the throwaway ones (no fsync, no full page writes) but
// with synchronous_commit=on: a commit is acknowledged only once its WAL is
// written, so it survives the server process dying (not the machine), and
// with a synchronous standby it waits for the standby too. Tests that check
// no acknowledged write is lost rely on that.
type Local struct {
	t    testing.TB
	root string // removed at cleanup
	opts pglocal.Options

	mu sync.Mutex
	c  *pglocal.Cluster // nil while stopped
}

// NewLocal starts a dedicated cluster whose database "registry" holds the
// current schema. settings are extra server settings (-c name=value).
// Without PostgreSQL's server binaries the test is skipped, except in CI.
func NewLocal(t testing.TB, settings map[string]string) *Local {
	t.Helper()
	l := newLocal(t, "registryd-local-", settings)
	l.Start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrate(ctx, l.URL()); err != nil {
		t.Fatalf("pgtest: migrate the local cluster: %v", err)
	}
	return l
}

func newLocal(t testing.TB, prefix string, settings map[string]string) *Local {
	t.Helper()
	if _, err := pglocal.FindBinDir(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("pgtest: no PostgreSQL server binaries for a cluster of the test's own: %v", err)
		}
		t.Fatal(err)
	}
	// A test binary that dies on a timeout never runs its cleanups: the
	// directory names its owner so a later run sweeps it.
	if _, err := pglocal.SweepThrowaway(prefix); err != nil {
		t.Logf("pgtest: %v", err)
	}
	root, err := pglocal.MkdirThrowaway(prefix)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]string{"synchronous_commit": "on", "max_connections": "100"}
	for k, v := range settings {
		all[k] = v
	}
	l := &Local{t: t, root: root, opts: pglocal.Options{
		DataDir:   filepath.Join(root, "data"),
		Database:  "registry",
		Ephemeral: true,
		Settings:  all,
	}}
	t.Cleanup(func() {
		l.mu.Lock()
		c := l.c
		l.c = nil
		l.mu.Unlock()
		if c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Stop(ctx); err != nil {
				t.Logf("pgtest: stop the local cluster: %v", err)
			}
		}
		os.RemoveAll(root)
	})
	return l
}

// Start starts the cluster on its data directory: the first start, or a
// restart after Stop. The URL stays the same.
func (l *Local) Start() {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		l.t.Fatal("pgtest: the local cluster is already running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pglocal.Start(ctx, l.opts)
	if err != nil {
		l.t.Fatalf("pgtest: start the local cluster: %v", err)
	}
	l.c = c
}

// Stop shuts the server down: mode "fast" (sessions are cut, a checkpoint
// is written) or "immediate" (the server quits at once, as in a crash).
func (l *Local) Stop(mode string) {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		l.t.Fatal("pgtest: the local cluster is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.c.StopMode(ctx, mode); err != nil {
		l.t.Fatalf("pgtest: stop the local cluster (%s): %v", mode, err)
	}
	l.c = nil
}

// Promote makes a standby the primary and waits until it takes writes.
func (l *Local) Promote() {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.cluster().Promote(ctx); err != nil {
		l.t.Fatalf("pgtest: promote: %v", err)
	}
}

func (l *Local) cluster() *pglocal.Cluster {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		l.t.Fatal("pgtest: the local cluster is not running")
	}
	return l.c
}

// URL is the URL of database "registry" (the cluster must have run once).
func (l *Local) URL() string { return l.cluster().URL() }

// SocketDir is the directory of the cluster's socket: its host in a URL.
func (l *Local) SocketDir() string { return l.cluster().SocketDir() }

// Exec runs SQL on database "registry" over a connection of its own.
func (l *Local) Exec(sql string, args ...any) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, l.URL())
	if err != nil {
		l.t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		l.t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// NewPair starts a primary (migrated, as NewLocal) and a standby streaming
// from it, each with a socket directory of its own. With sync, the primary
// names the standby synchronous (synchronous_standby_names = '*'): a commit
// is acknowledged only once the standby has it, so a failover to the
// standby loses no acknowledged write. The standby does not inherit that
// setting: promoted, it takes writes on its own.
func NewPair(t testing.TB, sync bool) (primary, standby *Local) {
	t.Helper()
	primary = NewLocal(t, nil)
	standby = newLocal(t, "registryd-standby-", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.cluster().BaseBackup(ctx, standby.opts.DataDir); err != nil {
		t.Fatalf("pgtest: make the standby: %v", err)
	}
	standby.Start()
	if sync {
		primary.Exec(`ALTER SYSTEM SET synchronous_standby_names = '*'`)
		primary.Exec(`SELECT pg_reload_conf()`)
	}
	// Wait until the standby streams (and, with sync, is the synchronous
	// one), so that the first commits do not wait on its start.
	want := "async"
	if sync {
		want = "sync"
	}
	conn, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(context.Background())
	var state string
	for range 300 {
		err = conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&state)
		if err == nil && state == want {
			return primary, standby
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("pgtest: replication state: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pgtest: the standby is not streaming as %s within 15s (state %q)", want, state)
	return nil, nil
}

// MultiHostURL is a URL naming the clusters' sockets in order, for a client
// that must find whichever of them currently takes writes
// (target_session_attrs=read-write).
func MultiHostURL(clusters ...*Local) string {
	hosts := make([]string, len(clusters))
	for i, l := range clusters {
		hosts[i] = url.QueryEscape(l.SocketDir())
	}
	return fmt.Sprintf("postgres://postgres@/registry?host=%s&port=5432&sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","))
}
