package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/metrics"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// statements counts what a store sends to PostgreSQL.
type statements struct{ n atomic.Int64 }

func (s *statements) observe(string) { s.n.Add(1) }

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fleetSQL makes generations H100 (3 free, 2 busy, 1 gone),
// A100 (4 free), B200 (no nodes) and 2 nodes without a generation (one
// busy, its provider's host stopped too: gone wins).
const fleetSQL = `
	INSERT INTO hardware_generations (name) VALUES ('H100'), ('A100'), ('B200');
	INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, current_job, schedulable)
	SELECT '10.0.0.1', g, 1, 'd', 1,
	       CASE WHEN g IN (3, 4) THEN 7 END, g <> 5
	FROM generate_series(0, 5) g;
	INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation)
	SELECT '10.0.0.2', g, 1, 'd', 2 FROM generate_series(0, 3) g;
	INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, current_job, schedulable)
	VALUES ('10.0.0.3', 0, 1, 'd', NULL, true), ('10.0.0.3', 1, 1, 'd', 9, false);
	UPDATE nodes SET fabric = CASE WHEN host(ip) = '10.0.0.1' THEN 'ib-a' ELSE 'ib-b' END WHERE host(ip) <> '10.0.0.3';`

// A scrape counts the fleet with one statement, whatever its size; scrapes
// within the interval (and concurrent ones) share it; the next interval
// counts again.
func TestFleetOneQueryPerInterval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var stmts statements
	st := pgtest.Open(t, pgtest.New(t), store.Options{ObserveQuery: stmts.observe})
	if _, err := st.Pool().Exec(ctx, fleetSQL); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	m := metrics.New()
	m.Fleet(ctx, metrics.FleetOptions{Query: st.FleetCounts, Now: clk.now})
	ts := httptest.NewServer(m.Handler())
	t.Cleanup(ts.Close)

	before := stmts.n.Load()
	s := apitest.Scrape(t, ts.URL)
	if got := stmts.n.Load() - before; got != 1 {
		t.Fatalf("the first scrape ran %d statements, want 1", got)
	}
	want := map[[2]string]float64{}
	for _, g := range []string{"H100", "A100", "B200", ""} {
		for _, st := range registry.States {
			want[[2]string{g, string(st)}] = 0 // every state, zero included
		}
	}
	want[[2]string{"H100", "free"}], want[[2]string{"H100", "busy"}], want[[2]string{"H100", "gone"}] = 3, 2, 1
	want[[2]string{"A100", "free"}] = 4
	want[[2]string{"", "free"}], want[[2]string{"", "gone"}] = 1, 1
	for k, n := range want {
		v, ok := s.Value(t, "registryd_fleet_nodes", "hardware_generation", k[0], "state", k[1])
		if !ok || v != n {
			t.Errorf("fleet_nodes{%q,%q} = %v (present %v), want %v", k[0], k[1], v, ok, n)
		}
	}
	if got := len(s.Family("registryd_fleet_nodes")); got != len(want) {
		t.Errorf("%d fleet_nodes series, want %d", got, len(want))
	}
	// By fabric: H100's host is ib-a, A100's ib-b; the nodes without a
	// generation have no fabric either, and no series.
	for _, c := range []struct {
		fabric, state string
		n             float64
	}{{"ib-a", "free", 3}, {"ib-a", "busy", 2}, {"ib-a", "gone", 1}, {"ib-a", "lost", 0}, {"ib-b", "free", 4}, {"ib-b", "busy", 0}} {
		if v, ok := s.Value(t, "registryd_fabric_nodes", "fabric", c.fabric, "state", c.state); !ok || v != c.n {
			t.Errorf("fabric_nodes{%q,%q} = %v (present %v), want %v", c.fabric, c.state, v, ok, c.n)
		}
	}
	if got := len(s.Family("registryd_fabric_nodes")); got != 2*len(registry.States) {
		t.Errorf("%d fabric_nodes series, want %d", got, 2*len(registry.States))
	}
	if got := s.Get(t, "registryd_fleet_refreshed_timestamp_seconds"); got != float64(clk.now().Unix()) {
		t.Errorf("refreshed = %v, want %v", got, clk.now().Unix())
	}

	// Another node; within the interval the figures stay, at no cost.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation) VALUES ('10.0.0.9', 0, 1, 'd', 2)`); err != nil {
		t.Fatal(err)
	}
	clk.add(metrics.DefaultFleetInterval - time.Second)
	before = stmts.n.Load()
	s = apitest.Scrape(t, ts.URL)
	if got := stmts.n.Load() - before; got != 0 {
		t.Fatalf("a scrape within the interval ran %d statements, want 0", got)
	}
	if got := s.Get(t, "registryd_fleet_nodes", "hardware_generation", "A100", "state", "free"); got != 4 {
		t.Errorf("A100 free within the interval = %v, want the cached 4", got)
	}

	// Past the interval, eight scrapes at once share one statement.
	clk.add(time.Second)
	before = stmts.n.Load()
	var wg sync.WaitGroup
	vals := make([]float64, 8)
	for i := range vals {
		wg.Go(func() {
			vals[i] = apitest.Scrape(t, ts.URL).Get(t, "registryd_fleet_nodes", "hardware_generation", "A100", "state", "free")
		})
	}
	wg.Wait()
	if got := stmts.n.Load() - before; got != 1 {
		t.Fatalf("8 concurrent scrapes ran %d statements, want 1", got)
	}
	for i, v := range vals {
		if v != 5 {
			t.Errorf("scrape %d: A100 free = %v, want 5", i, v)
		}
	}
	if got := s.Get(t, "registryd_fleet_queries_total"); got != 1 {
		t.Errorf("fleet_queries_total at the second scrape = %v, want 1", got)
	}
}

