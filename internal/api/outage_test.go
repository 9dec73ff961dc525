package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// These tests break the database under a running server: they stop its
// PostgreSQL (fast and immediate shutdown) or fail it over to a standby
// while writers, an agent's heartbeats and a readiness probe keep going.
// Each runs on a cluster of its own (pgtest.Local), never on the shared
// test server. What must hold throughout:
//
//   - every answer is a 2xx or a 503 with Retry-After (readiness: 200 or
//     503), never a 500;
//   - writes succeed again, within a bounded time, once the database is
//     back;
//   - every write acknowledged with a 2xx is in the database afterwards;
//   - a heartbeat whose flush failed during the outage is written later.

// outageServer is the API over a database a test may break, with the
// heartbeat recorder running as in production.
type outageServer struct {
	t     *testing.T
	url   string
	store *store.Store
	beats *heartbeat.Recorder
	logs  *apitest.Buffer
	admin string
	agent string
}

func newOutageServer(t *testing.T, dbURL string) *outageServer {
	t.Helper()
	st := pgtest.Open(t, dbURL, store.Options{MaxConns: 8, ConnectTimeout: 2 * time.Second})
	logs := &apitest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	beats := heartbeat.New(st, heartbeat.Options{Interval: 100 * time.Millisecond, Logger: logger})
	t.Cleanup(lifecycle.Go(context.Background(), beats.Run))
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api.New(api.Config{Store: st, Logger: logger, OpenAPI: registryd.OpenAPI, Auth: verifier,
		Heartbeats: beats, Ready: func(ctx context.Context) error {
			// As serve's: the probe's answer names no internals.
			if _, err := st.CheckSchema(ctx); err != nil {
				return errors.New("database unreachable")
			}
			return nil
		}}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() {
		if t.Failed() {
			// The errors, not the thousands of expected warnings.
			var errs []string
			for line := range strings.Lines(logs.String()) {
				if strings.Contains(line, "level=ERROR") && len(errs) < 20 {
					errs = append(errs, line)
				}
			}
			t.Logf("server errors:\n%s", strings.Join(errs, ""))
		}
	})
	return &outageServer{t: t, url: ts.URL, store: st, beats: beats, logs: logs,
		admin: tokenFor(t, "admin-outage", registry.RoleAdmin), agent: tokenFor(t, "agent-outage", registry.RoleAgent)}
}

// send sends one request with a bounded wait and returns status, headers
// and body; a transport error is returned, not fatal, since callers run in
// goroutines.
func send(client *http.Client, method, url, token, body string, headers ...string) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// load is writers creating nodes, an agent pinging as its node and a
// readiness probe, all until stop.
type load struct {
	t     *testing.T
	srv   *outageServer
	stop  chan struct{}
	wg    sync.WaitGroup
	agent int64 // the node the agent pings as

	mu       sync.Mutex
	acked    map[int64]string // node pk → ip, for every 201
	statuses map[string]int   // "create 503" → count
	lastBeat time.Time        // when the last ping that got 200 was sent
}

func startLoad(t *testing.T, srv *outageServer, writers int) *load {
	t.Helper()
	client := apitest.Client(t)
	client.Timeout = 30 * time.Second
	status, _, body, err := send(client, "POST", srv.url+"/v1/nodes/create", srv.agent,
		`{"ip":"10.255.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("agent registers its node: %d %s %v", status, body, err)
	}
	var n struct{ PK int64 }
	if err := json.Unmarshal(body, &n); err != nil {
		t.Fatal(err)
	}
	l := &load{t: t, srv: srv, stop: make(chan struct{}), agent: n.PK, acked: map[int64]string{}, statuses: map[string]int{}}
	for w := range writers {
		l.wg.Go(func() { l.write(client, w) })
	}
	l.wg.Go(func() { l.ping(client) })
	l.wg.Go(func() { l.probe(client) })
	t.Cleanup(l.halt)
	return l
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// pace keeps the goroutine from spinning while the database is down
// (503s come back at once) without slowing the writes much.
func (l *load) pace() bool {
	select {
	case <-l.stop:
		return false
	case <-time.After(5 * time.Millisecond):
		return true
	}
}

func (l *load) count(what string, status int) {
	l.mu.Lock()
	l.statuses[fmt.Sprintf("%s %d", what, status)]++
	l.mu.Unlock()
}

// checkStatus is the rule of these tests: 2xx, or 503 with Retry-After.
func (l *load) checkStatus(what string, status int, header http.Header, body []byte, err error) bool {
	if err != nil {
		l.t.Errorf("%s: %v", what, err)
		return false
	}
	l.count(what, status)
	switch {
	case status >= 200 && status < 300:
		return true
	case status == http.StatusServiceUnavailable && header.Get("Retry-After") != "":
		return false
	default:
		l.t.Errorf("%s: %d (want 2xx, or 503 with Retry-After) %s", what, status, bytes.TrimSpace(body))
		return false
	}
}

func (l *load) write(client *http.Client, w int) {
	for seq := 0; !l.stopped(); seq++ {
		ip := fmt.Sprintf("10.%d.%d.%d", w, seq/250%250, seq%250+1)
		body := fmt.Sprintf(`{"ip":%q,"index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, ip)
		status, header, b, err := send(client, "POST", l.srv.url+"/v1/nodes/create", l.srv.admin, body)
		if l.checkStatus("create", status, header, b, err) {
			var n struct{ PK int64 }
			if err := json.Unmarshal(b, &n); err != nil {
				l.t.Errorf("create: %v", err)
				return
			}
			l.mu.Lock()
			l.acked[n.PK] = ip
			l.mu.Unlock()
		}
		if !l.pace() {
			return
		}
	}
}

func (l *load) ping(client *http.Client) {
	for !l.stopped() {
		sent := time.Now()
		status, header, b, err := send(client, "GET", l.srv.url+"/v1/nodes/ping", l.srv.agent, "", "Node-Id", fmt.Sprint(l.agent))
		if l.checkStatus("ping", status, header, b, err) {
			l.mu.Lock()
			l.lastBeat = sent
			l.mu.Unlock()
		}
		if !l.pace() {
			return
		}
	}
}

// probe polls /readyz, which answers 200 or 503 (without Retry-After: it
// is a probe, not a request to retry).
func (l *load) probe(client *http.Client) {
	for !l.stopped() {
		status, _, b, err := send(client, "GET", l.srv.url+"/readyz", "", "")
		if err != nil {
			l.t.Errorf("readyz: %v", err)
			return
		}
		l.count("readyz", status)
		if status != http.StatusOK && status != http.StatusServiceUnavailable {
			l.t.Errorf("readyz: %d %s", status, b)
		}
		if !l.pace() {
			return
		}
	}
}

func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *load) snapshot() (acked int, statuses map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	statuses = map[string]int{}
	for k, v := range l.statuses {
		statuses[k] = v
	}
	return len(l.acked), statuses
}

