package pglocal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// needBinaries skips when the server is not installed, except in CI, where
// a missing server must fail loudly instead of silently testing nothing.
func needBinaries(t *testing.T) string {
	t.Helper()
	dir, err := FindBinDir()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	return dir
}

// reachableTempDir is t.TempDir() made traversable for the server user:
// testing creates its parent with os.MkdirTemp, i.e. mode 0700, which the
// postgres user cannot enter when the tests run as root.
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func stop(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryString(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestStartStopReuse(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	dir := filepath.Join(reachableTempDir(t), "data")
	opts := Options{
		DataDir:   dir,
		Ephemeral: true,
		Logger:    testLogger(t),
		Settings:  map[string]string{"max_connections": "20"},
	}

	c := start(t, opts)
	if c.DataDir() != dir {
		t.Errorf("DataDir() = %q, want %q", c.DataDir(), dir)
	}
	conn := connect(t, c.URL())
	if got := queryString(t, conn, "SELECT 1::text"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
	if got := queryString(t, conn, "SELECT current_database()"); got != "registry" {
		t.Errorf("current_database() = %q, want registry", got)
	}
	if got := queryString(t, conn, "SHOW max_connections"); got != "20" {
		t.Errorf("max_connections = %q, want 20 from Settings", got)
	}
	if got := queryString(t, conn, "SHOW fsync"); got != "off" {
		t.Errorf("fsync = %q, want off for Ephemeral", got)
	}
	if got := queryString(t, conn, "SHOW listen_addresses"); got != "" {
		t.Errorf("listen_addresses = %q, want none", got)
	}
	if _, err := conn.Exec(context.Background(), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())

	// A second Start on a live cluster must refuse rather than fight over it.
	_, err := Start(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "another PostgreSQL") {
		t.Errorf("Start on a running cluster: got %v, want 'another PostgreSQL' error", err)
	}

	stop(t, c)
	stop(t, c) // idempotent

	// A server that dies during start-up is explained by its own words.
	bad := opts
	bad.Settings = map[string]string{"no_such_setting": "1"}
	_, err = Start(context.Background(), bad)
	if err == nil || !strings.Contains(err.Error(), `unrecognized configuration parameter "no_such_setting"`) {
		t.Errorf("Start with a bad setting: got %v, want the server's log in the error", err)
	}

	c = start(t, opts)
	conn = connect(t, c.URL())
	if got := queryString(t, conn, "SELECT v FROM kept"); got != "still here" {
		t.Errorf("after restart: got %q", got)
	}
	conn.Close(context.Background())
	stop(t, c)

	testServerStopsWithUs(t, dir)
}

// testServerStopsWithUs starts the cluster in dir from a child process,
// SIGKILLs that process and expects the server to shut down by itself
// (Pdeathsig) rather than linger.
func testServerStopsWithUs(t *testing.T, dir string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndHang$")
	cmd.Env = append(os.Environ(), "PGLOCAL_HELPER_DATADIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, convErr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "postmaster "))
	if err != nil || convErr != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("helper said %q: %v %v", line, err, convErr)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); isPostgres(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			t.Fatalf("postmaster %d still running after its parent died", pid)
		}
	}
}

// TestHelperStartAndHang is the child side of testServerStopsWithUs.
func TestHelperStartAndHang(t *testing.T) {
	dir := os.Getenv("PGLOCAL_HELPER_DATADIR")
	if dir == "" {
		t.Skip("helper process for TestStartStopReuse")
	}
	c, err := Start(context.Background(), Options{DataDir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("postmaster %d\n", c.current().proc.Pid)
	time.Sleep(time.Minute) // until killed; Pdeathsig stops the server even if nobody does
}

func TestLongPathUsesTempSocketDir(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	dir := filepath.Join(reachableTempDir(t), strings.Repeat("d", 60), strings.Repeat("e", 40))
	c := start(t, Options{DataDir: dir, Database: "other db", Ephemeral: true, Logger: testLogger(t)})
	if !c.tempSock || strings.HasPrefix(c.sockDir, dir) {
		t.Fatalf("socket dir %q: want a temporary one for a %d-byte data dir", c.sockDir, len(dir))
	}
	conn := connect(t, c.URL())
	if got := queryString(t, conn, "SELECT current_database()"); got != "other db" {
		t.Errorf("current_database() = %q", got)
	}
	conn = connect(t, c.URLFor("postgres"))
	if got := queryString(t, conn, "SELECT count(*)::text FROM pg_database WHERE datname = $1", "other db"); got != "1" {
		t.Errorf("database count = %s", got)
	}
	conn.Close(context.Background())
	stop(t, c)
	if _, err := os.Stat(c.sockDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp socket dir not removed: %v", err)
	}
}

func TestRefusesNonEmptyNonCluster(t *testing.T) {
	t.Parallel()
	dir := reachableTempDir(t)
	keep := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A bogus BinDir: the refusal must come before any binary is needed.
	_, err := Start(context.Background(), Options{DataDir: dir, BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("got %v, want a 'not empty' refusal", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("user file touched: %v", err)
	}
}

func TestCheckAccess(t *testing.T) {
	t.Parallel()
	base := reachableTempDir(t)
	if err := CheckAccess(filepath.Join(base, "data")); err != nil {
		t.Errorf("reachable dir: %v", err)
	}

	// As root the server runs as postgres, which a root-owned 0700 dir
	// shuts out; as anyone else only a dir without our own x bit does.
	mode := os.FileMode(0o700)
	if os.Geteuid() != 0 {
		mode = 0o600
	}
	locked := filepath.Join(base, "locked")
	if err := os.Mkdir(locked, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(locked, mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(locked, 0o700) }) // let TempDir's cleanup in
	err := CheckAccess(filepath.Join(locked, "child", "data"))
	if err == nil || !strings.Contains(err.Error(), "enter "+locked+" ") || !strings.Contains(err.Error(), "chmod o+x "+locked) {
		t.Errorf("got %v, want an error naming %s and the chmod fix", err, locked)
	}

	// A symlink into the locked dir is judged by its target's path too.
	link := filepath.Join(base, "link")
	if err := os.Symlink(filepath.Join(locked), link); err != nil {
		t.Fatal(err)
	}
	if err := CheckAccess(filepath.Join(link, "data")); err == nil {
		t.Error("symlink into locked dir: want an error")
	}
}

func TestFindBinDirMissing(t *testing.T) {
	t.Setenv("PATH", "")
	for _, bindir := range []string{t.TempDir(), ""} {
		t.Setenv("PG_BINDIR", bindir)
		_, err := findBinDir(os.Getenv, filepath.Join(t.TempDir(), "*", "bin"))
		if !errors.Is(err, ErrNoServerBinaries) {
			t.Fatalf("PG_BINDIR=%q: got %v, want ErrNoServerBinaries", bindir, err)
		}
		for _, want := range []string{"apt-get install postgresql", "REGISTRY_DATABASE_URL", "docker compose up"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("PG_BINDIR=%q: error %q does not mention %q", bindir, err, want)
			}
		}
	}
}

// fakeBinDir makes dir look like a server installation.
func fakeBinDir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "postgres"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindBinDirOrder(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	glob := filepath.Join(root, "lib", "*", "bin")
	fakeBinDir(t, filepath.Join(root, "lib", "9.6", "bin"))
	v10 := fakeBinDir(t, filepath.Join(root, "lib", "10", "bin"))
	onPath := fakeBinDir(t, filepath.Join(root, "path"))
	override := fakeBinDir(t, filepath.Join(root, "override"))

	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	tests := []struct {
		name string
		env  map[string]string
		glob string
		want string
	}{
		{"override wins", map[string]string{"PG_BINDIR": override, "PATH": onPath}, glob, override},
		{"highest version, numerically", map[string]string{"PATH": onPath}, glob, v10},
		{"PATH last", map[string]string{"PATH": "/nonexistent:" + onPath}, filepath.Join(root, "none", "*"), onPath},
	}
	for _, tt := range tests {
		got, err := findBinDir(env(tt.env), tt.glob)
		if err != nil || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestURLEscaping(t *testing.T) {
	t.Parallel()
	c := &Cluster{sockDir: "/tmp/a b&c=d+e", database: "my db/x?"}
	cfg, err := pgx.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != c.sockDir || cfg.Database != c.database || cfg.Port != port || cfg.User != "postgres" {
		t.Errorf("%s parsed as host=%q db=%q port=%d user=%q", c.URL(), cfg.Host, cfg.Database, cfg.Port, cfg.User)
	}
}

func TestStalePidFileIgnored(t *testing.T) {
	t.Parallel()
	// A pid that certainly belonged to a process that has exited.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	pidFile := strconv.Itoa(cmd.Process.Pid) + "\n" + dir + "\n"
	if err := os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(pidFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dataDir: dir}
	if err := c.checkNotRunning(runAs{}); err != nil {
		t.Errorf("stale pid file: %v", err)
	}
	// Our own (live, non-postgres) pid is not a running server either.
	pidFile = strconv.Itoa(os.Getpid()) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(pidFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.checkNotRunning(runAs{}); err != nil {
		t.Errorf("pid of a non-postgres process: %v", err)
	}
}