// A failing count keeps the last figures, counts the failure, and waits
// the interval like a success (a broken database is not asked per scrape).
func TestFleetQueryFailure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var stmts statements
	st := pgtest.Open(t, pgtest.New(t), store.Options{ObserveQuery: stmts.observe})
	if _, err := st.Pool().Exec(ctx, fleetSQL); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	m := metrics.New()
	m.Fleet(ctx, metrics.FleetOptions{Query: st.FleetCounts, Now: clk.now})
	ts := httptest.NewServer(m.Handler())
	t.Cleanup(ts.Close)
	apitest.Scrape(t, ts.URL)

	// The table goes away: the count fails.
	if _, err := st.Pool().Exec(ctx, `ALTER TABLE nodes RENAME TO nodes_gone`); err != nil {
		t.Fatal(err)
	}
	clk.add(metrics.DefaultFleetInterval)
	s := apitest.Scrape(t, ts.URL)
	if got := s.Get(t, "registryd_fleet_query_errors_total"); got != 1 {
		t.Errorf("fleet_query_errors_total = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_fleet_nodes", "hardware_generation", "H100", "state", "free"); got != 3 {
		t.Errorf("after a failure H100 free = %v, want the last figure 3", got)
	}
	before := stmts.n.Load()
	s = apitest.Scrape(t, ts.URL)
	if got := stmts.n.Load() - before; got != 0 {
		t.Errorf("a scrape right after a failed count ran %d statements, want 0", got)
	}
	if got := s.Get(t, "registryd_fleet_query_errors_total"); got != 1 {
		t.Errorf("fleet_query_errors_total = %v, want still 1", got)
	}
}

// The pool's figures are read at scrape time.
func TestPoolFigures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := pgtest.Open(t, pgtest.New(t), store.Options{MaxConns: 3})
	m := metrics.New()
	m.Pool(func() metrics.PoolStats {
		s := st.Pool().Stat()
		return metrics.PoolStats{Acquired: s.AcquiredConns(), Idle: s.IdleConns(), Max: s.MaxConns(), Total: s.TotalConns(),
			AcquireCount: s.AcquireCount(), EmptyAcquireCount: s.EmptyAcquireCount(),
			CanceledAcquireCount: s.CanceledAcquireCount(), AcquireWait: s.AcquireDuration()}
	})
	ts := httptest.NewServer(m.Handler())
	t.Cleanup(ts.Close)

	s := apitest.Scrape(t, ts.URL)
	if got := s.Get(t, "registryd_db_pool_max_connections"); got != 3 {
		t.Errorf("max = %v, want 3", got)
	}
	acquires := s.Get(t, "registryd_db_pool_acquires_total")
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s = apitest.Scrape(t, ts.URL)
	conn.Release()
	if got := s.Get(t, "registryd_db_pool_acquired_connections"); got != 1 {
		t.Errorf("acquired while one is held = %v, want 1", got)
	}
	if got := s.Get(t, "registryd_db_pool_acquires_total"); got != acquires+1 {
		t.Errorf("acquires = %v, want %v", got, acquires+1)
	}
	if got := s.Get(t, "registryd_db_pool_total_connections"); got < 1 {
		t.Errorf("total = %v, want at least 1", got)
	}
	s = apitest.Scrape(t, ts.URL)
	if got := s.Get(t, "registryd_db_pool_idle_connections"); got < 1 {
		t.Errorf("idle after the release = %v, want at least 1", got)
	}
	for _, name := range []string{"registryd_db_pool_acquire_wait_seconds_total", "registryd_db_pool_empty_acquires_total", "registryd_db_pool_canceled_acquires_total"} {
		if _, ok := s.Value(t, name); !ok {
			t.Errorf("no %s", name)
		}
	}
}

