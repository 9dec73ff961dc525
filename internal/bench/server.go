package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is a `registryd serve` the harness started on the embedded
// PostgreSQL in a data folder of its own.
type server struct {
	cmd     *exec.Cmd
	url     string // http://127.0.0.1:PORT
	dbURL   string // the embedded PostgreSQL, over its unix socket
	dataDir string
	// replica: a second serve on another server's database (dbURL set
	// from the start), with no embedded PostgreSQL of its own.
	replica bool
	stderr  string // the server's log file
	exited  chan struct{}
	waitErr error

	// What start execs again on a restart.
	bin     string
	env     []string
	timeout time.Duration
}

// passEnv are the variables of the harness's environment a server it
// starts sees; every REGISTRY_ one it is not given is left out, so a
// REGISTRY_DATABASE_URL of the shell cannot turn the embedded run into a
// run against another database.
var passEnv = []string{"PATH", "HOME", "LANG", "TMPDIR", "PG_BINDIR"}

var servingRE = regexp.MustCompile(`registryd is serving on (http://\S+)`)

// startServer runs bin serve on a fresh embedded PostgreSQL in a new
// folder under dir, signing tokens with secret, and waits (at most
// timeout) until it serves. extraEnv (NAME=VALUE) comes last, so it wins.
// A server that exits first is an error that quotes its last log lines.
func startServer(ctx context.Context, bin, dir string, secret []byte, timeout time.Duration, extraEnv []string) (*server, error) {
	data, err := os.MkdirTemp(dir, "data")
	if err != nil {
		return nil, fmt.Errorf("bench: start server: %w", err)
	}
	// Running as root, the embedded PostgreSQL runs as the postgres user,
	// who must be able to enter the folders.
	for _, d := range []string{dir, data} {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("bench: start server: %w", err)
		}
	}
	s := &server{bin: bin, dataDir: data, stderr: filepath.Join(dir, "serve.log"), timeout: timeout}
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			s.env = append(s.env, k+"="+v)
		}
	}
	s.env = append(s.env,
		"REGISTRY_DATA_DIR="+data,
		"REGISTRY_LISTEN=127.0.0.1:0",
		"REGISTRY_JWT_SECRET="+string(secret),
		// A node's liveness must not change under the measurement: the
		// seeded agents' nodes heartbeat only while the heartbeat
		// workload runs.
		"REGISTRY_NODE_TTL=24h",
	)
	s.env = append(s.env, extraEnv...)
	if _, err := s.start(ctx, os.O_TRUNC); err != nil {
		return nil, err
	}
	return s, nil
}

// startReplica runs bin serve on primary's database (a second replica,
// as a deployment runs several), logging to replica.log in dir.
func startReplica(ctx context.Context, primary *server, dir string, extraEnv []string) (*server, error) {
	s := &server{bin: primary.bin, dbURL: primary.dbURL, replica: true, stderr: filepath.Join(dir, "replica.log"), timeout: primary.timeout}
	for _, kv := range primary.env {
		if !strings.HasPrefix(kv, "REGISTRY_DATA_DIR=") && !strings.HasPrefix(kv, "REGISTRY_DATABASE_URL=") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, "REGISTRY_DATABASE_URL="+primary.dbURL)
	s.env = append(s.env, extraEnv...)
	if _, err := s.start(ctx, os.O_TRUNC); err != nil {
		return nil, err
	}
	return s, nil
}

// startTimes is how long a start took, from exec: until the banner
// ("registryd is serving on") was written, and until /readyz answered 200;
// for a restart also how long the stop before it took (SIGTERM to exit).
type startTimes struct {
	banner, ready, stop time.Duration
}

