package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// nofileChildEnv makes this test binary, re-executed, run `registryd serve`
// under RLIMIT_NOFILE set to its value.
const nofileChildEnv = "REGISTRYD_TEST_SERVE_NOFILE"

// serveUnderNoFile is the child: it lowers its own descriptor limit, soft
// and hard, so the server cannot raise it back, then serves until SIGTERM.
func serveUnderNoFile(t *testing.T, n string) {
	nofile, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: nofile, Max: nofile}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := run(ctx, []string{"serve"}, os.Getenv, os.Stdout, os.Stderr); err != nil {
		t.Fatal(err)
	}
}

// httpConn is one raw keep-alive connection.
type httpConn struct {
	c  net.Conn
	br *bufio.Reader
}

// healthz sends GET /healthz on c and waits at most d for a 200.
func (c *httpConn) healthz(d time.Duration) error {
	_ = c.c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c.c, "GET /healthz HTTP/1.1\r\nHost: registryd\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

var limitLogRE = regexp.MustCompile(`"msg":"connection limit derived from the file descriptor limit","max_connections":(\d+),"nofile":(\d+),"reserve":(\d+)`)

// Finding 4 of issue 8: with the descriptor limit low, idle keep-alive
// connections used every descriptor and new clients got nothing. Here the
// real server runs in a child process whose RLIMIT_NOFILE is 256; the
// test holds more idle connections than that, and a new client must still
// be answered within 3s. The connection limit is the documented one:
// 256 - (pool 4 + 64) = 188.
func TestServeUnderDescriptorLimit(t *testing.T) {
	if n := os.Getenv(nofileChildEnv); n != "" {
		serveUnderNoFile(t, n)
		return
	}
	t.Parallel()
	const nofile, pool, held = 256, 4, 300
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeUnderDescriptorLimit$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		nofileChildEnv+"="+strconv.Itoa(nofile),
		"REGISTRY_DATABASE_URL="+pgtest.New(t),
		"REGISTRY_JWT_SECRET="+testSecret,
		"REGISTRY_LISTEN=127.0.0.1:0",
		"REGISTRY_DB_MAX_CONNS="+strconv.Itoa(pool),
		"REGISTRY_LOG_FORMAT=json",
		"REGISTRY_LOG_LEVEL=info",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive a killed test
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &apitest.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	var addr string
	select {
	case u := <-urls:
		addr = strings.TrimPrefix(u, "http://")
	case <-time.After(60 * time.Second):
		t.Fatalf("the server did not start; stderr:\n%s", stderr.String())
	}

	// The limit is logged before the address, but through another pipe.
	var m []string
	for deadline := time.Now().Add(10 * time.Second); m == nil; time.Sleep(10 * time.Millisecond) {
		if m = limitLogRE.FindStringSubmatch(stderr.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("no connection limit in the log:\n%s", stderr.String())
		}
	}
	if want := fmt.Sprint(nofile - pool - 64); m[1] != want || m[2] != fmt.Sprint(nofile) || m[3] != fmt.Sprint(pool+64) {
		t.Errorf("logged limit %s (nofile %s, reserve %s), want %s", m[1], m[2], m[3], want)
	}

	dial := func() (*httpConn, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		return &httpConn{c: c, br: bufio.NewReader(c)}, nil
	}
	// Hold more idle keep-alive connections than the process has
	// descriptors, each after one GET /healthz. Without a limit the
	// server runs out of descriptors on the way and stops accepting.
	var conns []*httpConn
	for i := range held {
		c, err := dial()
		if err == nil {
			err = c.healthz(5 * time.Second)
		}
		if err != nil {
			t.Logf("connection %d of %d was not served: %v", i, held, err)
			break
		}
		conns = append(conns, c)
	}
	newcomer, err := dial()
	if err == nil {
		err = newcomer.healthz(3 * time.Second)
	}
	if err != nil {
		t.Fatalf("with %d idle connections held, a new client was not answered within 3s: %v", len(conns), err)
	}
	if len(conns) != held {
		t.Errorf("only %d of %d connections were served", len(conns), held)
	}
	// The oldest idle connections were the ones closed to make room.
	_ = conns[0].c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conns[0].br.Peek(1); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the oldest idle connection is still open: %v", err)
	}
	if err := conns[len(conns)-1].healthz(3 * time.Second); err != nil {
		t.Errorf("the newest idle connection: %v", err)
	}
}