// Failed statements are counted by SQLSTATE class, or as connection,
// timeout or canceled; successes only in the total.
func TestQueryErrorsByClass(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := metrics.New()
	st := pgtest.Open(t, pgtest.New(t), store.Options{ObserveQuery: m.ObserveQuery, StatementTimeout: 200 * time.Millisecond})
	ts := httptest.NewServer(m.Handler())
	t.Cleanup(ts.Close)

	if _, err := st.Pool().Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	_, _ = st.Pool().Exec(ctx, `SELECT 1/0`)                  // 22012 division_by_zero
	_, _ = st.Pool().Exec(ctx, `SELECT * FROM no_such_table`) // 42P01 undefined_table
	_, _ = st.Pool().Exec(ctx, `SELECT pg_sleep(5)`)          // past the statement bound
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = st.Pool().Exec(canceled, `SELECT 1`)

	// No server at all: a connection error.
	url := fmt.Sprintf("postgres://nobody@127.0.0.1:%d/x?connect_timeout=2", freePort(t))
	if gone, err := store.Open(ctx, url, store.Options{ObserveQuery: m.ObserveQuery}); err == nil {
		_ = gone.Ping(ctx)
		gone.Close()
	}

	s := apitest.Scrape(t, ts.URL)
	for class, want := range map[string]float64{"22": 1, "42": 1, "timeout": 1, "canceled": 1, "connection": 1} {
		if got := s.Get(t, "registryd_db_query_errors_total", "class", class); got != want {
			t.Errorf("query_errors_total{class=%q} = %v, want %v", class, got, want)
		}
	}
	if got := s.LabelValues("registryd_db_query_errors_total", "class"); len(got) != 5 {
		t.Errorf("classes %v, want exactly the five above", got)
	}
	if got := s.Get(t, "registryd_db_queries_total"); got < 6 {
		t.Errorf("queries_total = %v, want at least 6", got)
	}
}

// Shared claim transactions: the operations each committed, by size, and
// those that failed.
func TestClaimGroups(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	ts := httptest.NewServer(m.Handler())
	t.Cleanup(ts.Close)
	m.ClaimGroup(2, nil)
	m.ClaimGroup(40, nil)
	m.ClaimGroup(0, errors.New("deadlock"))
	s := apitest.Scrape(t, ts.URL)
	if got := s.Get(t, "registryd_claim_group_size"); got != 2 {
		t.Errorf("claim_group_size count = %v, want 2", got)
	}
	if h := s.Family("registryd_claim_group_size"); len(h) != 1 || h[0].Histogram.GetSampleSum() != 42 {
		t.Errorf("claim_group_size: %v, want one histogram summing to 42", h)
	}
	if got := s.Get(t, "registryd_claim_group_failures_total"); got != 1 {
		t.Errorf("claim_group_failures_total = %v, want 1", got)
	}
}

// freePort is a local TCP port nobody listens on.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// registryd_build_info is one series of value 1 with the build's labels;
// setting it again replaces it.
func TestBuildInfo(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.SetBuild("v0.9.0", "aaa", "go1.1")
	m.SetBuild("v1.0.0", "bbb", "go1.2")
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	s := apitest.Scrape(t, srv.URL)
	if v, ok := s.Value(t, "registryd_build_info", "version", "v1.0.0", "revision", "bbb", "goversion", "go1.2"); !ok || v != 1 {
		t.Errorf("build_info = %v (present %v)", v, ok)
	}
	if n := len(s.Family("registryd_build_info")); n != 1 {
		t.Errorf("%d build_info series, want the last build's only", n)
	}
}

