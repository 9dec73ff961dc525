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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
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

// stream is an open watch.
type stream struct {
	t      *testing.T
	events chan sseEvent
	status int
	close  func()
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
	s := &stream{t: t, events: make(chan sseEvent, 100), status: resp.StatusCode}
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
	st, err := store.Open(context.Background(), b.dbURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
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

func TestWatchKeepAlive(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"/v1/nodes/watch", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == ": keep-alive" {
			return
		}
	}
	t.Error("no keep-alive comment on an idle stream")
}

// laggingHub is a hub whose own position trails the log, as a replica's
// does for a moment after a change made through another replica.
type laggingHub struct {
	*watch.Hub
	lag int64
}

func (h laggingHub) Subscribe(ctx context.Context) (<-chan registry.NodeEvent, <-chan struct{}, int64, func(), error) {
	ev, cut, last, cancel, err := h.Hub.Subscribe(ctx)
	return ev, cut, last - h.lag, cancel, err
}

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
