// Package metrics is registryd's Prometheus instrumentation: every family
// on a registry of its own (never the global default, so servers can be
// built side by side), and the hooks the other packages call. Those
// packages do not import it: each declares the small interface or plain
// function it calls, and cmd/registryd hands them a *Metrics.
//
// Labels take values from small fixed sets only (route patterns, methods,
// status codes, providers, SQLSTATE classes, hardware generations,
// states), never from what a client sends: the number of series stays
// bounded whatever the traffic.
package metrics

import (
	"context"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/registryd/registryd/internal/registry"
)

const namespace = "registryd"

// Metrics holds every family. The zero value is not usable; call New.
type Metrics struct {
	reg *prometheus.Registry
	// names are the families registered so far (register).
	names map[string]bool

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	httpInFlight prometheus.Gauge

	dbQueries      prometheus.Counter
	dbQueryErrors  *prometheus.CounterVec
	hbRecorded     prometheus.Counter
	hbFlushed      prometheus.Counter
	hbBatch        prometheus.Histogram
	hbFlushSeconds prometheus.Histogram
	hbFailures     prometheus.Counter
	hbLost         prometheus.Counter

	claims         *prometheus.CounterVec
	claimedNodes   prometheus.Counter
	claimSeconds   prometheus.Histogram
	releasedNodes  prometheus.Counter
	notReleased    prometheus.Counter
	releaseSeconds prometheus.Histogram
	groupSize      prometheus.Histogram
	groupFailures  prometheus.Counter

	watchStreams prometheus.Gauge
	watchSent    prometheus.Counter
	watchClosed  *prometheus.CounterVec
	watchRefused prometheus.Counter
	syncSeconds  *prometheus.HistogramVec
	syncNodes    *prometheus.CounterVec
	syncFailures *prometheus.CounterVec
	syncLastOK   *prometheus.GaugeVec

	buildInfo *prometheus.GaugeVec

	sweepPasses      *prometheus.CounterVec
	sweepSeconds     prometheus.Histogram
	sweepTransitions *prometheus.CounterVec

	agentTokens   *agentTokens
	tokenRenewals *prometheus.CounterVec
}

