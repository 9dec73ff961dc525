package api_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/metrics"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// withMetrics serves m at /metrics and tells it what the server does; the
// heartbeats go to a recorder that reports to m too (returned through
// beats, flushed by the test).
func withMetrics(m *metrics.Metrics, beats **heartbeat.Recorder) option {
	return func(c *api.Config) {
		c.Metrics, c.Observer = m.Handler(), m
		if beats != nil {
			*beats = heartbeat.New(c.Store.(*store.Store), heartbeat.Options{Observer: m})
			m.HeartbeatsPending((*beats).Pending, (*beats).PendingAge)
			c.Heartbeats = *beats
		}
	}
}

// /metrics answers without a token, and requests are counted under the
// route pattern the router matched: never the raw path, never a method a
// client made up, so the series stay bounded.
func TestMetricsHTTPByRoutePattern(t *testing.T) {
	m := metrics.New()
	b := setup(t, withMetrics(m, nil))
	for _, pk := range []string{"1", "2", "987654"} {
		b.must(http.StatusNotFound, b.do("GET", "/v1/nodes/"+pk, nil))
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", nil))
	b.do("BREW", "/v1/nodes/list", nil)
	b.do("GET", "/no/such/path/42", nil)
	b.must(http.StatusUnauthorized, b.do("POST", "/v1/nodes/list", nil, "Authorization", ""))

	s := apitest.Scrape(t, b.url+"/metrics") // no token
	if got := s.Get(t, "registryd_http_requests_total", "route", "/v1/nodes/{pk}", "method", "GET", "status", "404"); got != 3 {
		t.Errorf("GET /v1/nodes/{pk} 404 = %v, want 3", got)
	}
	if got := s.Get(t, "registryd_http_requests_total", "route", "/v1/nodes/list", "method", "POST", "status", "200"); got != 1 {
		t.Errorf("POST /v1/nodes/list 200 = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_http_requests_total", "route", "/v1/nodes/list", "method", "POST", "status", "401"); got != 1 {
		t.Errorf("POST /v1/nodes/list 401 = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_http_request_duration_seconds", "route", "/v1/nodes/{pk}", "method", "GET"); got != 3 {
		t.Errorf("latency observations of GET /v1/nodes/{pk} = %v, want 3", got)
	}
	if got := s.LabelValues("registryd_http_requests_total", "method"); strings.Contains(strings.Join(got, " "), "BREW") {
		t.Errorf("a made-up method became a label: %v", got)
	}
	if got := s.Get(t, "registryd_http_requests_total", "method", "other"); got != 1 {
		t.Errorf("requests with method other = %v, want 1", got)
	}
	// Every route label is a pattern of the router (or "unmatched").
	patterns := map[string]bool{"unmatched": true}
	srv := api.New(api.Config{Metrics: m.Handler()})
	_ = chi.Walk(srv.Router(), func(_, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		patterns[route] = true
		return nil
	})
	for _, route := range s.LabelValues("registryd_http_requests_total", "route") {
		if !patterns[route] {
			t.Errorf("route label %q is not a pattern of the router", route)
		}
		if strings.Contains(route, "987654") || strings.Contains(route, "42") {
			t.Errorf("route label %q carries a raw path", route)
		}
	}
	// In flight: this scrape itself, nothing else (once the requests
	// before it, answered already, have been counted out).
	apitest.Eventually(t, 5*time.Second, "in flight during a lone scrape is 1", func() bool {
		return apitest.Scrape(t, b.url+"/metrics").Get(t, "registryd_http_requests_in_flight") == 1
	})
	// The Go runtime and the process are reported too.
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := s.Value(t, name); !ok {
			t.Errorf("no %s", name)
		}
	}
}

// Without a metrics handler (metrics on a listener of their own) the API
// has no /metrics.
func TestMetricsOffTheAPIPort(t *testing.T) {
	m := metrics.New()
	b := setup(t, func(c *api.Config) { c.Observer = m })
	b.must(http.StatusNotFound, b.do("GET", "/metrics", nil, "Authorization", ""))
}

// Claims count granted, conflicting (409) and released nodes, with their
// latency.
func TestMetricsClaims(t *testing.T) {
	m := metrics.New()
	b := setup(t, withMetrics(m, nil))
	b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0})
	b.createNode(map[string]any{"ip": "10.0.0.1", "index": 1})
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 7, "count": 2}))
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 8, "count": 1}))
	b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 8, "count": 0}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 7, "nodes": []int64{1, 2, 99}}))

	s := apitest.Scrape(t, b.url+"/metrics")
	for name, want := range map[string]float64{
		"granted": 1, "conflict": 1, "error": 0,
	} {
		if got := s.Get(t, "registryd_claims_total", "outcome", name); got != want {
			t.Errorf("claims_total{outcome=%q} = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]float64{
		"registryd_claimed_nodes_total":              2,
		"registryd_claim_duration_seconds":           2, // an invalid claim never reaches the database
		"registryd_released_nodes_total":             2,
		"registryd_release_not_released_nodes_total": 1,
		"registryd_release_duration_seconds":         1,
	} {
		if got := s.Get(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// A request acting as a node through Node-Id records a heartbeat; a flush
// writes the batch.
func TestMetricsHeartbeats(t *testing.T) {
	m := metrics.New()
	var beats *heartbeat.Recorder
	b := setup(t, withMetrics(m, &beats))
	pk := b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0})
	other := b.createNode(map[string]any{"ip": "10.0.0.1", "index": 1})
	for _, n := range []int64{pk, pk, other} {
		b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", itoa(n)))
	}
	s := apitest.Scrape(t, b.url+"/metrics")
	if got := s.Get(t, "registryd_heartbeats_recorded_total"); got != 3 {
		t.Errorf("recorded = %v, want 3", got)
	}
	if got := s.Get(t, "registryd_heartbeats_pending"); got != 2 {
		t.Errorf("pending = %v, want 2 nodes", got)
	}
	if got := s.Get(t, "registryd_heartbeat_pending_age_seconds"); got <= 0 || got > 60 {
		t.Errorf("pending age = %v s, want the time since the first unflushed ping", got)
	}
	if err := beats.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	s = apitest.Scrape(t, b.url+"/metrics")
	for name, want := range map[string]float64{
		"registryd_heartbeats_pending":               0,
		"registryd_heartbeat_pending_age_seconds":    0,
		"registryd_heartbeats_lost_total":            0,
		"registryd_heartbeats_flushed_total":         2,
		"registryd_heartbeat_flush_batch_size":       1, // observations
		"registryd_heartbeat_flush_duration_seconds": 1,
		"registryd_heartbeat_flush_failures_total":   0,
	} {
		if got := s.Get(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if h := s.Family("registryd_heartbeat_flush_batch_size")[0].Histogram; h.GetSampleSum() != 2 {
		t.Errorf("batch size sum = %v, want 2", h.GetSampleSum())
	}

	// The database goes away: the flush fails and keeps the heartbeat.
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", itoa(pk)))
	b.store.Close()
	if err := beats.Flush(t.Context()); err == nil {
		t.Fatal("a flush on a closed store succeeded")
	}
	s = apitest.Scrape(t, b.url+"/metrics")
	if got := s.Get(t, "registryd_heartbeat_flush_failures_total"); got != 1 {
		t.Errorf("flush failures = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_heartbeats_pending"); got != 1 {
		t.Errorf("pending after a failed flush = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_heartbeat_flush_duration_seconds"); got != 2 {
		t.Errorf("flush durations = %v, want 2 (failed ones too)", got)
	}
}

// switchAuth verifies tokens until it is told to refuse them all, as a
// revocation would.
type switchAuth struct {
	api.Authenticator
	refuse atomic.Bool
}

func (a *switchAuth) Verify(tok string) (registry.Principal, error) {
	if a.refuse.Load() {
		return registry.Principal{}, errors.New("the token has been revoked")
	}
	return a.Authenticator.Verify(tok)
}

// Watch streams: open, events sent, refused by a limit, and ended for each
// reason the test can bring about (client gone, token revoked, feed cut).
func TestMetricsWatch(t *testing.T) {
	m := metrics.New()
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchAuth{Authenticator: verifier}
	hubCtx, stopHub := context.WithCancel(context.Background())
	t.Cleanup(stopHub)
	b := setup(t, withMetrics(m, nil), func(c *api.Config) {
		c.Auth = sw
		c.WatchRecheck = 50 * time.Millisecond
		hub := watch.New(c.Store.(*store.Store), watch.Options{
			Channels: watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
			Encode:   api.EncodeEvent, Poll: 100 * time.Millisecond, MaxStreams: 2,
		})
		t.Cleanup(lifecycle.Go(hubCtx, hub.Run))
		c.Events = hub
	})
	scrape := func() apitest.Samples { return apitest.Scrape(t, b.url+"/metrics") }
	gauge := func(name string, want float64, labels ...string) {
		t.Helper()
		apitest.Eventually(t, 10*time.Second, name+" reaches the expected value", func() bool {
			return scrape().Get(t, name, labels...) == want
		})
	}

	one := watchStream(t, b.url, "", b.token)
	two := watchStream(t, b.url, "", b.token)
	gauge("registryd_watch_streams", 2)
	gauge("registryd_http_requests_in_flight", 3) // two streams and the scrape
	if three := watchStream(t, b.url, "", b.token); three.status != http.StatusTooManyRequests {
		t.Fatalf("a third stream: %d, want 429", three.status)
	}
	if got := scrape().Get(t, "registryd_watch_streams_refused_total"); got != 1 {
		t.Errorf("refused = %v, want 1", got)
	}

	b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0})
	one.next()
	two.next()
	gauge("registryd_watch_events_sent_total", 2)

	// The client goes away.
	one.close()
	gauge("registryd_watch_streams_closed_total", 1, "reason", "client")
	gauge("registryd_watch_streams", 1)

	// The token is revoked: the recheck ends the stream.
	sw.refuse.Store(true)
	gauge("registryd_watch_streams_closed_total", 1, "reason", "token")
	gauge("registryd_watch_streams", 0)
	sw.refuse.Store(false)

	// The feed cuts the stream off (here: the hub stops).
	three := watchStream(t, b.url, "", b.token)
	if three.status != http.StatusOK {
		t.Fatalf("a new stream: %d", three.status)
	}
	gauge("registryd_watch_streams", 1)
	stopHub()
	gauge("registryd_watch_streams_closed_total", 1, "reason", "behind")
	gauge("registryd_watch_streams", 0)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A resuming stream whose change log cannot be read ends as "backfill".
func TestMetricsWatchBackfillFailure(t *testing.T) {
	m := metrics.New()
	b := setup(t, withMetrics(m, nil))
	b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0})
	// A first stream gets the event: the hub is up (a hub not yet up would
	// hold a new stream until it is, and with the database gone it never
	// would be).
	first := watchStream(t, b.url, "", b.token, "Last-Event-ID", "0")
	first.next()
	first.close()
	b.store.Close()
	s := watchStream(t, b.url, "", b.token, "Last-Event-ID", "0")
	if s.status != http.StatusOK {
		t.Fatalf("watch: %d", s.status)
	}
	apitest.Eventually(t, 10*time.Second, "the stream ends as backfill", func() bool {
		return apitest.Scrape(t, b.url+"/metrics").Get(t, "registryd_watch_streams_closed_total", "reason", "backfill") == 1
	})
	if got := apitest.Scrape(t, b.url+"/metrics").Get(t, "registryd_watch_streams"); got != 0 {
		t.Errorf("open streams = %v, want 0", got)
	}
}