// A sweeper pass counts by outcome, with its time and its transitions by
// kind; a failed one counts apart and moves nothing.
func TestSweepPass(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.SweepPass(30*time.Millisecond, registry.Sweep{Lost: []int64{1, 2}, Expired: []int64{3}}, nil)
	m.SweepPass(10*time.Millisecond, registry.Sweep{Found: []int64{1}}, nil)
	m.SweepPass(time.Second, registry.Sweep{Lost: []int64{9}}, errors.New("lock timeout"))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	s := apitest.Scrape(t, srv.URL)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"registryd_sweeper_passes_total", []string{"outcome", "ok"}, 2},
		{"registryd_sweeper_passes_total", []string{"outcome", "failed"}, 1},
		{"registryd_sweeper_pass_duration_seconds", nil, 3},
		{"registryd_sweeper_transitions_total", []string{"kind", "lost"}, 2},
		{"registryd_sweeper_transitions_total", []string{"kind", "found"}, 1},
		{"registryd_sweeper_transitions_total", []string{"kind", "expired"}, 1},
	} {
		if got, ok := s.Value(t, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

// The agent-token figures show, per subject, the earliest expiry and the
// least share of lifetime left among the tokens used in the last 10
// minutes. Tokens count one by one, though the agents of a DaemonSet share
// a lineage: one that stops renewing shows among many that renew. A
// token unused for 10 minutes (renewed, or its host gone) drops out.
func TestAgentTokens(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	metrics.SetClock(m, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	tok := func(id string, issued time.Time, life time.Duration) registry.TokenInfo {
		return registry.TokenInfo{ID: id, Lineage: "pool-a-secret", Issued: issued, Expires: issued.Add(life)}
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	expect := func(sub string, expires time.Time, left float64) {
		t.Helper()
		s := apitest.Scrape(t, srv.URL)
		if got, ok := s.Value(t, "registryd_agent_token_expiry_timestamp_seconds", "sub", sub); !ok || got != float64(expires.Unix()) {
			t.Errorf("%s: expiry %v (present %v), want %v", sub, got, ok, expires.Unix())
		}
		if got, ok := s.Value(t, "registryd_agent_token_life_left_ratio", "sub", sub); !ok || math.Abs(got-left) > 0.001 {
			t.Errorf("%s: life left %v (present %v), want %v", sub, got, ok, left)
		}
	}
	t0 := now
	// Two hosts of pool-a with 24h tokens of one lineage, one of them 18h
	// old; pool-b with a 90-day token.
	m.AgentTokenSeen("pool-a", tok("h1", t0, 24*time.Hour))
	m.AgentTokenSeen("pool-a", tok("h2", t0.Add(-18*time.Hour), 24*time.Hour))
	m.AgentTokenSeen("pool-b", registry.TokenInfo{Issued: t0, Expires: t0.Add(90 * 24 * time.Hour)}) // no jti
	expect("pool-a", t0.Add(6*time.Hour), 0.25)
	expect("pool-b", t0.Add(90*24*time.Hour), 1)

	// h2 renews and uses only its renewal: 10 minutes on, the old token is
	// gone from the figures, and so is pool-b, whose host went quiet.
	advance(time.Minute)
	renewedAt := now
	m.AgentTokenSeen("pool-a", tok("h2-renewed", renewedAt, 24*time.Hour))
	expect("pool-a", t0.Add(6*time.Hour), 0.25-float64(time.Minute)/float64(24*time.Hour))
	advance(10*time.Minute + time.Second)
	m.AgentTokenSeen("pool-a", tok("h1", t0, 24*time.Hour))
	m.AgentTokenSeen("pool-a", tok("h2-renewed", renewedAt, 24*time.Hour))
	expect("pool-a", t0.Add(24*time.Hour), 1-float64(11*time.Minute+time.Second)/float64(24*time.Hour))
	if _, ok := apitest.Scrape(t, srv.URL).Value(t, "registryd_agent_token_expiry_timestamp_seconds", "sub", "pool-b"); ok {
		t.Error("a subject whose tokens went unused for 10 minutes is still shown")
	}
}

// Tokens nobody scrapes for are dropped anyway once unused for 10
// minutes: the figures' memory does not grow with every renewal.
func TestAgentTokensPrunedUnscraped(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	metrics.SetClock(m, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	for i := range 1000 {
		m.AgentTokenSeen("pool", registry.TokenInfo{ID: fmt.Sprint("t", i), Issued: now, Expires: now.Add(time.Hour)})
	}
	if n := metrics.AgentTokens(m); n != 1000 {
		t.Fatalf("%d tokens remembered, want 1000", n)
	}
	mu.Lock()
	now = now.Add(11 * time.Minute)
	mu.Unlock()
	m.AgentTokenSeen("pool", registry.TokenInfo{ID: "fresh", Issued: now, Expires: now.Add(time.Hour)})
	if n := metrics.AgentTokens(m); n != 1 {
		t.Fatalf("%d tokens remembered after 11 idle minutes, want the fresh one only", n)
	}
}
