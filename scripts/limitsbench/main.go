// Command limitsbench measures how registryd holds up against crowds of
// connections and watchers (issue 8, findings 4 and 5). It is driven by
// scripts/measure-limits.sh, which starts the server; see there.
//
//	limitsbench idle     -addr HOST:PORT -n 1100
//	limitsbench trickle  -addr HOST:PORT -n 1000
//	limitsbench watchers -addr HOST:PORT -token T -pid PID -n 2000 -changes 600 -resume 300
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: limitsbench idle|trickle|watchers [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "idle":
		err = idle(os.Args[2:])
	case "trickle":
		err = trickle(os.Args[2:])
	case "watchers":
		err = watchers(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "limitsbench:", err)
		os.Exit(1)
	}
}

// conn is one raw keep-alive connection.
type conn struct {
	c  net.Conn
	br *bufio.Reader
}

func dial(addr string) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, br: bufio.NewReaderSize(c, 1024)}, nil
}

// send writes one request.
func (c *conn) send(method, path, token, body string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: registryd\r\n", method, path)
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := io.WriteString(c.c, b.String())
	return err
}

// status reads one response within d and returns its status.
func (c *conn) status(d time.Duration) (int, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// closedByPeer reports whether the server has closed c.
func (c *conn) closedByPeer() bool {
	_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.br.Peek(1)
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// idle holds n idle keep-alive connections, each after one GET /healthz,
// then times a new client's GET /healthz.
func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "server address")
	n := fs.Int("n", 1100, "idle connections to hold")
	wait := fs.Duration("wait", 10*time.Second, "how long the new client waits at most")
	_ = fs.Parse(args)

	var conns []*conn
	served, unanswered, failed := 0, 0, 0
	stalled := false
	start := time.Now()
	for i := range *n {
		c, err := dial(*addr)
		if err != nil {
			failed++
			continue
		}
		conns = append(conns, c)
		if err := c.send("GET", "/healthz", "", ""); err != nil {
			failed++
			continue
		}
		if stalled {
			// The server stopped answering: the rest wait in its backlog.
			unanswered++
			continue
		}
		code, err := c.status(2 * time.Second)
		switch {
		case err == nil && code == 200:
			served++
		case errors.Is(err, os.ErrDeadlineExceeded):
			fmt.Printf("connection %d got no answer within 2s; opening the rest without waiting\n", i+1)
			stalled = true
			unanswered++
		default:
			failed++
		}
	}
	fmt.Printf("held %d connections in %.1fs: %d served, %d unanswered, %d failed\n",
		len(conns), time.Since(start).Seconds(), served, unanswered, failed)

	t0 := time.Now()
	c, err := dial(*addr)
	if err == nil {
		err = c.send("GET", "/healthz", "", "")
	}
	code := 0
	if err == nil {
		code, err = c.status(*wait)
	}
	took := time.Since(t0)
	if err != nil {
		fmt.Printf("new client: no answer after %.2fs: %v\n", took.Seconds(), err)
	} else {
		fmt.Printf("new client: HTTP %d in %.1f ms\n", code, float64(took.Microseconds())/1000)
	}

	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if c.closedByPeer() {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	fmt.Printf("held connections the server has closed: %d of %d\n", closed.Load(), len(conns))
	return nil
}

// trickle holds n connections that each send GET /healthz announcing a
// body of 100,000 bytes and then trickle it, a byte every 2 s, with no
// token, then times a new client's GET /healthz. Before the fix net/http
// read such bodies for up to ReadTimeout (30 s) with the connection busy,
// where the connection limit cannot close it for a newcomer.
func trickle(args []string) error {
	fs := flag.NewFlagSet("trickle", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "server address")
	n := fs.Int("n", 1000, "trickling connections to hold")
	wait := fs.Duration("wait", 10*time.Second, "how long the new client waits at most")
	_ = fs.Parse(args)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	held, failed := 0, 0
	start := time.Now()
	for range *n {
		c, err := dial(*addr)
		if err != nil {
			failed++
			continue
		}
		_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c.c, "GET /healthz HTTP/1.1\r\nHost: registryd\r\nContent-Length: 100000\r\n\r\nx"); err != nil {
			c.c.Close()
			failed++
			continue
		}
		held++
		wg.Go(func() {
			defer c.c.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(2 * time.Second):
				}
				_ = c.c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.c.Write([]byte("x")); err != nil {
					return
				}
			}
		})
	}
	fmt.Printf("opened %d trickling connections in %.1fs (%d failed)\n", held, time.Since(start).Seconds(), failed)
	time.Sleep(3 * time.Second) // past the limit's grace for connections without a request

	for range 3 {
		t0 := time.Now()
		c, err := dial(*addr)
		if err == nil {
			err = c.send("GET", "/healthz", "", "")
		}
		code := 0
		if err == nil {
			code, err = c.status(*wait)
		}
		took := time.Since(t0)
		if err != nil {
			fmt.Printf("new client: no answer after %.2fs: %v\n", took.Seconds(), err)
		} else {
			fmt.Printf("new client: HTTP %d in %.1f ms\n", code, float64(took.Microseconds())/1000)
		}
		if c != nil {
			c.c.Close()
		}
	}
	return nil
}