// awaitAcks waits until n more creates have been acknowledged.
func (l *load) awaitAcks(n int, d time.Duration, what string) {
	l.t.Helper()
	start, _ := l.snapshot()
	apitest.Eventually(l.t, d, what, func() bool { got, _ := l.snapshot(); return got >= start+n })
}

// awaitUnavailable waits until the writers have seen n more 503s.
func (l *load) awaitUnavailable(n int, d time.Duration) {
	l.t.Helper()
	_, s := l.snapshot()
	start := s["create 503"]
	apitest.Eventually(l.t, d, "writers see the outage", func() bool { _, s := l.snapshot(); return s["create 503"] >= start+n })
}

// heartbeatDuringOutage notes a heartbeat while the database is down and
// waits until a flush holding it has failed; verify then checks that it
// reaches the database once it is back, i.e. that the recorder kept it.
// Flushes run one at a time: the first failure after Record may be of a
// flush that began before it, the second one held it.
func (l *load) heartbeatDuringOutage() time.Time {
	l.t.Helper()
	failures := strings.Count(l.srv.logs.String(), "heartbeat flush failed")
	at := time.Now()
	l.srv.beats.Record(l.agent)
	apitest.Eventually(l.t, 10*time.Second, "a flush of the heartbeat fails", func() bool {
		return strings.Count(l.srv.logs.String(), "heartbeat flush failed") >= failures+2
	})
	return at
}

// verify checks, on the database at dbURL, that every acknowledged node is
// there and that the agent's heartbeats reached it.
func (l *load) verify(dbURL string, beatAt time.Time) {
	l.t.Helper()
	l.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		l.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	l.mu.Lock()
	pks := make([]int64, 0, len(l.acked))
	for pk := range l.acked {
		pks = append(pks, pk)
	}
	acked := l.acked
	lastBeat := l.lastBeat
	l.mu.Unlock()
	rows, _ := conn.Query(ctx, `SELECT pk, host(ip) FROM nodes WHERE pk = ANY($1)`, pks)
	found := map[int64]string{}
	var pk int64
	var ip string
	if _, err := pgx.ForEachRow(rows, []any{&pk, &ip}, func() error { found[pk] = ip; return nil }); err != nil {
		l.t.Fatal(err)
	}
	lost := 0
	for pk, ip := range acked {
		if found[pk] != ip {
			lost++
			if lost <= 10 {
				l.t.Errorf("acknowledged node %d (%s) is not in the database (found %q)", pk, ip, found[pk])
			}
		}
	}
	if lost > 0 {
		l.t.Errorf("%d of %d acknowledged writes lost", lost, len(acked))
	}
	_, statuses := l.snapshot()
	l.t.Logf("%d writes acknowledged; answers: %v", len(acked), statuses)
	if statuses["create 503"] == 0 {
		l.t.Error("the writers never saw the outage: the test tested nothing")
	}

	// The heartbeats: the last one answered 200, and the one noted during
	// the outage, are in node_liveness (later ones may have moved it on).
	want := beatAt
	if lastBeat.After(want) {
		want = lastBeat
	}
	apitest.Eventually(l.t, 10*time.Second, "the heartbeats reach the database", func() bool {
		var seen time.Time
		err := conn.QueryRow(ctx, `SELECT last_seen FROM node_liveness WHERE node_pk = $1`, l.agent).Scan(&seen)
		return err == nil && !seen.Before(want.Truncate(time.Microsecond))
	})
}