// New makes the families and registers them, with the process and Go
// runtime collectors, on a registry of their own.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), names: map[string]bool{}}
	f := promauto{m}
	m.httpRequests = f.counterVec("http_requests_total",
		"HTTP requests answered, by route pattern (not the raw path), method and status.", "route", "method", "status")
	m.httpDuration = f.histogramVec("http_request_duration_seconds",
		"Time from a request's arrival to its handler's return, by route pattern and method (watch streams count their whole life).",
		prometheus.DefBuckets, "route", "method")
	m.httpInFlight = f.gauge("http_requests_in_flight", "Requests being served now, open watch streams included.")

	m.dbQueries = f.counter("db_queries_total", "Statements run through the pool, failed ones included.")
	m.dbQueryErrors = f.counterVec("db_query_errors_total",
		`Failed statements by class: the SQLSTATE class (its first two characters) for errors the server reported, or "connection", "timeout", "canceled", "other".`, "class")

	m.hbRecorded = f.counter("heartbeats_recorded_total", "Heartbeats received (requests acting as a node through Node-Id that succeeded).")
	m.hbFlushed = f.counter("heartbeats_flushed_total", "Nodes whose last_seen a flush wrote.")
	m.hbBatch = f.histogram("heartbeat_flush_batch_size", "Nodes per heartbeat flush (one UPDATE each).",
		prometheus.ExponentialBuckets(1, 4, 10)) // 1 … 262,144
	m.hbFlushSeconds = f.histogram("heartbeat_flush_duration_seconds", "Time one heartbeat flush took, failed ones included.", prometheus.DefBuckets)
	m.hbFailures = f.counter("heartbeat_flush_failures_total", "Heartbeat flushes that failed (their heartbeats are kept for the next).")
	m.hbLost = f.counter("heartbeats_lost_total", "Nodes whose acknowledged heartbeat was dropped unwritten because the final flush at stop failed (a crash loses what heartbeats_pending showed, uncounted).")

	m.claims = f.counterVec("claims_total", `Claim requests that reached the database, by outcome: "granted", "conflict" (409: not enough free nodes match), "error".`, "outcome")
	m.claimedNodes = f.counter("claimed_nodes_total", "Nodes granted to jobs by claims.")
	m.claimSeconds = f.histogram("claim_duration_seconds", "Time the database took to grant or refuse a claim.", prometheus.DefBuckets)
	m.releasedNodes = f.counter("released_nodes_total", "Nodes released by their jobs.")
	m.notReleased = f.counter("release_not_released_nodes_total", "Nodes a release named that were not released (not held by the job, or gone).")
	m.releaseSeconds = f.histogram("release_duration_seconds", "Time the database took to release nodes.", prometheus.DefBuckets)
	m.groupSize = f.histogram("claim_group_size",
		"Claims and releases committed per shared transaction (group commit under load; an operation alone is not counted).",
		prometheus.ExponentialBuckets(2, 2, 6)) // 2 … 64
	m.groupFailures = f.counter("claim_group_failures_total",
		"Shared transactions of claims and releases that failed: rolled back and each operation run again alone, or lost at COMMIT and each failed.")

	m.watchStreams = f.gauge("watch_streams", "Watch streams open now.")
	m.watchSent = f.counter("watch_events_sent_total", "Node events written to watch streams (backfilled ones included).")
	m.watchClosed = f.counterVec("watch_streams_closed_total",
		`Watch streams ended, by reason: "client" (went away), "token" (revoked or expired), "behind" (fell too far behind the feed, or the server is stopping), "write" (a write failed or timed out), "backfill" (reading the change log failed), "reset" (the change feed began a new epoch, after a failover, a restore or a reset of its sequence; the stream was sent a reset).`, "reason")
	m.watchRefused = f.counter("watch_streams_refused_total", "Watch streams refused with 429 because a stream limit was reached.")

	m.syncSeconds = f.histogramVec("sync_pass_duration_seconds", "Time of one provider's sync pass, failed ones included.",
		[]float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}, "provider")
	m.syncNodes = f.counterVec("sync_nodes_total",
		`Nodes a sync pass handled, by provider and result: "added", "updated", "unchanged", "removed", "kept_busy", "withheld" (would have been removed or marked gone, held back by the mass-removal guard).`, "provider", "result")
	m.syncFailures = f.counterVec("sync_failures_total", "Sync passes of a provider that failed (nothing changed for it).", "provider")
	m.syncLastOK = f.gaugeVec("sync_last_success_timestamp_seconds", "When a provider's last successful sync pass ended, as a Unix time.", "provider")

	m.sweepPasses = f.counterVec("sweeper_passes_total",
		`Lifecycle sweeper passes this replica ran (it runs them while it leads), by outcome: "ok" or "failed".`, "outcome")
	m.sweepSeconds = f.histogram("sweeper_pass_duration_seconds", "Time of one lifecycle sweeper pass, failed ones included.",
		[]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10})
	m.sweepTransitions = f.counterVec("sweeper_transitions_total",
		`Nodes the sweeper moved, by kind: "lost" (silent past the node TTL), "found" (heard from again), "expired" (a lease ran out and the node was released).`, "kind")
	m.buildInfo = f.gaugeVec("build_info",
		`Always 1, labelled with the build: version (the module's, or "(devel)"), revision (the VCS commit, "" when unknown) and goversion.`,
		"version", "revision", "goversion")

	m.tokenRenewals = f.counterVec("token_renewals_total",
		`Agent token renewals (POST /v1/tokens/renew), by result: "renewed", "refused" (the token may not be renewed: 403), "error".`, "result")
	m.agentTokens = &agentTokens{now: time.Now}
	m.register(m.agentTokens)

	m.register(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// SweepPass records one lifecycle sweeper pass.
func (m *Metrics) SweepPass(d time.Duration, done registry.Sweep, err error) {
	m.sweepSeconds.Observe(d.Seconds())
	if err != nil {
		m.sweepPasses.WithLabelValues("failed").Inc()
		return
	}
	m.sweepPasses.WithLabelValues("ok").Inc()
	m.sweepTransitions.WithLabelValues("lost").Add(float64(len(done.Lost)))
	m.sweepTransitions.WithLabelValues("found").Add(float64(len(done.Found)))
	m.sweepTransitions.WithLabelValues("expired").Add(float64(len(done.Expired)))
}

// SetBuild records the build registryd_build_info describes; a later call
// replaces it.
func (m *Metrics) SetBuild(version, revision, goVersion string) {
	m.buildInfo.Reset()
	m.buildInfo.WithLabelValues(version, revision, goVersion).Set(1)
}

// Handler serves the exposition (text or protobuf, as the scraper asks).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Registry is the registry every family is on, for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// methods are the HTTP methods counted by name; others count as "other"
// (a client may send any token as a method).
var methods = map[string]string{"GET": "GET", "HEAD": "HEAD", "POST": "POST", "PUT": "PUT", "PATCH": "PATCH",
	"DELETE": "DELETE", "OPTIONS": "OPTIONS"}

// statuses are the status codes as label values, made once: no
// allocation per request.
var statuses = func() (s [600]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func statusText(code int) string {
	if code >= 0 && code < len(statuses) {
		return statuses[code]
	}
	return strconv.Itoa(code)
}

// RequestStarted counts a request in flight.
func (m *Metrics) RequestStarted() { m.httpInFlight.Inc() }

// RequestDone counts a request answered. route is the router's pattern
// ("" when no route matched).
func (m *Metrics) RequestDone(route, method string, status int, d time.Duration) {
	m.httpInFlight.Dec()
	if route == "" {
		route = "unmatched"
	}
	method, ok := methods[method]
	if !ok {
		method = "other"
	}
	m.httpRequests.WithLabelValues(route, method, statusText(status)).Inc()
	m.httpDuration.WithLabelValues(route, method).Observe(d.Seconds())
}

// ObserveQuery counts a statement that ended; class "" for success,
// otherwise the failure's class.
func (m *Metrics) ObserveQuery(class string) {
	m.dbQueries.Inc()
	if class != "" {
		m.dbQueryErrors.WithLabelValues(class).Inc()
	}
}

// ClaimGroup records one shared transaction of claims and releases: the
// operations it committed, or the error that failed it.
func (m *Metrics) ClaimGroup(committed int, err error) {
	if err != nil {
		m.groupFailures.Inc()
		return
	}
	m.groupSize.Observe(float64(committed))
}

// HeartbeatRecorded counts one heartbeat. It is on every agent request's
// path: one atomic add.
func (m *Metrics) HeartbeatRecorded() { m.hbRecorded.Inc() }

// HeartbeatFlushed records one flush of nodes heartbeats.
func (m *Metrics) HeartbeatFlushed(nodes int, d time.Duration, err error) {
	m.hbFlushSeconds.Observe(d.Seconds())
	if err != nil {
		m.hbFailures.Inc()
		return
	}
	m.hbBatch.Observe(float64(nodes))
	m.hbFlushed.Add(float64(nodes))
}

// HeartbeatsLost counts nodes whose acknowledged heartbeat was dropped.
func (m *Metrics) HeartbeatsLost(nodes int) { m.hbLost.Add(float64(nodes)) }

// HeartbeatsPending reports, at scrape time, how many acknowledged
// heartbeats wait to be flushed and how long the oldest has waited: what a
// crash of this replica would lose.
func (m *Metrics) HeartbeatsPending(pending func() int, age func() time.Duration) {
	m.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "heartbeats_pending",
		Help: "Nodes whose acknowledged heartbeat waits for the next flush (lost if the replica dies now)."}, func() float64 { return float64(pending()) }))
	m.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "heartbeat_pending_age_seconds",
		Help: "How long the oldest acknowledged heartbeat not yet written has waited (about the flush interval when healthy)."}, func() float64 { return age().Seconds() }))
}

