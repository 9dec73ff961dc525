// Package connlimit caps how many connections an HTTP server holds open, so
// that a crowd of idle keep-alive connections cannot use up the process's
// file descriptors and lock every new client out.
//
// A Listener wraps the server's net.Listener and counts the connections it
// accepted and has not yet closed; the http.Server's ConnState hook tells
// it which of them are idle (between requests) and since when. When the
// count is at the limit, accepting a newcomer first closes the connection
// that has been idle the longest (or, failing that, one that connected
// more than a grace period ago and has still not sent a whole request
// header). A connection that is serving a request, streaming a response
// or was hijacked is never closed. When every connection is active the
// newcomer waits up to Wait for one to become idle or close; if none does,
// it gets a 503 with Retry-After and is closed, and further newcomers are
// refused at once until a connection frees up, so a full server answers
// quickly instead of queueing clients behind each other.
package connlimit

import (
	"container/list"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Options tune a Listener.
type Options struct {
	// Max is the most connections held open at once; required (> 0).
	Max int
	// Wait is how long a newcomer waits for a slot when every connection
	// is active; default 1s.
	Wait time.Duration
	// NewGrace is how long a connection may stay without a complete first
	// request header before it counts as idle for eviction; default 2s.
	NewGrace time.Duration
	// RetryAfter is the Retry-After of the 503 a refused newcomer gets;
	// default 1s.
	RetryAfter time.Duration
	// Logger receives a warning when newcomers start being refused.
	Logger *slog.Logger
	// TLS is the server's TLS configuration when it serves TLS on the
	// listener (http.Server.ServeTLS): a refused newcomer then gets its
	// 503 over TLS, after a handshake, instead of bytes it cannot read.
	TLS *tls.Config
}

// maxRefusing bounds the refused connections still being answered: each
// holds a descriptor beyond Max for up to refuseLinger.
const (
	maxRefusing  = 16
	refuseLinger = time.Second
)

// Stats is a snapshot of a Listener's bookkeeping.
type Stats struct {
	Open     int // connections accepted and not yet closed
	Idle     int // of which idle between requests
	MaxOpen  int // the most ever open at once
	Evicted  int // connections closed to make room
	Refused  int // newcomers answered 503 because every connection was active
	Waiting  int // newcomers waiting for a slot right now (0 or 1)
	Limit    int // Options.Max
	Accepted int // connections handed to the server
}

// Listener is a net.Listener that holds at most Options.Max connections.
// Install it with Wrap so it sees the server's connection states.
type Listener struct {
	net.Listener
	opts Options

	mu        sync.Mutex
	open      int
	idle      list.List // *conn, oldest idle first
	fresh     list.List // *conn in StateNew, oldest first
	changed   chan struct{}
	saturated bool // a wait for a slot timed out; refuse at once until one frees
	stats     Stats
	refusing  chan struct{} // semaphore of refusals in flight
	refuseTLS *tls.Config   // Options.TLS speaking HTTP/1.1 only; nil: plain
	done      chan struct{}
	closeOnce sync.Once
}

// Wrap returns ln limited to opts.Max connections and installs the
// listener's ConnState hook on srv (calling any hook srv already had).
// Serve srv on the returned listener.
func Wrap(srv *http.Server, ln net.Listener, opts Options) (*Listener, error) {
	if opts.Max <= 0 {
		return nil, fmt.Errorf("connlimit: the connection limit must be positive, not %d", opts.Max)
	}
	if opts.Wait <= 0 {
		opts.Wait = time.Second
	}
	if opts.NewGrace <= 0 {
		opts.NewGrace = 2 * time.Second
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Listener{Listener: ln, opts: opts, changed: make(chan struct{}, 1),
		refusing: make(chan struct{}, maxRefusing), done: make(chan struct{})}
	l.stats.Limit = opts.Max
	if opts.TLS != nil {
		// The 503 is an HTTP/1.1 answer: a client offered h2 must not get it.
		l.refuseTLS = opts.TLS.Clone()
		l.refuseTLS.NextProtos = []string{"http/1.1"}
	}
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		l.connState(c, st)
		if prev != nil {
			prev(c, st)
		}
	}
	return l, nil
}

// conn is an accepted connection. Its fields are guarded by the
// listener's mutex.
type conn struct {
	net.Conn
	l      *Listener
	state  http.ConnState
	since  time.Time     // when it entered state
	elem   *list.Element // in l.idle or l.fresh, or nil
	closed bool          // released its slot
}

// NetConn is the connection c wraps (as tls.Conn's), for a look at its
// socket.
func (c *conn) NetConn() net.Conn { return c.Conn }

// Close closes the connection and frees its slot; it is safe to call more
// than once and concurrently with an eviction.
func (c *conn) Close() error {
	c.l.release(c)
	return c.Conn.Close()
}

// Unwrap returns the underlying connection.
func (c *conn) Unwrap() net.Conn { return c.Conn }

func (l *Listener) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// unlist takes c out of whichever list it is on. l.mu held.
func (l *Listener) unlist(c *conn) {
	if c.elem == nil {
		return
	}
	if c.state == http.StateIdle {
		l.idle.Remove(c.elem)
	} else {
		l.fresh.Remove(c.elem)
	}
	c.elem = nil
}

func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	l.unlist(c)
	l.open--
	l.saturated = false
	l.signal()
}

