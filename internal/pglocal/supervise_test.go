package pglocal

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
)

// supervised runs Supervise on c until the test ends (or it returns).
type supervised struct {
	done chan struct{}
	err  error
	stop context.CancelFunc
}

func supervise(t *testing.T, c *Cluster, opts SuperviseOptions) *supervised {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &supervised{done: make(chan struct{}), stop: cancel}
	go func() {
		defer close(s.done)
		s.err = c.Supervise(ctx, opts)
	}()
	t.Cleanup(func() { cancel(); <-s.done })
	return s
}

// wait waits for Supervise to return, at most limit.
func (s *supervised) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(limit):
		t.Fatalf("Supervise still running after %s", limit)
		return nil
	}
}

// up reports whether the supervised cluster counts itself up again.
func up(c *Cluster) bool {
	_, down := c.DownSince()
	return !down
}

// queryWorks reports whether a fresh connection answers within a second.
func queryWorks(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one) == nil
}

// logBuffer collects log output for a test to read while goroutines write.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// recordingLogger logs to the test and to the returned buffer.
func recordingLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), buf), &slog.HandlerOptions{Level: slog.LevelInfo})), buf
}

// The server is brought back after a SIGKILL (with a backend left behind
// that keeps its shared memory attached), after a clean stop nobody asked
// for, and after a failing spell; the URL never changes; Stop in the middle
// of failing restarts ends it all.
func TestSuperviseRestarts(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	dir := filepath.Join(reachableTempDir(t), "data")
	logger, logs := recordingLogger(t)
	c := start(t, Options{DataDir: dir, Ephemeral: true, Logger: logger})
	url := c.URL()
	sup := supervise(t, c, SuperviseOptions{Attempts: 100, Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})

	// SIGKILL, while a stopped backend keeps the old shared memory in use:
	// unless the leftovers are killed first, the new postmaster refuses to
	// start ("pre-existing shared memory block ... is still in use").
	conn := connect(t, url)
	var backend int
	if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(backend, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	old := c.current()
	if err := syscall.Kill(old.proc.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.exited
	apitest.Eventually(t, 30*time.Second, "restart after SIGKILL", func() bool { return up(c) && queryWorks(url) })
	if st, err := readProcStat(backend); err == nil && st.state != 'Z' {
		t.Errorf("the stopped backend %d of the killed server still runs", backend)
	}
	if l := logs.String(); !strings.Contains(l, `msg="pglocal: postgres restarted"`) || strings.Contains(l, "restart failed") {
		t.Errorf("want a restart at the first attempt; log:\n%s", l)
	}

	// A clean fast shutdown nobody asked for (SIGINT, as pg_ctl stop -m fast).
	old = c.current()
	if err := old.proc.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-old.exited
	apitest.Eventually(t, 30*time.Second, "restart after SIGINT", func() bool { return up(c) && queryWorks(url) })

	// Restarts fail while the data directory is gone: the cluster reports
	// itself down since the kill, and comes back once it returns.
	away := dir + ".away"
	if err := os.Rename(dir, away); err != nil {
		t.Fatal(err)
	}
	old = c.current()
	killedAt := time.Now()
	if err := syscall.Kill(old.proc.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.exited
	since, down := c.DownSince()
	if !down || since.Before(killedAt) || time.Since(since) > 10*time.Second {
		t.Fatalf("DownSince = %v, %v after the kill at %v", since, down, killedAt)
	}
	apitest.Eventually(t, 10*time.Second, "failed restarts", func() bool { return strings.Count(logs.String(), "restart failed") >= 3 })
	if s2, down := c.DownSince(); !down || !s2.Equal(since) {
		t.Errorf("DownSince while restarts fail = %v, %v; want %v, true", s2, down, since)
	}
	if err := os.Rename(away, dir); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 30*time.Second, "restart once the data is back", func() bool { return up(c) && queryWorks(url) })

	// Stop while restarts are failing, then the data comes back: no
	// restart may follow, and Supervise returns nil.
	if err := os.Rename(dir, away); err != nil {
		t.Fatal(err)
	}
	old = c.current()
	_ = syscall.Kill(old.proc.Pid, syscall.SIGKILL)
	<-old.exited
	failed := strings.Count(logs.String(), "restart failed")
	apitest.Eventually(t, 10*time.Second, "a failed restart", func() bool { return strings.Count(logs.String(), "restart failed") > failed })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = c.Stop(ctx) // reports the kill
	if err := os.Rename(away, dir); err != nil {
		t.Fatal(err)
	}
	if err := sup.wait(t, 10*time.Second); err != nil {
		t.Errorf("Supervise after Stop: %v", err)
	}
	if c.current() != old {
		t.Error("a server was started after Stop")
	}
	if pids := serverProcesses(dir); len(pids) > 0 {
		t.Errorf("postgres processes %v still running after Stop", pids)
	}
	if _, down := c.DownSince(); down {
		t.Error("DownSince reports down after Stop")
	}
}

// A Stop asked for is not a crash: Supervise returns nil without a
// restart or an alarm.
func TestSuperviseCleanStop(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	logger, logs := recordingLogger(t)
	c := start(t, Options{DataDir: filepath.Join(reachableTempDir(t), "data"), Ephemeral: true, Logger: logger})
	sup := supervise(t, c, SuperviseOptions{})
	old := c.current()
	stop(t, c)
	if err := sup.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if c.current() != old || strings.Contains(logs.String(), "exited unexpectedly") {
		t.Errorf("Stop was taken for a crash; log:\n%s", logs.String())
	}
}

// A server that cannot be restarted makes Supervise give up with the
// reason, after the configured number of attempts.
func TestSuperviseGivesUp(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	dir := filepath.Join(reachableTempDir(t), "data")
	c := start(t, Options{DataDir: dir, Ephemeral: true, Logger: testLogger(t)})
	sup := supervise(t, c, SuperviseOptions{Attempts: 3, Backoff: 10 * time.Millisecond})
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Rename(dir+".away", dir) })
	if err := syscall.Kill(c.current().proc.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := sup.wait(t, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "could not be restarted (3 attempts)") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Supervise: %v; want it to give up after 3 attempts naming %s", err, dir)
	}
	if _, down := c.DownSince(); !down {
		t.Error("DownSince: want down after giving up")
	}
}