func TestLimitsConfig(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"REGISTRY_MAX_CONNECTIONS": "0"},
		{"REGISTRY_MAX_CONNECTIONS": "many"},
		{"REGISTRY_WATCH_MAX_STREAMS": "-1"},
		{"REGISTRY_WATCH_MAX_PER_PRINCIPAL": "0"},
		{"REGISTRY_WATCH_BUFFER_BYTES": "1000"},
		{"REGISTRY_WATCH_BACKFILL_CONCURRENCY": "none"},
	} {
		_, err := loadConfig(envFunc(env))
		for k := range env {
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%v: error %v does not name %s", env, err, k)
			}
		}
	}
	cfg, err := loadConfig(envFunc(map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (limits{WatchMaxPerPrincipal: 64, WatchBufferBytes: 1 << 20}); cfg.limits != want {
		t.Errorf("defaults %+v, want %+v", cfg.limits, want)
	}
	logger := slog.New(slog.DiscardHandler)
	// Derived: watch streams take at most half the connections (and at
	// most 10,000); backfills a quarter of the pool.
	for _, tc := range []struct {
		in   limits
		pool int
		want limits
	}{
		{limits{MaxConnections: 956}, 4, limits{MaxConnections: 956, WatchMaxStreams: 478, WatchBackfillConcurrency: 1}},
		{limits{MaxConnections: 100_000}, 16, limits{MaxConnections: 100_000, WatchMaxStreams: 10_000, WatchBackfillConcurrency: 4}},
		{limits{MaxConnections: 1, WatchMaxStreams: 7, WatchBackfillConcurrency: 3}, 4, limits{MaxConnections: 1, WatchMaxStreams: 7, WatchBackfillConcurrency: 3}},
	} {
		if got := deriveLimits(tc.in, tc.pool, logger); got != tc.want {
			t.Errorf("deriveLimits(%+v, pool %d) = %+v, want %+v", tc.in, tc.pool, got, tc.want)
		}
	}
	if got := deriveLimits(limits{}, 4, logger); got.MaxConnections < 16 || got.WatchMaxStreams != max(1, min(got.MaxConnections/2, 10_000)) {
		t.Errorf("derived from this process's limit: %+v", got)
	}
}

// The limits reach the server from the environment: explicit connection
// limit, total and per-principal watch caps.
func TestServeLimitsFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_MAX_CONNECTIONS": "3", "REGISTRY_WATCH_MAX_STREAMS": "2", "REGISTRY_WATCH_MAX_PER_PRINCIPAL": "1"}
	srv := startServer(t, env)
	addr := strings.TrimPrefix(srv.url, "http://")
	token := func(sub string) string {
		out, stderr, err := runCmd(t, env, "token", "--sub", sub, "--role", "reader")
		if err != nil {
			t.Fatalf("token: %v\n%s", err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[len(lines)-1]
	}
	dial := func() *httpConn {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &httpConn{c: c, br: bufio.NewReader(c)}
	}
	watch := func(tok string) int {
		c := dial()
		_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c.c, "GET /v1/nodes/watch HTTP/1.1\r\nHost: registryd\r\nAuthorization: Bearer %s\r\n\r\n", tok)
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp.StatusCode
	}
	a, b, c := token("a"), token("b"), token("c")
	if code := watch(a); code != 200 {
		t.Fatalf("first stream: %d", code)
	}
	if code := watch(a); code != http.StatusTooManyRequests {
		t.Errorf("a second stream of one principal: %d, want 429", code)
	}
	if code := watch(b); code != 200 {
		t.Fatalf("another principal's stream: %d", code)
	}
	if code := watch(c); code != http.StatusTooManyRequests {
		t.Errorf("a third stream in all: %d, want 429", code)
	}
	// Two of the three connections stream; the third slot goes to the
	// newest client, the idle one before it is closed.
	first := dial()
	if err := first.healthz(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := dial().healthz(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_ = first.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.br.Peek(1); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("with REGISTRY_MAX_CONNECTIONS=3 and two streams, the idle connection was not closed for a newcomer: %v", err)
	}
}
