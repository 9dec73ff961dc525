// Package pgtest gives each test its own freshly migrated PostgreSQL
// database, cloned from a template so a test pays milliseconds, not a
// migration run.
//
// The server comes from, in order: TEST_DATABASE_URL (any PostgreSQL the
// tests may create databases on); a container started with
// testcontainers-go when a Docker engine answers; otherwise a throwaway
// local cluster started from the installed server binaries (the same code
// as registryd's embedded default). Call Main from TestMain so whatever was
// started is stopped.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/migrations"
)

var (
	once     sync.Once
	adminURL string // a URL to the server's maintenance database
	template string // name of the migrated template database
	setupErr error
	stopFns  []func()
)

// Main runs the tests of a package and stops any server it started. Then,
// if the tests passed, it fails them if any goroutine they started is
// still running (goleak): every background loop must stop with its test.
// Use it as: func TestMain(m *testing.M) { pgtest.Main(m) }. The after
// checks run once the tests are done; an error of one fails them.
func Main(m *testing.M, after ...func() error) {
	code := m.Run()
	for _, check := range after {
		if err := check(); code == 0 && err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			code = 1
		}
	}
	for _, stop := range stopFns {
		stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Server returns a URL to the test server's maintenance database, starting
// the server on first use.
func Server(t testing.TB) string {
	t.Helper()
	once.Do(setup)
	if setupErr != nil {
		t.Fatalf("pgtest: %v", setupErr)
	}
	return adminURL
}

// New creates a fresh database holding the current schema, dropped when the
// test ends, and returns its URL.
func New(t testing.TB) string {
	t.Helper()
	admin := Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "registryd_test_" + randomHex(8)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(template)); err != nil {
		t.Fatalf("pgtest: clone template: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	return WithDatabase(admin, name)
}

// NewEmpty creates a fresh database with no schema at all, for testing
// migrations themselves.
func NewEmpty(t testing.TB) string {
	t.Helper()
	admin := Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "registryd_empty_" + randomHex(8)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
		t.Fatalf("pgtest: create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, admin); err == nil {
			defer conn.Close(ctx)
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)")
		}
	})
	return WithDatabase(admin, name)
}

// closeWait bounds how long closing a test's store waits for its
// connections to be given back.
const closeWait = 10 * time.Second

// Open opens a store on url (a database from New, say) with opts, closed
// when the test ends. Closing waits for every connection to be given back;
// one that never is (a lock or a transaction left open) fails the test
// after closeWait instead of hanging it until go test's timeout.
func Open(t testing.TB, url string, opts store.Options) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("pgtest: open store: %v", err)
	}
	t.Cleanup(func() {
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			st.Close()
		}()
		select {
		case <-closed:
		case <-time.After(closeWait):
			t.Errorf("pgtest: closing the store: a connection was not given back within %s (a lock or transaction never ended)", closeWait)
		}
	})
	return st
}

// WithDatabase returns rawURL pointing at database name instead.
func WithDatabase(rawURL, name string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err) // rawURL came from this package
	}
	u.Path = "/" + name
	return u.String()
}

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	switch {
	case os.Getenv("TEST_DATABASE_URL") != "":
		adminURL = os.Getenv("TEST_DATABASE_URL")
	default:
		var ok bool
		adminURL, ok, setupErr = startContainer(ctx)
		if setupErr != nil || ok {
			break
		}
		adminURL, setupErr = startLocal(ctx)
	}
	if setupErr != nil {
		return
	}
	template, setupErr = ensureTemplate(ctx, adminURL)
}

// throwawayPrefix names the temp dirs of test clusters (and TempDir's).
const throwawayPrefix = "registryd-pgtest-"

// startLocal starts a throwaway cluster under the system temp dir, which the
// postgres system user can always enter (a checkout may not be).
//
// Main removes it after the tests, but a test binary that dies (a `go test
// -timeout` panic, SIGKILL) cannot: its server stops by itself (Pdeathsig)
// and the directory, named after the test process, is swept by the next
// run that starts a cluster.
func startLocal(ctx context.Context) (string, error) {
	removed, err := pglocal.SweepThrowaway(throwawayPrefix)
	if len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "pgtest: removed test cluster dirs left by dead test processes: %v\n", removed)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err) // leftovers are no reason to fail the tests
	}
	dir, err := pglocal.MkdirThrowaway(throwawayPrefix)
	if err != nil {
		return "", err
	}
	c, err := pglocal.Start(ctx, pglocal.Options{
		DataDir:   dir + "/data",
		Database:  "postgres",
		Ephemeral: true,
		Settings:  map[string]string{"max_connections": "300"},
	})
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("start local PostgreSQL (set TEST_DATABASE_URL to use another server): %w", err)
	}
	stopFns = append(stopFns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
		os.RemoveAll(dir)
	})
	return c.URLFor("postgres"), nil
}

// TempDir is a fresh directory under the system temp dir that the postgres
// system user can enter, for a test that starts its own cluster. It is
// removed when the test ends, or by a later run's sweep if the test binary
// dies first.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := pglocal.MkdirThrowaway(throwawayPrefix)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// ensureTemplate creates, once per schema, a migrated database to clone.
// An advisory lock serializes test processes that share one server.
func ensureTemplate(ctx context.Context, admin string) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "registryd_tmpl_" + sum
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7265676973)"); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock(7265676973)") //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	// A half-made template from a crashed run is not marked; start over.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
		return "", err
	}
	if err := migrate(ctx, WithDatabase(admin, name)); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH is_template true"); err != nil {
		return "", err
	}
	return name, nil
}

func migrate(ctx context.Context, dbURL string) error {
	st, err := store.Open(ctx, dbURL, store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	m, err := st.NewMigrator(nil)
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Up(ctx)
	return err
}

// migrationsHash names the template after the schema it holds.
func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(hex.EncodeToString(b))
}

// MigrationsWith is the embedded migrations and extra ones (file name →
// SQL), as the migrations of a later release would be: tests of upgrades
// give it to store.Options.Migrations.
func MigrationsWith(t testing.TB, extra map[string]string) fs.FS {
	t.Helper()
	out := fstest.MapFS{}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := fs.ReadFile(migrations.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = &fstest.MapFile{Data: b}
	}
	for n, sql := range extra {
		out[n] = &fstest.MapFile{Data: []byte(sql)}
	}
	return out
}

// Exec runs one statement on the database at url, on a connection of its
// own, failing the test if it fails.
func Exec(t testing.TB, url, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
