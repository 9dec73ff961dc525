package connlimit_test

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/connlimit"
	"github.com/registryd/registryd/internal/tlstest"
)

// server is a real listening HTTP server behind a limited listener.
type server struct {
	t       *testing.T
	addr    string
	tls     *tls.Config // the clients', when the server serves TLS
	l       *connlimit.Listener
	entered chan struct{} // a /block request started
	release chan struct{} // lets one /block request finish
}

func start(t *testing.T, opts connlimit.Options) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, addr: ln.Addr().String(), entered: make(chan struct{}, 100), release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		s.entered <- struct{}{}
		select {
		case <-s.release:
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	})
	srv := &http.Server{Handler: mux, IdleTimeout: time.Minute, ReadHeaderTimeout: 10 * time.Second}
	s.l, err = connlimit.Wrap(srv, ln, opts)
	if err != nil {
		t.Fatal(err)
	}
	serve := func() { srv.Serve(s.l) }
	if opts.TLS != nil {
		srv.TLSConfig = opts.TLS
		serve = func() { srv.ServeTLS(s.l, "", "") }
	}
	done := make(chan struct{})
	go func() { serve(); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return s
}

// waitFor polls the listener's stats until ok holds, for at most 5s.
func (s *server) waitFor(what string, ok func(connlimit.Stats) bool) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(s.l.Stats()) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; stats %+v", what, s.l.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// client is one raw keep-alive connection.
type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (s *server) dial() *client {
	s.t.Helper()
	c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	if s.tls != nil {
		c = tls.Client(c, s.tls)
	}
	s.t.Cleanup(func() { c.Close() })
	return &client{t: s.t, c: c, br: bufio.NewReader(c)}
}

// send writes a GET for path.
func (c *client) send(path string) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		c.t.Fatal(err)
	}
}

// read reads one whole response, waiting at most 5s.
func (c *client) read() (*http.Response, string, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// get sends a GET and expects 200.
func (c *client) get(path string) {
	c.t.Helper()
	c.send(path)
	resp, body, err := c.read()
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
}

// closedByServer reports whether the server closes the connection (EOF or
// reset) within 5s.
func (c *client) closedByServer() bool {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.br.Peek(1)
	if err == nil {
		c.t.Fatal("the server sent something unasked")
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// With the limit reached by idle keep-alive connections, every newcomer is
// served, and the connection idle the longest is the one closed for it.
func TestIdleConnectionsMakeRoomOldestFirst(t *testing.T) {
	t.Parallel()
	const limit, held = 20, 30
	s := start(t, connlimit.Options{Max: limit})
	var clients []*client
	for i := range held {
		c := s.dial()
		c.get("/healthz")
		clients = append(clients, c)
		s.waitFor(fmt.Sprintf("connection %d to be idle", i), func(st connlimit.Stats) bool { return st.Idle == min(i+1, limit) })
	}
	// The oldest ones were closed.
	for i, c := range clients[:held-limit] {
		if !c.closedByServer() {
			t.Fatalf("connection %d (of %d, oldest first) is still open", i, held)
		}
	}
	// A new client is answered, and clients[held-limit], now the oldest
	// idle one, makes room for it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.dial().get("/healthz")
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("a new client was not answered within 3s")
	}
	if !clients[held-limit].closedByServer() {
		t.Error("the oldest idle connection was not the one closed")
	}
	// The younger ones are still served on their connections.
	for _, c := range clients[held-limit+1:] {
		c.get("/healthz")
	}
	if st := s.l.Stats(); st.MaxOpen > limit || st.Evicted != held-limit+1 {
		t.Errorf("stats %+v: want at most %d open and %d evicted", st, limit, held-limit+1)
	}
}

// Active connections are never closed: with every slot serving a request,
// a newcomer waits, then gets a quick 503 with Retry-After, and so do
// newcomers after it until a slot frees up.
func TestActiveConnectionsAreNeverClosed(t *testing.T) {
	t.Parallel()
	const limit = 5
	s := start(t, connlimit.Options{Max: limit, Wait: 200 * time.Millisecond})
	var busy []*client
	for range limit {
		c := s.dial()
		c.send("/block")
		busy = append(busy, c)
		<-s.entered
	}
	for i := range 2 {
		c := s.dial()
		c.send("/healthz")
		resp, body, err := c.read()
		if err != nil {
			t.Fatalf("newcomer %d: %v", i, err)
		}
		var p struct {
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p.Status != 503 {
			t.Fatalf("newcomer %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
		}
		if !c.closedByServer() {
			t.Errorf("newcomer %d: the refused connection stays open", i)
		}
	}
	// None of the busy ones was touched.
	for i, c := range busy {
		s.release <- struct{}{}
		resp, body, err := c.read()
		if err != nil || resp.StatusCode != http.StatusOK || body != "done" {
			t.Fatalf("busy connection %d: %v %v %q", i, resp, err, body)
		}
	}
	if st := s.l.Stats(); st.Refused != 2 || st.Evicted != 0 {
		t.Errorf("stats %+v: want 2 refused, 0 evicted", st)
	}
	// Free again: a newcomer is served (closing one of the now idle ones).
	s.dial().get("/healthz")
}

// Under TLS (the server sees a *tls.Conn around the listener's): a busy
// connection past its grace period is still known busy and kept, the
// newcomer's 503 comes over TLS, and an idle connection makes room.
func TestLimitUnderTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "connlimit test CA")
	cert := ca.Issue("127.0.0.1").TLS(t)
	s := start(t, connlimit.Options{Max: 1, Wait: 100 * time.Millisecond, NewGrace: 50 * time.Millisecond,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	// The raw clients speak HTTP/1.1; the newcomer offers h2 too.
	s.tls = &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}
	busy := s.dial()
	busy.send("/block")
	select {
	case <-s.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not reach the handler within 5s")
	}
	time.Sleep(100 * time.Millisecond) // past NewGrace

	s.tls.NextProtos = []string{"h2", "http/1.1"}
	c := s.dial()
	s.tls.NextProtos = []string{"http/1.1"}
	c.send("/healthz")
	resp, body, err := c.read()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("newcomer: %v %v %s", resp, err, body)
	}
	if p := c.c.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Errorf("the refusal negotiated %q, want http/1.1", p)
	}
	s.release <- struct{}{}
	if resp, body, err := busy.read(); err != nil || resp.StatusCode != http.StatusOK || body != "done" {
		t.Fatalf("the busy connection: %v %v %q", resp, err, body)
	}
	s.waitFor("the busy connection to be idle", func(st connlimit.Stats) bool { return st.Idle == 1 })
	s.dial().get("/healthz")
	if !busy.closedByServer() {
		t.Error("the idle connection was not closed for the newcomer")
	}
	if st := s.l.Stats(); st.Refused != 1 || st.Evicted != 1 {
		t.Errorf("stats %+v: want 1 refused, 1 evicted", st)
	}
}

// A newcomer that finds every connection active waits for the first one to
// finish its request and takes its place.
func TestNewcomerWaitsForASlot(t *testing.T) {
	t.Parallel()
	s := start(t, connlimit.Options{Max: 2, Wait: 10 * time.Second})
	a, b := s.dial(), s.dial()
	a.send("/block")
	b.send("/block")
	<-s.entered
	<-s.entered
	served := make(chan error, 1)
	go func() {
		c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		nc := &client{t: t, c: c, br: bufio.NewReader(c)}
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
		resp, _, err := nc.read()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		served <- err
	}()
	s.waitFor("the newcomer to wait", func(st connlimit.Stats) bool { return st.Waiting == 1 })
	s.release <- struct{}{}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("newcomer: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the newcomer was not served after a slot freed")
	}
	s.release <- struct{}{}
	// Both busy requests got their whole answer (the first to finish was
	// then closed to make room, after its response).
	for _, c := range []*client{a, b} {
		if _, body, err := c.read(); err != nil || body != "done" {
			t.Fatalf("a busy request: %q %v", body, err)
		}
	}
}