// rss reads VmRSS and VmHWM of pid, in MiB.
func rss(pid int) (cur, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return cur, peak
}

// lister times POST /v1/nodes/list {"limit":100} every interval until ctx ends.
type lister struct {
	mu    sync.Mutex
	times []time.Duration
	fails int
}

func (l *lister) run(ctx context.Context, base, token string, every time.Duration) {
	cl := &http.Client{Timeout: 30 * time.Second}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req, _ := http.NewRequest("POST", base+"/v1/nodes/list", strings.NewReader(`{"limit":100}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := cl.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		d := time.Since(t0)
		l.mu.Lock()
		if err != nil || resp.StatusCode != 200 {
			l.fails++
		} else {
			l.times = append(l.times, d)
		}
		l.mu.Unlock()
	}
}

func (l *lister) report(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := slices.Clone(l.times)
	slices.Sort(t)
	if len(t) == 0 {
		fmt.Printf("%s: no list answered (%d failed)\n", what, l.fails)
		return
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("%s: %d lists, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %d failed\n",
		what, len(t), ms(t[len(t)/2]), ms(t[len(t)*99/100]), ms(t[len(t)-1]), l.fails)
}

// sampler records the server's RSS every 100ms.
type sampler struct {
	mu         sync.Mutex
	peakRSS    float64
	latestPeak float64
}

func (s *sampler) run(ctx context.Context, pid int) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cur, hwm := rss(pid)
		s.mu.Lock()
		s.peakRSS = max(s.peakRSS, cur)
		s.latestPeak = hwm
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *sampler) report(what string, pid int) {
	cur, hwm := rss(pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Printf("%s: RSS now %.0f MiB, highest sampled %.0f MiB, VmHWM %.0f MiB\n", what, cur, max(s.peakRSS, cur), hwm)
}

// openWatch opens a watch stream and reads its headers; it returns the
// status.
func openWatch(addr, token, lastEventID string, rcvbuf int) (*conn, int, error) {
	c, err := dial(addr)
	if err != nil {
		return nil, 0, err
	}
	if rcvbuf > 0 {
		_ = c.c.(*net.TCPConn).SetReadBuffer(rcvbuf)
	}
	req := "GET /v1/nodes/watch HTTP/1.1\r\nHost: registryd\r\nAuthorization: Bearer " + token + "\r\n"
	if lastEventID != "" {
		req += "Last-Event-ID: " + lastEventID + "\r\n"
	}
	_ = c.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c.c, req+"\r\n"); err != nil {
		c.c.Close()
		return nil, 0, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.c.Close()
		return nil, 0, err
	}
	_ = c.c.SetDeadline(time.Time{})
	if resp.StatusCode != 200 {
		c.c.Close()
		return nil, resp.StatusCode, nil
	}
	return c, 200, nil
}

// openMany opens n watch streams, 50 at a time.
func openMany(n int, open func(i int) (*conn, int, error)) ([]*conn, map[string]int) {
	conns := make([]*conn, n)
	outcome := map[string]int{}
	var mu sync.Mutex
	sem := make(chan struct{}, 50)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, code, err := open(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				outcome["error: "+err.Error()]++
			default:
				outcome[strconv.Itoa(code)]++
				conns[i] = c
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(conns, func(c *conn) bool { return c == nil }), outcome
}

func watchers(args []string) error {
	fs := flag.NewFlagSet("watchers", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "server address")
	token := fs.String("token", "", "an admin token")
	pid := fs.Int("pid", 0, "the server's process id (for its RSS)")
	n := fs.Int("n", 2000, "watchers that never read")
	changes := fs.Int("changes", 600, "node changes to make while they watch")
	resume := fs.Int("resume", 300, "watchers that then resume from event 0")
	_ = fs.Parse(args)
	base := "http://" + *addr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	smp := &sampler{}
	go smp.run(ctx, *pid)
	smp.report("before", *pid)

	// Phase 1: watchers that never read (a 4 KiB receive buffer, so the
	// server cannot park much in the kernel for them), then changes.
	t0 := time.Now()
	held, outcome := openMany(*n, func(int) (*conn, int, error) { return openWatch(*addr, *token, "", 4096) })
	fmt.Printf("opened %d non-reading watchers in %.1fs: %v\n", len(held), time.Since(t0).Seconds(), outcome)
	smp.report("with the watchers open", *pid)

	lists := &lister{}
	lctx, lcancel := context.WithCancel(ctx)
	go lists.run(lctx, base, *token, 200*time.Millisecond)
	t0 = time.Now()
	if err := makeChanges(base, *token, *changes); err != nil {
		return err
	}
	fmt.Printf("made %d node changes in %.1fs\n", *changes, time.Since(t0).Seconds())
	time.Sleep(5 * time.Second) // let the server push what it will
	lcancel()
	lists.report("lists during and after the changes")
	smp.report("after the changes", *pid)
	var ended atomic.Int64
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Go(func() {
			// Read what is there: a stream the server ended shows EOF.
			_ = c.c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.Copy(io.Discard, c.c); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
				ended.Add(1)
			}
		})
	}
	wg.Wait()
	fmt.Printf("non-reading watchers the server had ended: %d of %d\n", ended.Load(), len(held))
	for _, c := range held {
		c.c.Close()
	}
	if *resume == 0 {
		return nil
	}

	// Phase 2: watchers resuming from event 0 read the whole log while
	// lists are timed.
	latest, err := latestEvent(*addr, *token)
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the closed streams have left
	lists = &lister{}
	lctx, lcancel = context.WithCancel(ctx)
	go lists.run(lctx, base, *token, 100*time.Millisecond)
	t0 = time.Now()
	var caughtUp sync.WaitGroup
	var slowest atomic.Int64
	resumed, outcome := openMany(*resume, func(int) (*conn, int, error) {
		c, code, err := openWatch(*addr, *token, "0", 0)
		if c != nil {
			caughtUp.Go(func() {
				defer c.c.Close()
				readUntil(c, latest)
				slowest.Store(max(slowest.Load(), int64(time.Since(t0))))
			})
		}
		return c, code, err
	})
	fmt.Printf("opened %d resuming watchers (from event 0, %d events to replay): %v\n", len(resumed), latest, outcome)
	caughtUp.Wait()
	fmt.Printf("all caught up after %.1fs\n", time.Duration(slowest.Load()).Seconds())
	time.Sleep(time.Second)
	lcancel()
	lists.report("lists while they caught up")
	smp.report("end", *pid)
	return nil
}

// readUntil reads a stream until it has seen event id last (or 60s pass).
func readUntil(c *conn, last int64) {
	_ = c.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	want := []byte("id: " + strconv.FormatInt(last, 10) + "\n")
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
		if bytes.Equal(line, want) {
			return
		}
	}
}

// latestEvent opens a watch that resumes from an id far ahead: the reset
// event names the newest id.
func latestEvent(addr, token string) (int64, error) {
	c, code, err := openWatch(addr, token, "9223372036854775807", 0)
	if err != nil || code != 200 {
		return 0, fmt.Errorf("watch for the latest id: %d %v", code, err)
	}
	defer c.c.Close()
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		line, err := c.br.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var reset struct {
				Last int64 `json:"last_event_id"`
			}
			if err := json.Unmarshal([]byte(data), &reset); err != nil {
				return 0, err
			}
			return reset.Last, nil
		}
	}
}

// makeChanges creates n nodes, four clients at a time.
func makeChanges(base, token string, n int) error {
	cl := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 4)
	stamp := time.Now().UnixNano() % 200
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"ip":"10.%d.%d.%d","index":0,"cpu_mem":2199023255552,"driver_version":"550.54.15","hardware_generation":null,"gpu_mem":85899345920}`,
				stamp, i/250, i%250)
			req, _ := http.NewRequest("POST", base+"/v1/nodes/create", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := cl.Do(req)
			if err != nil {
				failed.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 201 {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d of %d creates failed", f, n)
	}
	return nil
}
