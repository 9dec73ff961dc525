package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	ID   int64
	Type string
	Data map[string]any
}

func (e sseEvent) nodePK() int64 {
	if n, ok := e.Data["node"].(map[string]any); ok {
		return int64(n["pk"].(float64))
	}
	return 0
}

// stream is an open watch. Bookmarks come apart from the other events.
type stream struct {
	t         *testing.T
	events    chan sseEvent
	bookmarks chan sseEvent // the newest few; older ones are dropped
	status    int
	close     func()
}

// watchStream opens GET /v1/nodes/watch on base with the query and headers.
func watchStream(t *testing.T, base, query, token string, headers ...string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/nodes/watch"+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &stream{t: t, events: make(chan sseEvent, 100), bookmarks: make(chan sseEvent, 100), status: resp.StatusCode}
	s.close = func() { cancel(); resp.Body.Close() }
	t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		return s
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		var e sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && e.Type == "bookmark":
				select {
				case s.bookmarks <- e:
				default:
				}
				e = sseEvent{}
			case line == "":
				if e.Type != "" {
					s.events <- e
				}
				e = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				e.ID, _ = strconv.ParseInt(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				e.Type = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &e.Data)
			}
		}
	}()
	return s
}

// next waits for the next event.
func (s *stream) next() sseEvent {
	s.t.Helper()
	select {
	case e, ok := <-s.events:
		if !ok {
			s.t.Fatal("the stream ended")
		}
		return e
	case <-time.After(10 * time.Second):
		s.t.Fatal("no event within 10s")
	}
	return sseEvent{}
}

// quiet asserts no event arrives for a while.
func (s *stream) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case e, ok := <-s.events:
		if ok {
			s.t.Errorf("unexpected event %+v", e)
		}
	case <-time.After(d):
	}
}

func kinds(events []sseEvent) []string {
	var out []string
	for _, e := range events {
		out = append(out, fmt.Sprintf("%s %d", e.Type, e.nodePK()))
	}
	return out
}

func TestWatch(t *testing.T) {
	b := setup(t)
	w := watchStream(t, b.url, "", b.token)
	if w.status != http.StatusOK {
		t.Fatalf("watch status %d", w.status)
	}
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"cpu_mem": 77}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 4}))
	// A heartbeat is not an event.
	if err := b.store.TouchNodes(context.Background(), []int64{pk}, []time.Time{time.Now()}); err != nil {
		t.Fatal(err)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 4}))
	b.must(http.StatusNoContent, b.do("DELETE", path, nil))

	var got []sseEvent
	for range 5 {
		got = append(got, w.next())
	}
	want := []string{"created " + fmt.Sprint(pk), "updated " + fmt.Sprint(pk), "claimed " + fmt.Sprint(pk), "released " + fmt.Sprint(pk), "deleted " + fmt.Sprint(pk)}
	if diff := cmp.Diff(want, kinds(got)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Errorf("event ids do not increase: %d then %d", got[i-1].ID, got[i].ID)
		}
	}
	if n := got[1].Data["node"].(map[string]any); n["cpu_mem"] != float64(77) {
		t.Errorf("update event carries %v", n)
	}
	if n := got[2].Data["node"].(map[string]any); n["current_job"] != float64(4) {
		t.Errorf("claim event carries %v", n)
	}
	w.quiet(300 * time.Millisecond)

	// Resume: everything after the second event, from the change log.
	r := watchStream(t, b.url, "", b.token, "Last-Event-ID", fmt.Sprint(got[1].ID))
	var resumed []sseEvent
	for range 3 {
		resumed = append(resumed, r.next())
	}
	if diff := cmp.Diff(kinds(got[2:]), kinds(resumed)); diff != "" {
		t.Errorf("resumed (-want +got):\n%s", diff)
	}
	// Then it goes on live.
	pk2 := b.createNode(map[string]any{"index": 3})
	if e := r.next(); e.Type != "created" || e.nodePK() != pk2 {
		t.Errorf("live after resume: %+v", e)
	}
}