// Connections that never complete a request header (slowloris) count as
// idle once their grace period is over; fresh ones are left alone.
func TestSilentConnections(t *testing.T) {
	t.Parallel()
	t.Run("after the grace period they make room", func(t *testing.T) {
		t.Parallel()
		s := start(t, connlimit.Options{Max: 3, NewGrace: time.Nanosecond})
		var silent []*client
		for range 3 {
			silent = append(silent, s.dial())
		}
		s.waitFor("three accepted", func(st connlimit.Stats) bool { return st.Accepted == 3 })
		s.dial().get("/healthz")
		if !silent[0].closedByServer() {
			t.Error("the oldest silent connection was not closed")
		}
		silent[1].get("/healthz") // a younger one is still open
	})
	t.Run("within the grace period they are kept", func(t *testing.T) {
		t.Parallel()
		s := start(t, connlimit.Options{Max: 2, NewGrace: time.Hour, Wait: 100 * time.Millisecond})
		a, b := s.dial(), s.dial()
		s.waitFor("two accepted", func(st connlimit.Stats) bool { return st.Accepted == 2 })
		c := s.dial()
		c.send("/healthz")
		if resp, _, err := c.read(); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("newcomer: %v %v", resp, err)
		}
		// The fresh ones still get their request served.
		a.get("/healthz")
		b.get("/healthz")
	})
}

// Many clients at once: never more connections than the limit, every
// answer a 200 or a 503 (run with -race).
func TestConcurrentClientsStayWithinLimit(t *testing.T) {
	t.Parallel()
	const limit = 8
	s := start(t, connlimit.Options{Max: limit, Wait: 2 * time.Second})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for g := range 24 {
		wg.Go(func() {
			tr := &http.Transport{MaxIdleConnsPerHost: 2, DisableKeepAlives: g%3 == 0}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for range 15 {
				resp, err := cl.Get("http://" + s.addr + "/healthz")
				code := -1 // a keep-alive connection closed under a request: clients retry
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st := s.l.Stats()
	if st.MaxOpen > limit {
		t.Errorf("%d connections open at once; limit %d", st.MaxOpen, limit)
	}
	for code := range codes {
		if code != 200 && code != 503 && code != -1 {
			t.Errorf("answers %v", codes)
		}
	}
	if codes[200] < 24*15/2 {
		t.Errorf("answers %v: want most to be 200", codes)
	}
	t.Logf("answers %v, stats %+v", codes, st)
}

func TestWrapRefusesNoLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := connlimit.Wrap(&http.Server{}, ln, connlimit.Options{}); err == nil {
		t.Error("a zero limit was accepted")
	}
}

// The documented derivation: the soft RLIMIT_NOFILE minus the database pool
// and 64 more, at least 16.
func TestFromNoFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		nofile uint64
		pool   int
		want   int
	}{
		{1024, 4, 956},
		{1024, 16, 944},
		{20000, 4, 19932},
		{1048576, 8, 1048504},
		{80, 4, 16},
		{1 << 40, 4, 1<<24 - 68},
	} {
		if got := connlimit.FromNoFile(tc.nofile, connlimit.Reserve(tc.pool)); got != tc.want {
			t.Errorf("FromNoFile(%d, Reserve(%d)) = %d, want %d", tc.nofile, tc.pool, got, tc.want)
		}
	}
}
