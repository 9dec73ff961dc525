package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/client"
)

// script is a fake registryd answering each request with the next of its
// answers (the last one over and over), counting requests per path.
type script struct {
	t       *testing.T
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	hits    map[string]int
	bodies  []string
	headers []http.Header
}

func newScript(t *testing.T, answers ...func(w http.ResponseWriter, r *http.Request)) (*script, *httptest.Server) {
	s := &script{t: t, answers: answers, hits: map[string]int{}}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := s.hits[r.Method+" "+r.URL.Path]
	s.hits[r.Method+" "+r.URL.Path]++
	s.bodies = append(s.bodies, string(body))
	s.headers = append(s.headers, r.Header.Clone())
	answer := s.answers[min(n, len(s.answers)-1)]
	s.mu.Unlock()
	answer(w, r)
}

func (s *script) count(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[method+" "+path]
}

// problem answers a problem document with status (and Retry-After).
func problem(status int, retryAfter string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("X-Request-Id", "req-1")
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		io.WriteString(w, `{"type":"about:blank","title":"`+http.StatusText(status)+`","status":`+itoa(status)+`,"detail":"try later","request_id":"req-1"}`)
	}
}

// answer writes status with a JSON body.
func answer(status int, body string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-2")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// hangUp closes the connection without an answer.
func hangUp(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

const pingBody = `{"status":"ok","time":"2026-01-02T03:04:05Z"}`
const nodeBody = `{"pk":7,"ip":"10.0.0.7","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null,` +
	`"last_seen":null,"current_job":null,"owner":null,"source":"api","schedulable":true,"external_id":null,"provider_state":null,` +
	`"created_at":"2026-01-02T03:04:05Z","updated_at":"2026-01-02T03:04:05Z"}`

func fast(attempts int) client.Option {
	return client.WithRetry(client.Retry{Attempts: attempts, MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})
}

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{client.WithToken("t")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// 503 with Retry-After, then 200: the call succeeds, having waited as long
// as the server asked.
func TestRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	s, ts := newScript(t, problem(503, "1"), answer(200, pingBody))
	c := newClient(t, ts.URL, fast(4))
	var meta client.Response
	start := time.Now()
	p, err := c.Ping(t.Context(), client.Into(&meta))
	if err != nil || p.Status != "ok" {
		t.Fatalf("ping: %+v, %v", p, err)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("retried after %v; Retry-After asked for 1s", waited)
	}
	if meta.Attempts != 2 || s.count("GET", "/v1/nodes/ping") != 2 {
		t.Errorf("attempts %d, requests %d", meta.Attempts, s.count("GET", "/v1/nodes/ping"))
	}
}

// Every idempotent call is retried on 429, 503 and a lost connection:
// GET, HEAD, PUT, DELETE and the list POSTs; the body is sent again whole.
func TestRetryIdempotent(t *testing.T) {
	t.Parallel()
	for _, first := range []func(http.ResponseWriter, *http.Request){problem(503, ""), problem(429, "0"), hangUp} {
		s, ts := newScript(t, first, answer(200, "[]"))
		c := newClient(t, ts.URL, fast(3))
		ctx := t.Context()
		if _, err := c.ListNodes(ctx, client.NodeFilter{Free: client.Ptr(true)}); err != nil {
			t.Errorf("list: %v", err)
		}
		if _, err := c.ListHardware(ctx, client.HardwareFilter{}); err != nil {
			t.Errorf("list hardware: %v", err)
		}
		if _, err := c.ListAudit(ctx, client.AuditFilter{}); err != nil {
			t.Errorf("list audit: %v", err)
		}
		for _, path := range []string{"/v1/nodes/list", "/v1/hardware/list", "/v1/audit/list"} {
			if n := s.count("POST", path); n != 2 {
				t.Errorf("%s sent %d times, want 2", path, n)
			}
		}
		for i, b := range s.bodies {
			if i%2 == 1 && b != s.bodies[i-1] {
				t.Errorf("retried body %q, first %q", b, s.bodies[i-1])
			}
		}
	}
	s, ts := newScript(t, hangUp, answer(200, nodeBody))
	c := newClient(t, ts.URL, fast(3))
	if _, err := c.UpdateNode(t.Context(), 7, client.NodeUpdate{IP: "10.0.0.7", CPUMem: 1, DriverVersion: "d"}); err != nil {
		t.Errorf("put: %v", err)
	}
	if n := s.count("PUT", "/v1/nodes/7"); n != 2 {
		t.Errorf("PUT sent %d times", n)
	}
	s, ts = newScript(t, problem(503, ""), answer(204, ""))
	c = newClient(t, ts.URL, fast(3))
	if err := c.DeleteNode(t.Context(), 7); err != nil || s.count("DELETE", "/v1/nodes/7") != 2 {
		t.Errorf("delete: %v, sent %d times", err, s.count("DELETE", "/v1/nodes/7"))
	}
}

// Calls that change something each time are sent once, whatever comes
// back: create, claim, release, revoke and PATCH.
func TestRetryNotForNonIdempotent(t *testing.T) {
	t.Parallel()
	for _, first := range []func(http.ResponseWriter, *http.Request){problem(503, "0"), hangUp} {
		s, ts := newScript(t, first, answer(200, nodeBody))
		c := newClient(t, ts.URL, fast(4))
		ctx := t.Context()
		_, _, err := c.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.7", CPUMem: 1, DriverVersion: "d"})
		if err == nil {
			t.Error("create: no error")
		}
		_, err = c.ClaimNodes(ctx, client.NodeClaim{Job: 1})
		_, err2 := c.ReleaseNodes(ctx, client.NodeRelease{Job: 1})
		_, err3 := c.RevokeTokens(ctx, client.RevokeRequest{Sub: client.Ptr("x")})
		_, err4 := c.PatchNode(ctx, 7, client.NodePatch{DriverVersion: client.Ptr("e")})
		if err == nil || err2 == nil || err3 == nil || err4 == nil {
			t.Errorf("an error answer passed: %v %v %v %v", err, err2, err3, err4)
		}
		for _, call := range []string{"POST /v1/nodes/create", "POST /v1/nodes/claim", "POST /v1/nodes/release", "POST /v1/tokens/revoke", "PATCH /v1/nodes/7"} {
			method, path, _ := strings.Cut(call, " ")
			if n := s.count(method, path); n != 1 {
				t.Errorf("%s sent %d times, want once", call, n)
			}
		}
	}
}

// A claim or release sent with IdempotencyKey is retried after a 503 or
// a lost connection, every attempt carrying the same key; other calls do
// not send it. Fault caught (tried once): the key not counted as making a
// request idempotent (sent once).
func TestRetryWithIdempotencyKey(t *testing.T) {
	t.Parallel()
	for _, first := range []func(http.ResponseWriter, *http.Request){problem(503, "0"), hangUp} {
		s, ts := newScript(t, first, answer(200, `{"job":1,"nodes":[]}`))
		c := newClient(t, ts.URL, fast(4))
		key := client.NewIdempotencyKey()
		if _, err := c.ClaimNodes(t.Context(), client.NodeClaim{Job: 1}, client.IdempotencyKey(key)); err != nil {
			t.Fatalf("claim: %v", err)
		}
		if n := s.count("POST", "/v1/nodes/claim"); n != 2 {
			t.Errorf("claim sent %d times, want twice", n)
		}
		for i, h := range s.headers {
			if got := h.Get("Idempotency-Key"); got != key {
				t.Errorf("attempt %d: Idempotency-Key %q, want %q", i+1, got, key)
			}
		}
		_, _ = c.ListNodes(t.Context(), client.NodeFilter{}, client.IdempotencyKey(key)) // its answer is not a list: only what it sent counts
		if got := s.headers[len(s.headers)-1].Get("Idempotency-Key"); got != "" {
			t.Errorf("a list sent Idempotency-Key %q", got)
		}
	}
	if a, b := client.NewIdempotencyKey(), client.NewIdempotencyKey(); a == b || len(a) != 32 {
		t.Errorf("NewIdempotencyKey: %q and %q", a, b)
	}
}

// Attempts are bounded: after Attempts answers of 503 the last one comes
// back as the error, with what the server said.
func TestRetryBounded(t *testing.T) {
	t.Parallel()
	s, ts := newScript(t, problem(503, "0"))
	c := newClient(t, ts.URL, fast(3))
	var meta client.Response
	_, err := c.GetNode(t.Context(), 7, client.Into(&meta))
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 503 || e.Detail != "try later" || e.RequestID != "req-1" || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("error %v", err)
	}
	if n := s.count("GET", "/v1/nodes/7"); n != 3 || meta.Attempts != 3 {
		t.Errorf("sent %d times (attempts %d), want 3", n, meta.Attempts)
	}
	// Attempts: 1 turns retries off.
	s, ts = newScript(t, problem(503, "0"))
	c = newClient(t, ts.URL, fast(1))
	if _, err := c.GetNode(t.Context(), 7); !errors.Is(err, client.ErrUnavailable) || s.count("GET", "/v1/nodes/7") != 1 {
		t.Errorf("no retries: %v, sent %d", err, s.count("GET", "/v1/nodes/7"))
	}
	// A Retry-After beyond MaxRetryAfter is not slept on: the answer is the error.
	s, ts = newScript(t, problem(429, "3600"))
	c = newClient(t, ts.URL, client.WithRetry(client.Retry{MaxRetryAfter: time.Minute}))
	start := time.Now()
	_, err = c.GetNode(t.Context(), 7)
	if !errors.As(err, &e) || e.RetryAfter != time.Hour || time.Since(start) > 5*time.Second || s.count("GET", "/v1/nodes/7") != 1 {
		t.Errorf("Retry-After 3600: %v after %v", err, time.Since(start))
	}
	// Connection refused, every time: bounded too, and the error says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c = newClient(t, "http://"+addr, fast(3))
	if _, err := c.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("no server: %v", err)
	}
}

