package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	stderr  string // the server's log file
	exited  chan struct{}
	waitErr error
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
	s := &server{dataDir: data, stderr: filepath.Join(dir, "serve.log"), exited: make(chan struct{})}
	logFile, err := os.Create(s.stderr)
	if err != nil {
		return nil, fmt.Errorf("bench: start server: %w", err)
	}
	defer logFile.Close()
	stdout := &lockedBuffer{}
	env := []string{}
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	env = append(env,
		"REGISTRY_DATA_DIR="+data,
		"REGISTRY_LISTEN=127.0.0.1:0",
		"REGISTRY_JWT_SECRET="+string(secret),
		// A node's liveness must not change under the measurement: the
		// seeded agents' nodes heartbeat only while the heartbeat
		// workload runs.
		"REGISTRY_NODE_TTL=24h",
	)
	env = append(env, extraEnv...)
	s.cmd = exec.Command(bin, "serve")
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = stdout, logFile
	// If the harness dies, the server (and so its PostgreSQL) goes too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start server: %w", err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if m := servingRE.FindStringSubmatch(stdout.String()); m != nil {
			s.url = m[1]
			break
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("bench: registryd serve exited before serving (%v); last log lines:\n%s", s.waitErr, s.logTail(20))
		case <-deadline.C:
			s.stop()
			return nil, fmt.Errorf("bench: registryd serve did not serve within %s; last log lines:\n%s", timeout, s.logTail(20))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	s.dbURL = s.findDatabaseURL()
	if s.dbURL == "" {
		s.stop()
		return nil, fmt.Errorf("bench: registryd serve runs, but its log names no embedded PostgreSQL URL; last log lines:\n%s", s.logTail(20))
	}
	if err := s.ready(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// findDatabaseURL reads the embedded cluster's URL from the server's log
// ("pglocal: cluster ready"), which names the socket directory however it
// was chosen.
func (s *server) findDatabaseURL() string {
	f, err := os.Open(s.stderr)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && strings.Contains(line.Msg, "cluster ready") && line.URL != "" {
			return line.URL
		}
	}
	return ""
}

// ready waits for /readyz to answer 200.
func (s *server) ready(ctx context.Context) error {
	c := &http.Client{Timeout: 2 * time.Second}
	var last error
	for range 100 {
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
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("bench: registryd serve is not ready: /readyz: %v", last)
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
// the harness reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