// Claim outcomes.
const (
	ClaimGranted  = "granted"
	ClaimConflict = "conflict"
	ClaimError    = "error"
)

// Claimed records a claim that reached the database: its outcome (one of
// the Claim constants), the nodes granted and the time it took.
func (m *Metrics) Claimed(outcome string, nodes int, d time.Duration) {
	m.claims.WithLabelValues(outcome).Inc()
	m.claimedNodes.Add(float64(nodes))
	m.claimSeconds.Observe(d.Seconds())
}

// Released records a release: nodes released, nodes named but not
// released, and the time it took.
func (m *Metrics) Released(released, notReleased int, d time.Duration) {
	m.releasedNodes.Add(float64(released))
	m.notReleased.Add(float64(notReleased))
	m.releaseSeconds.Observe(d.Seconds())
}

// WatchOpened counts an open watch stream.
func (m *Metrics) WatchOpened() { m.watchStreams.Inc() }

// WatchSent counts events written to a watch stream.
func (m *Metrics) WatchSent(events int) { m.watchSent.Add(float64(events)) }

// WatchClosed counts a watch stream's end, by reason.
func (m *Metrics) WatchClosed(reason string) {
	m.watchStreams.Dec()
	m.watchClosed.WithLabelValues(reason).Inc()
}