// A canceled context stops the retries at once, mid-wait.
func TestRetryStopsWithContext(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	s, ts := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		problem(503, "10")(w, r)
	})
	_ = s
	c := newClient(t, ts.URL, client.WithRetry(client.Retry{Attempts: 10}))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for hits.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	_, err := c.GetNode(ctx, 7)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned %v after the cancel", d)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("sent %d times", n)
	}
}

// An answer that is not a problem document (a proxy's page) is still an
// *Error, with its status and a line of what it said.
func TestErrorNotProblem(t *testing.T) {
	t.Parallel()
	_, ts := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>bad gateway</html>\nmore")
	})
	c := newClient(t, ts.URL, fast(1))
	_, err := c.Ping(t.Context())
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 502 || e.Detail != "<html>bad gateway</html>" || e.Title != "Bad Gateway" {
		t.Fatalf("error %#v", err)
	}
	if got := err.Error(); got != "registryd: GET /v1/nodes/ping: 502 Bad Gateway: <html>bad gateway</html>" {
		t.Errorf("message %q", got)
	}
}

// Headers a call sends: the token (a source is asked every time), Node-Id,
// If-Match, X-Request-Id; the merge patch has only what it sets.
func TestCallHeaders(t *testing.T) {
	t.Parallel()
	s, ts := newScript(t, answer(200, nodeBody))
	var n atomic.Int32
	c, err := client.New(ts.URL+"/", client.WithTokenSource(func(context.Context) (string, error) {
		return "tok-" + itoa(int(n.Add(1))), nil
	}), client.WithUserAgent("agent/1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.PatchNode(ctx, 7, client.NodePatch{DriverVersion: client.Ptr("560"), GPUMem: client.Null[int64](),
		HardwareGeneration: client.Value(int64(3))}, client.AsNode(7), client.IfMatch(`"4"`), client.RequestID("r-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(ctx, 7); err != nil {
		t.Fatal(err)
	}
	h := s.headers[0]
	if h.Get("Authorization") != "Bearer tok-1" || h.Get("Node-Id") != "7" || h.Get("If-Match") != `"4"` ||
		h.Get("X-Request-Id") != "r-1" || h.Get("Content-Type") != "application/merge-patch+json" || h.Get("User-Agent") != "agent/1" {
		t.Errorf("headers %v", h)
	}
	if got, want := s.bodies[0], `{"driver_version":"560","gpu_mem":null,"hardware_generation":3}`; got != want {
		t.Errorf("patch body %s, want %s", got, want)
	}
	if h := s.headers[1]; h.Get("Authorization") != "Bearer tok-2" || h.Get("Node-Id") != "" || h.Get("If-Match") != "" {
		t.Errorf("second call's headers %v", h)
	}
	if got := s.headers[0].Values("Node-Id"); len(got) != 1 {
		t.Errorf("PatchNode sent Node-Id %q, want it once", got)
	}
	// AsNode goes with any call, also one whose operation the spec does
	// not declare Node-Id for: the server takes it on every operation.
	hw, hts := newScript(t, answer(200, "[]"))
	c, _ = client.New(hts.URL)
	if _, err := c.ListHardware(ctx, client.HardwareFilter{}, client.AsNode(7)); err != nil {
		t.Fatal(err)
	}
	if got := hw.headers[0].Values("Node-Id"); len(got) != 1 || got[0] != "7" {
		t.Errorf("ListHardware AsNode(7) sent Node-Id %q, want 7 once", got)
	}
	// A token source that fails sends nothing.
	c, _ = client.New(ts.URL, client.WithTokenSource(func(context.Context) (string, error) { return "", errors.New("no token file") }))
	if _, err := c.Ping(ctx); err == nil || !strings.Contains(err.Error(), "no token file") || len(s.headers) != 2 {
		t.Errorf("failing token source: %v, %d requests", err, len(s.headers))
	}
	if _, err := client.New("registry:8080"); err == nil {
		t.Error("a server without a scheme was accepted")
	}
}

// TokenFile reads the token again for every request: a token rotated on
// disk is used from the next call on; an empty file sends nothing.
func TestTokenFile(t *testing.T) {
	t.Parallel()
	s, ts := newScript(t, answer(200, pingBody))
	path := filepath.Join(t.TempDir(), "token")
	write := func(v string) {
		if err := os.WriteFile(path, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first\n")
	c, err := client.New(ts.URL, client.WithTokenSource(client.TokenFile(path)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	write("  second  \n")
	if _, err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	write("\n")
	if _, err := c.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: %v", err)
	}
	if got := []string{s.headers[0].Get("Authorization"), s.headers[1].Get("Authorization")}; got[0] != "Bearer first" || got[1] != "Bearer second" || len(s.headers) != 2 {
		t.Errorf("tokens sent %q (%d requests)", got, len(s.headers))
	}
}