func TestWatchFiltersAndErrors(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H200")
	w := watchStream(t, b.url, fmt.Sprintf("?hardware_generation=%d", hw), b.token)
	b.createNode(map[string]any{"ip": "10.5.0.1"})
	want := b.createNode(map[string]any{"ip": "10.5.0.2", "hardware_generation": hw})
	if e := w.next(); e.nodePK() != want {
		t.Errorf("filtered watch got node %d, want %d", e.nodePK(), want)
	}
	ip := watchStream(t, b.url, "?ip=10.5.0.1", b.token)
	b.must(http.StatusOK, b.do("PATCH", "/v1/nodes/"+fmt.Sprint(want), map[string]any{"cpu_mem": 1}))
	ip.quiet(300 * time.Millisecond)

	for _, q := range []string{"?hardware_generation=x", "?color=red", "?ip=nope", "?index=-1"} {
		if s := watchStream(t, b.url, q, b.token); s.status != http.StatusBadRequest {
			t.Errorf("%s: status %d", q, s.status)
		}
	}
	if s := watchStream(t, b.url, "", b.token, "Last-Event-ID", "abc"); s.status != http.StatusBadRequest {
		t.Errorf("bad Last-Event-ID: status %d", s.status)
	}
	if s := watchStream(t, b.url, "", ""); s.status != http.StatusUnauthorized {
		t.Errorf("no token: status %d", s.status)
	}
	// An id the registry never issued: reset.
	s := watchStream(t, b.url, "", b.token, "Last-Event-ID", "999999")
	if e := s.next(); e.Type != "reset" {
		t.Errorf("ahead id: %+v", e)
	}
}

// Events pruned by retention cannot be replayed: the client is told to
// re-list, then the stream goes on live.
func TestWatchTooOld(t *testing.T) {
	b := setup(t)
	w := watchStream(t, b.url, "", b.token)
	b.createNode(map[string]any{"index": 0})
	b.createNode(map[string]any{"index": 1})
	first := w.next()
	w.next()
	if _, err := b.store.PruneEvents(context.Background(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r := watchStream(t, b.url, "", b.token, "Last-Event-ID", fmt.Sprint(first.ID-1))
	if e := r.next(); e.Type != "reset" || e.Data["reason"] == nil {
		t.Fatalf("resume from pruned history: %+v", e)
	}
	pk := b.createNode(map[string]any{"index": 2})
	if e := r.next(); e.Type != "created" || e.nodePK() != pk {
		t.Errorf("after reset: %+v", e)
	}
}

// A change made through one replica reaches a watcher on another.
func TestWatchAcrossReplicas(t *testing.T) {
	b := setup(t)
	st := pgtest.Open(t, b.dbURL, store.Options{})
	verifier, _ := auth.NewVerifier(auth.Config{Secret: testSecret})
	other := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier, Events: startHub(t, st)}))
	t.Cleanup(other.Close)

	w := watchStream(t, other.URL, "", tokenFor(t, "r", registry.RoleReader))
	pk := b.createNode(nil) // through the first replica
	e := w.next()
	if e.Type != "created" || e.nodePK() != pk {
		t.Errorf("other replica saw %+v", e)
	}
}

// bookmark waits for the next bookmark.
func (s *stream) bookmark() sseEvent {
	s.t.Helper()
	select {
	case e := <-s.bookmarks:
		if e.Data["last_event_id"] != float64(e.ID) {
			s.t.Fatalf("bookmark %+v: its id and last_event_id differ", e)
		}
		return e
	case <-time.After(10 * time.Second):
		s.t.Fatal("no bookmark within 10s")
	}
	return sseEvent{}
}

