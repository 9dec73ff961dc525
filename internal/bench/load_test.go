package bench

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The load generator counts every failed op by kind, keeps the first of
// each, and makes its rate and latencies of the successes alone.
func TestGenerateCountsErrorsApart(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			http.Error(w, `{"title":"Service Unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("{}"))
	}))
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	l := generate(t.Context(), 4, 50*time.Millisecond, 300*time.Millisecond, func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
		_, err := call(ctx, c, "GET", srv.URL+"/v1/nodes/17", "tok", nil)
		return err
	})
	if c := conns.Load(); c != 4 {
		t.Errorf("%d connections for 4 clients: want one keep-alive connection each", c)
	}
	if l.Ops == 0 || l.Errors == 0 {
		t.Fatalf("ops %d, errors %d: want both", l.Ops, l.Errors)
	}
	const kind = "HTTP 503 /v1/nodes/{pk}"
	if l.ErrorKinds[kind] != l.Errors || !strings.Contains(l.ErrorSamples[kind], "Service Unavailable") {
		t.Errorf("kinds %v, samples %v", l.ErrorKinds, l.ErrorSamples)
	}
	total := n.Load()
	// Successes that end in the warm-up are not ops; every failure counts.
	if l.Ops+l.Errors > total || l.Errors < total/3-4 {
		t.Errorf("ops %d + errors %d of %d requests", l.Ops, l.Errors, total)
	}
	if want := float64(l.Ops) / l.Elapsed.Seconds(); l.Rate != want {
		t.Errorf("rate %v, want %v", l.Rate, want)
	}
	if l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P99 {
		t.Errorf("p50 %s, p99 %s, max %s", l.P50, l.P99, l.Max)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	s := make([]time.Duration, 100)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	if p := percentile(s, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %s", p)
	}
	if p := percentile(s, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %s", p)
	}
	if p := percentile(s[:1], 0.99); p != time.Millisecond {
		t.Errorf("p99 of one = %s", p)
	}
}

// The load generator's own client keeps one connection across answers of
// every shape the server sends (chunked, unread, with a body sent), opens
// a new one only after Connection: close, and a request that times out
// does not poison the next.
func TestConnTransport(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			for i := range 3 {
				w.Write([]byte(strings.Repeat("x", 10_000*(i+1))))
				w.(http.Flusher).Flush()
			}
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte("bye"))
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			w.Write([]byte(r.Method + " " + r.Header.Get("Authorization") + " " + string(b)))
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	tr := &connTransport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	ctx := t.Context()
	get := func(path string) []byte {
		t.Helper()
		b, err := call(ctx, c, "GET", srv.URL+path, "tok", nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := get("/chunked"); len(b) != 60_000 {
		t.Fatalf("chunked body of %d bytes", len(b))
	}
	resp, err := send(ctx, c, "GET", srv.URL+"/chunked", "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // unread: closing drains it
	b, err := call(ctx, c, "POST", srv.URL+"/echo", "tok", []byte(`{"a":1}`))
	if err != nil || string(b) != `POST Bearer tok {"a":1}` {
		t.Fatalf("echo %q, %v", b, err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 kept alive", n)
	}
	if b := get("/close"); string(b) != "bye" {
		t.Fatalf("close: %q", b)
	}
	get("/echo")
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections after Connection: close, want 2", n)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := call(short, c, "GET", srv.URL+"/slow", "tok", nil); err == nil {
		t.Fatal("a request past its deadline succeeded")
	}
	if b := get("/echo"); !strings.HasPrefix(string(b), "GET Bearer tok") {
		t.Fatalf("after a timeout: %q", b)
	}
}