// TestOutageStop stops PostgreSQL under write load, with a fast shutdown
// (sessions cut with 57P01, connections refused with 57P03 while it shuts
// down, then no socket at all) and with an immediate one (the server
// quits without a word: reads hit EOF, writes a closed connection), then
// starts it again.
func TestOutageStop(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewLocal(t, nil)
			srv := newOutageServer(t, db.URL())
			l := startLoad(t, srv, 8)
			l.awaitAcks(40, 30*time.Second, "writes before the outage")
			db.Stop(mode)
			l.awaitUnavailable(20, 10*time.Second)
			beatAt := l.heartbeatDuringOutage()
			db.Start()
			l.awaitAcks(40, 30*time.Second, "writes after the restart")
			l.verify(db.URL(), beatAt)
		})
	}
}

// TestOutageFailover fails the database over to a standby under write load:
// the primary dies (immediate shutdown, as in a crash), the standby is
// promoted with pg_ctl promote, and the server, given both hosts with
// target_session_attrs=read-write, finds the new primary by itself.
//
// The pair replicates synchronously (synchronous_standby_names on the
// primary, synchronous_commit=on): a commit is acknowledged only once the
// standby has it. That is what lets the test demand that no acknowledged
// write is lost across the failover; with asynchronous replication a commit
// acknowledged by the primary may not have reached the standby when the
// primary dies, and would be lost with it.
func TestOutageFailover(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewPair(t, true)
	srv := newOutageServer(t, pgtest.MultiHostURL(primary, standby))
	l := startLoad(t, srv, 8)
	l.awaitAcks(40, 30*time.Second, "writes before the failover")
	primary.Stop("immediate")
	// Until the promotion the standby refuses read-write sessions (and a
	// session that reached it would get 25006 on every write): all 503.
	l.awaitUnavailable(20, 10*time.Second)
	beatAt := l.heartbeatDuringOutage()
	standby.Promote()
	l.awaitAcks(40, 30*time.Second, "writes after the promotion")
	l.verify(standby.URL(), beatAt)
}

// With every pooled connection busy (here: the only one, held), a request
// waits for one at most the pool's acquire timeout, then answers 503 with
// Retry-After instead of queueing without end.
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{MaxConns: 1, AcquireTimeout: 300 * time.Millisecond})
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	t.Cleanup(ts.Close)
	held, err := st.Pool().Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Release) // before the pool closes, even if the test fails early
	client := apitest.Client(t)
	client.Timeout = 5 * time.Second // far beyond the acquire timeout
	admin := tokenFor(t, "admin", registry.RoleAdmin)
	start := time.Now()
	status, header, body, err := send(client, "GET", ts.URL+"/v1/nodes/1", admin, "")
	if err != nil {
		t.Fatalf("no answer while the pool is exhausted: %v", err)
	}
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") == "" {
		t.Errorf("exhausted pool: %d (Retry-After %q) %s, want 503 with Retry-After", status, header.Get("Retry-After"), body)
	}
	t.Logf("answered %d after %v", status, time.Since(start).Round(time.Millisecond))
	held.Release()
	if status, _, body, err := send(client, "GET", ts.URL+"/v1/nodes/1", admin, ""); err != nil || status != http.StatusNotFound {
		t.Errorf("with the connection free again: %d %s %v, want 404", status, body, err)
	}
}

// A client that gives up while its request waits on the database is not
// an outage: nothing is logged as "database unavailable" or as an internal
// error, whatever the driver made of the cancellation.
func TestClientGoneIsNotAnOutage(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	logs := &apitest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api.New(api.Config{Store: st, Logger: logger, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	t.Cleanup(ts.Close)
	admin := tokenFor(t, "admin", registry.RoleAdmin)
	client := &http.Client{Timeout: 10 * time.Second}
	status, _, body, err := send(client, "POST", ts.URL+"/v1/nodes/create", admin,
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("create: %d %s %v", status, body, err)
	}

	// Another session holds the node's row, so the PATCH waits on it.
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(reqCtx, "PATCH", ts.URL+"/v1/nodes/1", strings.NewReader(`{"cpu_mem":2}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	apitest.Eventually(t, 10*time.Second, "the PATCH waits on the row lock", func() bool {
		var n int
		err := holder.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the canceled request got an answer")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not give up")
	}
	// The access log line is written once the handler has returned.
	apitest.Eventually(t, 10*time.Second, "the server finishes the canceled request", func() bool {
		return strings.Contains(logs.String(), `method=PATCH path=/v1/nodes/1 status=`)
	})
	out := logs.String()
	if strings.Contains(out, "database unavailable") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a client that went away was logged as an outage or an error:\n%s", out)
	}
	if !strings.Contains(out, "request canceled by client") {
		t.Errorf("the cancellation is not logged for what it is:\n%s", out)
	}
}