// A stream sends a bookmark as it opens, in the exact form clients parse,
// and one instead of each keep-alive: the id of the newest event it has
// taken, filtered out or not, so resuming after it repeats nothing.
func TestWatchBookmarks(t *testing.T) {
	b := setup(t)
	b.createNode(map[string]any{"ip": "10.0.0.1"})
	if e := watchStream(t, b.url, "", b.token, "Last-Event-ID", "0").next(); e.ID != 1 {
		t.Fatalf("event %+v, want 1", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"/v1/nodes/watch", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && len(got) < 10 {
		got = append(got, sc.Text())
		if sc.Text() == "event: bookmark" {
			sc.Scan()
			got = append(got, sc.Text())
			break
		}
	}
	// The backfilled event 1, then a bookmark at 1.
	if n := len(got); n < 3 || got[n-3] != "id: 1" || got[n-2] != "event: bookmark" || got[n-1] != `data: {"last_event_id":1}` {
		t.Fatalf("stream began %q, want a bookmark at 1 after the backfill", got)
	}

	// Filtered out or not, an event moves the bookmark on.
	s := watchStream(t, b.url, "?ip=10.9.9.9", b.token)
	if e := s.bookmark(); e.ID != 1 {
		t.Fatalf("opening bookmark %+v, want 1", e)
	}
	b.createNode(map[string]any{"ip": "10.0.0.2"})
	deadline := time.Now().Add(5 * time.Second)
	for e := s.bookmark(); e.ID != 2; e = s.bookmark() {
		if e.ID != 1 || time.Now().After(deadline) {
			t.Fatalf("bookmark %+v, want 1 then 2 within 5 s", e)
		}
	}
	s.quiet(300 * time.Millisecond)
}

// laggingHub is a hub whose own position trails the log, as a replica's
// does for a moment after a change made through another replica.
type laggingHub struct {
	*watch.Hub
	lag int64
}

func (h laggingHub) Subscribe(ctx context.Context, principal string) (api.EventStream, error) {
	s, err := h.Hub.Subscribe(ctx, principal)
	if err != nil {
		return nil, err
	}
	return laggingStream{EventStream: s, lag: h.lag}, nil
}

type laggingStream struct {
	api.EventStream
	lag int64
}

func (s laggingStream) Last() int64 { return s.EventStream.Last() - s.lag }

// A client resuming on a replica that lags behind the id it saw elsewhere
// gets the missed events from the log, not a reset.
func TestWatchResumeOnLaggingReplica(t *testing.T) {
	b := setup(t)
	w := watchStream(t, b.url, "", b.token)
	for i := range 3 {
		b.createNode(map[string]any{"index": i})
	}
	var ids []int64
	for range 3 {
		ids = append(ids, w.next().ID)
	}
	verifier, _ := auth.NewVerifier(auth.Config{Secret: testSecret})
	lagging := httptest.NewServer(api.New(api.Config{Store: b.store, OpenAPI: registryd.OpenAPI, Auth: verifier,
		Events: laggingHub{Hub: startHub(t, b.store), lag: 2}}))
	t.Cleanup(lagging.Close)
	time.Sleep(300 * time.Millisecond) // the new hub has read the log's position
	r := watchStream(t, lagging.URL, "", b.token, "Last-Event-ID", fmt.Sprint(ids[1]))
	if e := r.next(); e.Type != "created" || e.ID != ids[2] {
		t.Fatalf("resume on a lagging replica: %+v (want the missed event %d, no reset)", e, ids[2])
	}
	pk := b.createNode(map[string]any{"index": 7})
	if e := r.next(); e.Type != "created" || e.nodePK() != pk {
		t.Errorf("then live: %+v (want node %d)", e, pk)
	}
}

// limitedWatchServer is a second server on b's database whose hub has
// the given options.
func limitedWatchServer(t *testing.T, b *bundle, st watch.Store, opts func(*watch.Options)) (string, *watch.Hub) {
	t.Helper()
	o := watch.Options{
		Channels: watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:   api.EncodeEvent,
		Poll:     100 * time.Millisecond,
	}
	opts(&o)
	hub := watch.New(st, o)
	t.Cleanup(lifecycle.Go(context.Background(), hub.Run))
	verifier, _ := auth.NewVerifier(auth.Config{Secret: testSecret})
	srv := httptest.NewServer(api.New(api.Config{Store: b.store, OpenAPI: registryd.OpenAPI, Auth: verifier, Events: hub}))
	t.Cleanup(srv.Close)
	return srv.URL, hub
}

// Watch streams are capped per principal and per server: beyond either,
// 429 with Retry-After and a problem document; a stream that ends frees
// its slot.
func TestWatchStreamCaps(t *testing.T) {
	b := setup(t)
	url, hub := limitedWatchServer(t, b, b.store, func(o *watch.Options) { o.MaxStreams, o.MaxPerPrincipal = 3, 2 })
	r1, r2, r3 := tokenFor(t, "reader-1", registry.RoleReader), tokenFor(t, "reader-2", registry.RoleReader), tokenFor(t, "reader-3", registry.RoleReader)

	// refused checks a refusal through the validating client, so the 429
	// is held to openapi.yaml too.
	refused := func(token, why string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url+"/v1/nodes/watch", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p struct {
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&p)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || p.Status != 429 || !strings.Contains(p.Detail, why) {
			t.Fatalf("want 429 (%s): %d Retry-After %q %+v", why, resp.StatusCode, resp.Header.Get("Retry-After"), p)
		}
	}
	first := watchStream(t, url, "", r1)
	if s := watchStream(t, url, "", r1); first.status != http.StatusOK || s.status != http.StatusOK {
		t.Fatalf("status %d, %d", first.status, s.status)
	}
	refused(r1, "per principal")
	if s := watchStream(t, url, "", r2); s.status != http.StatusOK {
		t.Fatalf("another principal: %d", s.status)
	}
	refused(r3, "this server already has 3")

	// The first stream ends: its slot is free once the server noticed.
	first.close()
	deadline := time.Now().Add(5 * time.Second)
	for hub.Streams() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the closed stream still holds its slot: %d streams", hub.Streams())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s := watchStream(t, url, "", r3)
	if s.status != http.StatusOK {
		t.Fatalf("after a stream ended: %d", s.status)
	}
	pk := b.createNode(nil)
	if e := s.next(); e.Type != "created" || e.nodePK() != pk {
		t.Errorf("the new stream got %+v", e)
	}
}

// countingStore counts the backfill queries (pages of backfillPage
// events) running at once against the real store.
type countingStore struct {
	*store.Store
	page           int
	inflight, peak atomic.Int64
}

func (c *countingStore) NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error) {
	if limit != c.page {
		return c.Store.NodeEventsAfter(ctx, after, limit) // the hub's own live reads
	}
	n := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
	return c.Store.NodeEventsAfter(ctx, after, limit)
}

// Many watchers resuming from the start at once read the change log
// through a bound of concurrent queries, in small pages, so a list still
// gets a database connection while they catch up.
func TestWatchBackfillsLeaveThePoolToLists(t *testing.T) {
	b := setup(t)
	const events, watchers, page = 100, 30, 10
	for i := range events {
		b.createNode(map[string]any{"index": i})
	}
	st := pgtest.Open(t, b.dbURL, store.Options{MaxConns: 4})
	counting := &countingStore{Store: st, page: page}
	url, _ := limitedWatchServer(t, b, counting, func(o *watch.Options) {
		o.BackfillConcurrency, o.BackfillPage, o.MaxPerPrincipal = 1, page, watchers
	})
	verifier, _ := auth.NewVerifier(auth.Config{Secret: testSecret})
	lists := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	t.Cleanup(lists.Close)

	var streams []*stream
	for range watchers {
		streams = append(streams, watchStream(t, url, "", b.token, "Last-Event-ID", "0"))
	}
	// A list on the same pool answers while they catch up.
	listDone := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", lists.URL+"/v1/nodes/list", strings.NewReader(`{"limit":10}`))
		req.Header.Set("Authorization", "Bearer "+b.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			listDone <- 0
			return
		}
		resp.Body.Close()
		listDone <- resp.StatusCode
	}()
	select {
	case code := <-listDone:
		if code != http.StatusOK {
			t.Fatalf("list during backfills: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a list did not answer within 10s while watchers caught up")
	}
	for i, s := range streams {
		for j := range events {
			if e := s.next(); e.Type != "created" {
				t.Fatalf("watcher %d, event %d: %+v", i, j, e)
			}
		}
	}
	if p := counting.peak.Load(); p != 1 {
		t.Errorf("%d backfill queries ran at once, want 1", p)
	}
}