func (l *Listener) connState(nc net.Conn, st http.ConnState) {
	// Under TLS the server sees a *tls.Conn around ours.
	c, ok := nc.(*conn)
	for !ok {
		u, wraps := nc.(interface{ NetConn() net.Conn })
		if !wraps {
			return
		}
		nc = u.NetConn()
		c, ok = nc.(*conn)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return
	}
	l.unlist(c)
	c.state, c.since = st, time.Now()
	switch st {
	case http.StateNew:
		c.elem = l.fresh.PushBack(c)
	case http.StateIdle:
		c.elem = l.idle.PushBack(c)
		l.saturated = false
		l.signal()
	}
}

// victim picks the connection to close for a newcomer: the one idle the
// longest, else the oldest that has not completed a request header within
// the grace period. l.mu held.
func (l *Listener) victim(now time.Time) *conn {
	if e := l.idle.Front(); e != nil {
		return e.Value.(*conn)
	}
	if e := l.fresh.Front(); e != nil {
		if c := e.Value.(*conn); now.Sub(c.since) >= l.opts.NewGrace {
			return c
		}
	}
	return nil
}

// Accept waits for a connection and for room to hold it.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit makes room for nc, or refuses it and returns nil.
func (l *Listener) admit(nc net.Conn) *conn {
	var deadline time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	l.mu.Lock()
	for l.open >= l.opts.Max {
		now := time.Now()
		if v := l.victim(now); v != nil {
			l.unlist(v)
			v.closed = true
			l.open--
			l.stats.Evicted++
			l.mu.Unlock()
			// Closing a connection from outside is safe for net/http: its
			// goroutine sees the read fail and cleans up.
			_ = v.Conn.Close()
			l.mu.Lock()
			continue
		}
		if l.saturated {
			break
		}
		if deadline.IsZero() {
			deadline = now.Add(l.opts.Wait)
			timer = time.NewTimer(l.opts.Wait)
		}
		l.stats.Waiting++
		l.mu.Unlock()
		select {
		case <-l.changed:
		case <-timer.C:
		case <-l.done:
		}
		l.mu.Lock()
		l.stats.Waiting--
		if !time.Now().Before(deadline) || l.isClosed() {
			if l.open >= l.opts.Max && l.victim(time.Now()) == nil {
				if !l.saturated {
					l.opts.Logger.Warn("connection limit reached and every connection is active; refusing new connections until one frees up",
						"limit", l.opts.Max, "hint", "raise REGISTRY_MAX_CONNECTIONS (and the file descriptor limit) if this is regular load")
				}
				l.saturated = true
			}
		}
	}
	if l.open >= l.opts.Max {
		l.stats.Refused++
		l.mu.Unlock()
		l.refuse(nc)
		return nil
	}
	l.open++
	l.stats.Accepted++
	l.stats.MaxOpen = max(l.stats.MaxOpen, l.open)
	c := &conn{Conn: nc, l: l, state: http.StateNew, since: time.Now()}
	c.elem = l.fresh.PushBack(c)
	l.mu.Unlock()
	return c
}

func (l *Listener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// refuse answers a newcomer 503 without reading its request, then closes
// it. The response is written at once; the close lingers briefly (reading
// what the client sent) so that the client sees the answer rather than a
// reset. When too many refusals are already lingering it closes at once.
// Under TLS the handshake comes first, in the lingering goroutine (so it
// never holds up Accept), and the whole refusal is bounded by the linger.
func (l *Listener) refuse(nc net.Conn) {
	if l.refuseTLS != nil {
		if !l.takeRefusal() {
			_ = nc.Close()
			return
		}
		go func() {
			defer func() { <-l.refusing }()
			tc := tls.Server(nc, l.refuseTLS)
			defer tc.Close()
			_ = tc.SetDeadline(time.Now().Add(refuseLinger))
			if tc.Handshake() != nil {
				return
			}
			if _, err := tc.Write(l.refusal()); err == nil {
				linger(tc)
			}
		}()
		return
	}
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := nc.Write(l.refusal()); err != nil {
		_ = nc.Close()
		return
	}
	if !l.takeRefusal() {
		_ = nc.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer nc.Close()
		linger(nc)
	}()
}

// refusal is the 503 a refused newcomer gets.
func (l *Listener) refusal() []byte {
	body := `{"type":"about:blank","title":"Service Unavailable","status":503,` +
		`"detail":"the server is at its connection limit with every connection busy; retry shortly"}`
	return []byte("HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: application/problem+json\r\n" +
		"Retry-After: " + strconv.Itoa(max(1, int(l.opts.RetryAfter/time.Second))) + "\r\n" +
		"Connection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// takeRefusal takes a slot of the lingering refusals; false when none is
// free.
func (l *Listener) takeRefusal() bool {
	select {
	case l.refusing <- struct{}{}:
		return true
	default:
		return false
	}
}

// linger closes c's writing side and reads what the client sent, for at
// most refuseLinger, so that the client reads the answer before the close.
func linger(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(refuseLinger))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// Close stops accepting and wakes a newcomer waiting for a slot.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Stats returns a snapshot of the bookkeeping.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Open, s.Idle = l.open, l.idle.Len()
	return s
}