// start execs bin serve on s.dataDir (logFlag: os.O_TRUNC for the first
// start, os.O_APPEND for a restart, which keeps the earlier log) and
// waits, at most s.timeout, until it serves and /readyz answers 200.
func (s *server) start(ctx context.Context, logFlag int) (startTimes, error) {
	var st startTimes
	logFile, err := os.OpenFile(s.stderr, os.O_WRONLY|os.O_CREATE|logFlag, 0o644)
	if err != nil {
		return st, fmt.Errorf("bench: start server: %w", err)
	}
	defer logFile.Close()
	// This start's log begins where the last one's ended: the URL is
	// looked for there, not in millions of access log lines before it.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return st, fmt.Errorf("bench: start server: %w", err)
	}
	stdout := &lockedBuffer{match: servingRE, matched: make(chan struct{})}
	s.exited, s.waitErr = make(chan struct{}), nil
	s.cmd = exec.Command(s.bin, "serve")
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = stdout, logFile
	// If the harness dies, the server (and so its PostgreSQL) goes too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	t0 := time.Now()
	if err := s.cmd.Start(); err != nil {
		s.waitErr = err
		close(s.exited) // nothing runs: stop has nothing to wait for
		return st, fmt.Errorf("bench: start server: %w", err)
	}
	cmd, exited := s.cmd, s.exited
	go func() {
		err := cmd.Wait()
		s.waitErr = err
		close(exited)
	}()
	deadline := time.NewTimer(s.timeout)
	defer deadline.Stop()
	select {
	case <-stdout.matched:
		st.banner = stdout.matchedAt.Sub(t0)
		s.url = servingRE.FindStringSubmatch(stdout.String())[1]
	case <-s.exited:
		return st, fmt.Errorf("bench: registryd serve exited before serving (%v); last log lines:\n%s", s.waitErr, s.logTail(20))
	case <-deadline.C:
		s.stop()
		return st, fmt.Errorf("bench: registryd serve did not serve within %s; last log lines:\n%s", s.timeout, s.logTail(20))
	case <-ctx.Done():
		s.stop()
		return st, ctx.Err()
	}
	if !s.replica {
		s.dbURL = s.findDatabaseURL(logStart)
	}
	if s.dbURL == "" {
		s.stop()
		return st, fmt.Errorf("bench: registryd serve runs, but its log names no embedded PostgreSQL URL; last log lines:\n%s", s.logTail(20))
	}
	if err := s.ready(ctx, deadline.C); err != nil {
		s.stop()
		return st, err
	}
	st.ready = time.Since(t0)
	return st, nil
}

// restart stops the server (SIGTERM, waiting for it and its PostgreSQL)
// and starts it again on the same data folder, with the same secret and
// settings, and says how long the start took. The new server listens on a
// new port: s.url changes.
func (s *server) restart(ctx context.Context) (startTimes, error) {
	t0 := time.Now()
	if err := s.stop(); err != nil {
		return startTimes{}, err
	}
	stopped := time.Since(t0)
	st, err := s.start(ctx, os.O_APPEND)
	st.stop = stopped
	return st, err
}

// findDatabaseURL reads the embedded cluster's URL from the server's log
// ("pglocal: cluster ready"), which names the socket directory however it
// was chosen: the last one from offset on, which is this start's.
func (s *server) findDatabaseURL(offset int64) string {
	f, err := os.Open(s.stderr)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	url := ""
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if !bytes.Contains(sc.Bytes(), []byte("cluster ready")) {
			continue
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && strings.Contains(line.Msg, "cluster ready") && line.URL != "" {
			url = line.URL
		}
	}
	return url
}

// readyPoll is how often ready asks /readyz: often enough that a start's
// time to ready is measured to about this much.
const readyPoll = 5 * time.Millisecond

// ready waits until /readyz answers 200, or deadline fires.
func (s *server) ready(ctx context.Context, deadline <-chan time.Time) error {
	c := &http.Client{Timeout: 2 * time.Second}
	defer c.CloseIdleConnections()
	var last error
	for {
		resp, err := c.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.exited:
			return fmt.Errorf("bench: registryd serve exited (%v); last log lines:\n%s", s.waitErr, s.logTail(20))
		case <-deadline:
			return fmt.Errorf("bench: registryd serve is not ready within %s: /readyz: %v", s.timeout, last)
		case <-time.After(readyPoll):
		}
	}
}

// stop sends SIGTERM and waits for the server (which stops its
// PostgreSQL) to exit; after 60 s it kills it.
func (s *server) stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("bench: registryd serve did not stop within 60 s of SIGTERM; killed")
	}
	var ee *exec.ExitError
	if s.waitErr != nil && !errors.As(s.waitErr, &ee) {
		return s.waitErr
	}
	return nil
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// postmasterPID is the embedded PostgreSQL's postmaster, from its pid file.
func (s *server) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(s.dataDir, "postgres", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

func (s *server) logTail(n int) string {
	b, _ := os.ReadFile(s.stderr)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// lockedBuffer is a bytes.Buffer the child's output goroutine writes and
// the harness reads. When the output first matches match, it notes the
// time and closes matched.
type lockedBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	match     *regexp.Regexp
	matched   chan struct{}
	matchedAt time.Time // set before matched is closed
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.match != nil && b.matchedAt.IsZero() && b.match.Match(b.buf.Bytes()) {
		b.matchedAt = now
		close(b.matched)
	}
	return n, err
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitForLog waits until the file at path holds a line containing what
// past its first from bytes (what an earlier start wrote), for at most
// timeout.
func waitForLog(ctx context.Context, path string, from int64, what string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if int64(len(b)) > from && bytes.Contains(b[from:], []byte(what)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not log %q within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