// A server that starts again but dies soon after, every time, is a crash
// loop: each such restart counts as failed (the server was not up for
// StableAfter), so Supervise gives up after Attempts of them instead of
// restarting it forever, and the caller can exit for its own supervisor.
func TestSuperviseGivesUpOnCrashLoop(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	dir := filepath.Join(reachableTempDir(t), "data")
	c := start(t, Options{DataDir: dir, Ephemeral: true, Logger: testLogger(t)})
	sup := supervise(t, c, SuperviseOptions{Attempts: 3, Backoff: 10 * time.Millisecond, StableAfter: time.Hour})
	// Kill every postmaster as soon as it is up, until Supervise returns.
	killed := map[int]bool{}
	deadline := time.After(60 * time.Second)
	for done := false; !done; {
		if s := c.current(); up(c) && !killed[s.proc.Pid] {
			killed[s.proc.Pid] = true
			if err := syscall.Kill(s.proc.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-sup.done:
			done = true
		case <-deadline:
			t.Fatalf("Supervise still restarting after 60s and %d kills", len(killed))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := sup.err; err == nil || !strings.Contains(err.Error(), "could not be restarted") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Supervise: %v; want it to give up naming %s", err, dir)
	}
	// The first kill ends a server that was up all along; the restarts
	// after it are the loop: Attempts of them, then no more.
	if len(killed) != 1+3 {
		t.Errorf("%d servers killed, want 4: the first and 3 restarts", len(killed))
	}
	if _, down := c.DownSince(); !down {
		t.Error("DownSince: want down after giving up")
	}
}
