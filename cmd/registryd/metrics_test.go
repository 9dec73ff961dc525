package main

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// serve exposes /metrics on its API port, without a token: the pool, the
// statements, the fleet, the HTTP requests and the process, as wired in
// the real binary.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_DB_MAX_CONNS": "7"}
	srv := startServer(t, env)
	tok := adminToken(t, env)
	if code, body := call(t, "POST", srv.url+"/v1/nodes/create",
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, tok); code != 201 {
		t.Fatalf("create %d %s", code, body)
	}
	if code, body := call(t, "GET", srv.url+"/v1/nodes/ping", "", tok); code != 200 {
		t.Fatalf("ping %d %s", code, body)
	}

	s := apitest.Scrape(t, srv.url+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"registryd_db_pool_max_connections", nil, 7},
		{"registryd_fleet_nodes", []string{"hardware_generation", "", "state", "free"}, 1},
		{"registryd_fleet_nodes", []string{"hardware_generation", "", "state", "busy"}, 0},
		{"registryd_http_requests_total", []string{"route", "/v1/nodes/create", "method", "POST", "status", "201"}, 1},
		{"registryd_heartbeats_pending", nil, 0},
		{"registryd_heartbeat_pending_age_seconds", nil, 0},
		{"registryd_heartbeats_lost_total", nil, 0},
		{"registryd_watch_streams", nil, 0},
		{"registryd_build_info", []string{"goversion", runtime.Version()}, 1},
	} {
		if got, ok := s.Value(t, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := s.Get(t, "registryd_db_queries_total"); got < 1 {
		t.Errorf("db_queries_total = %v: the store's statements are not counted", got)
	}
	for _, name := range []string{"go_goroutines", "process_open_fds", "registryd_db_pool_acquires_total"} {
		if _, ok := s.Value(t, name); !ok {
			t.Errorf("no %s", name)
		}
	}
	// serve's lifecycle sweeper reports its passes.
	apitest.Eventually(t, 10*time.Second, "a sweeper pass in the metrics", func() bool {
		v, ok := apitest.Scrape(t, srv.url+"/metrics").Value(t, "registryd_sweeper_passes_total", "outcome", "ok")
		return ok && v >= 1
	})
}

// Concurrent claims and releases through the API commit in shared
// transactions, and serve hands the store's reports of them to
// claim_group_size. Fault caught (tried once): the observer not wired.
func TestServeClaimGroupMetrics(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret}
	srv := startServer(t, env)
	tok := adminToken(t, env)
	for i := range 8 {
		if code, body := call(t, "POST", srv.url+"/v1/nodes/create",
			fmt.Sprintf(`{"ip":"10.0.0.1","index":%d,"cpu_mem":1,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, i), tok); code != 201 {
			t.Fatalf("create %d %s", code, body)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; apitest.Scrape(t, srv.url+"/metrics").Get(t, "registryd_claim_group_size") == 0; round++ {
		if time.Now().After(deadline) {
			t.Fatal("no shared claim transaction reported after 20 s of concurrent claims")
		}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				job := round*100 + w + 1
				if code, body := call(t, "POST", srv.url+"/v1/nodes/claim", fmt.Sprintf(`{"job":%d}`, job), tok); code != 200 && code != 409 {
					t.Errorf("claim %d %s", code, body)
				}
				if code, body := call(t, "POST", srv.url+"/v1/nodes/release", fmt.Sprintf(`{"job":%d}`, job), tok); code != 200 {
					t.Errorf("release %d %s", code, body)
				}
			})
		}
		wg.Wait()
	}
}

// REGISTRY_METRICS_LISTEN moves /metrics to a listener of its own: the
// API's port no longer has it, and the metrics port serves nothing else.
func TestServeMetricsListener(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_METRICS_LISTEN": addr}
	srv := startServer(t, env)
	if code, _ := call(t, "GET", srv.url+"/metrics", ""); code != http.StatusNotFound {
		t.Errorf("/metrics on the API port: %d, want 404", code)
	}
	s := apitest.Scrape(t, "http://"+addr+"/metrics")
	if _, ok := s.Value(t, "registryd_db_pool_max_connections"); !ok {
		t.Error("the metrics port lacks the pool figures")
	}
	for _, path := range []string{"/v1/nodes/list", "/healthz"} {
		// Not call: its client holds answers to openapi.yaml, and this
		// port is no part of the API.
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s on the metrics port: %d, want 404", path, resp.StatusCode)
		}
	}

	// A taken metrics port fails at once, naming the setting.
	_, _, err := runCmd(t, map[string]string{"REGISTRY_DATABASE_URL": env["REGISTRY_DATABASE_URL"], "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_METRICS_LISTEN": addr}, "serve")
	if err == nil || !strings.Contains(err.Error(), "REGISTRY_METRICS_LISTEN") {
		t.Errorf("taken metrics port: %v", err)
	}
	if err := srv.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// Stopped with the server.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the metrics port still accepts connections after serve stopped")
	}
}

func TestMetricsConfigErrors(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"REGISTRY_METRICS_LISTEN": "9090"},
		{"REGISTRY_METRICS_FLEET_INTERVAL": "5s"},
		{"REGISTRY_METRICS_FLEET_INTERVAL": "2h"},
		{"REGISTRY_METRICS_FLEET_INTERVAL": "often"},
	} {
		env["REGISTRY_DATABASE_URL"] = "postgres://registry@127.0.0.1:1/registry?connect_timeout=2"
		env["REGISTRY_LISTEN"] = "127.0.0.1:0"
		_, _, err := runCmd(t, env, "serve")
		for k := range env {
			if strings.HasPrefix(k, "REGISTRY_METRICS_") && (err == nil || !strings.Contains(err.Error(), k)) {
				t.Errorf("%v: error %v does not name %s", env, err, k)
			}
		}
	}
	cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_METRICS_FLEET_INTERVAL": "1m", "REGISTRY_METRICS_LISTEN": "127.0.0.1:9090"}))
	if err != nil || cfg.Metrics.FleetInterval != time.Minute || cfg.Metrics.Listen != "127.0.0.1:9090" {
		t.Errorf("valid metrics settings: %+v, %v", cfg.Metrics, err)
	}
}

// serve's sync loop reports each pass per provider: nodes by result,
// duration, the last success, and failures.
func TestServeSyncMetrics(t *testing.T) {
	t.Parallel()
	scp := fakeSCP(t)
	env := syncEnv(t, scp, nil)
	env["REGISTRY_SYNC_INTERVAL"] = "1s"
	srv := startServer(t, env)
	scrape := func() apitest.Samples { return apitest.Scrape(t, srv.url+"/metrics") }
	apitest.Eventually(t, 20*time.Second, "a sync pass adds 8 scp nodes", func() bool {
		return scrape().Get(t, "registryd_sync_nodes_total", "provider", "scp", "result", "added") == 8
	})
	s := scrape()
	if got := s.Get(t, "registryd_sync_last_success_timestamp_seconds", "provider", "scp"); time.Since(time.Unix(int64(got), 0)) > time.Minute {
		t.Errorf("last success = %v, not just now", got)
	}
	if got := s.Get(t, "registryd_sync_pass_duration_seconds", "provider", "scp"); got < 1 {
		t.Errorf("pass durations observed = %v", got)
	}
	if got := s.Get(t, "registryd_sync_failures_total", "provider", "scp"); got != 0 {
		t.Errorf("failures = %v before any", got)
	}
	apitest.Eventually(t, 20*time.Second, "a pass counts the 8 nodes unchanged", func() bool {
		return scrape().Get(t, "registryd_sync_nodes_total", "provider", "scp", "result", "unchanged") >= 8
	})

	// The provider breaks: failures are counted, the last success stays.
	last := scrape().Get(t, "registryd_sync_last_success_timestamp_seconds", "provider", "scp")
	scp.Lock()
	scp.SecretKey = "rotated-" + fmt.Sprint(time.Now().UnixNano())
	scp.Unlock()
	apitest.Eventually(t, 20*time.Second, "a failed pass is counted", func() bool {
		return scrape().Get(t, "registryd_sync_failures_total", "provider", "scp") >= 1
	})
	s = scrape()
	if got := s.Get(t, "registryd_sync_last_success_timestamp_seconds", "provider", "scp"); got < last {
		t.Errorf("last success went back from %v to %v", last, got)
	}
}

// freeAddr is a local address nobody listens on (just now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