// WatchRefused counts a watch stream refused by a limit.
func (m *Metrics) WatchRefused() { m.watchRefused.Inc() }

// SyncPass records one provider's sync pass; err is the pass's failure.
func (m *Metrics) SyncPass(provider string, d time.Duration, r registry.ImportResult, err error, end time.Time) {
	m.syncSeconds.WithLabelValues(provider).Observe(d.Seconds())
	if err != nil {
		m.syncFailures.WithLabelValues(provider).Inc()
		return
	}
	for result, n := range map[string]int{"added": r.Added, "updated": r.Updated, "unchanged": r.Unchanged,
		"removed": r.Removed, "kept_busy": r.KeptBusy, "withheld": r.Withheld} {
		m.syncNodes.WithLabelValues(provider, result).Add(float64(n))
	}
	m.syncLastOK.WithLabelValues(provider).Set(float64(end.UnixNano()) / 1e9)
}

// register registers cs and remembers the names of their families.
func (m *Metrics) register(cs ...prometheus.Collector) {
	for _, c := range cs {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if n := fqNameRE.FindStringSubmatch(d.String()); n != nil {
				m.names[n[1]] = true
			}
		}
	}
	m.reg.MustRegister(cs...)
}

// fqNameRE finds a family's name in a Desc's String.
var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// Families is the name of every family registered so far, sorted.
func (m *Metrics) Families() []string { return slices.Sorted(maps.Keys(m.names)) }

// AllFamilies is the name of every family a serving registryd exports
// (with the collectors serve adds), sorted: dashboards and alert rules
// are checked against it.
func AllFamilies() []string {
	m := New()
	m.Pool(func() PoolStats { return PoolStats{} })
	m.Fleet(context.Background(), FleetOptions{})
	m.NodeCache(func() NodeCacheStats { return NodeCacheStats{} })
	m.HeartbeatsPending(func() int { return 0 }, func() time.Duration { return 0 })
	return m.Families()
}

// promauto makes families with the namespace and registers them.
type promauto struct{ m *Metrics }

func (p promauto) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	p.m.register(c)
	return c
}

func (p promauto) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	p.m.register(c)
	return c
}

func (p promauto) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	p.m.register(g)
	return g
}

func (p promauto) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	p.m.register(g)
	return g
}

func (p promauto) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets})
	p.m.register(h)
	return h
}

func (p promauto) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
	p.m.register(h)
	return h
}
