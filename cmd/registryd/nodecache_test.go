package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/pgtest"
)

func TestNodeCacheConfig(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int
		err  bool
	}{
		{"", nodecache.DefaultSize, false},
		{"0", 0, false},
		{"1000", 1000, false},
		{"10000000", 10_000_000, false},
		{"-1", 0, true},
		{"10000001", 0, true},
		{"many", 0, true},
	} {
		c, err := loadConfig(envFunc(map[string]string{"REGISTRY_NODE_CACHE": tc.v}))
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "REGISTRY_NODE_CACHE")):
			t.Errorf("REGISTRY_NODE_CACHE=%q: %v, want an error naming the variable", tc.v, err)
		case !tc.err && (err != nil || c.NodeCache != tc.want):
			t.Errorf("REGISTRY_NODE_CACHE=%q: %v, %v; want %v", tc.v, c.NodeCache, err, tc.want)
		}
	}
}

// Two `registryd serve` replicas, one with the node cache and one without:
// a change and a heartbeat through either show in a GET on the other
// within the cache's bound, last_seen as fresh as a heartbeat flush.
func TestServeNodeCacheAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := func(size string) map[string]string {
		return map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_NODE_CACHE": size}
	}
	a, b := startServer(t, env("1000")), startServer(t, env("0"))
	admin := adminToken(t, env("0"))
	out, stderr, err := runCmd(t, env("0"), "token", "--sub", "agent-cache", "--role", "agent")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	agent := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	code, body := call(t, "POST", b.url+"/v1/nodes/create",
		`{"ip":"10.4.0.1","index":0,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, agent)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var n struct{ PK int64 }
	_ = json.Unmarshal([]byte(body), &n)
	node := func(srv *server) map[string]any {
		t.Helper()
		code, body := call(t, "GET", fmt.Sprintf("%s/v1/nodes/%d", srv.url, n.PK), "", admin)
		var m map[string]any
		if code != 200 || json.Unmarshal([]byte(body), &m) != nil {
			t.Fatalf("get: %d %s", code, body)
		}
		return m
	}
	if got := node(a)["last_seen"]; got != nil {
		t.Fatalf("last_seen %v before any heartbeat", got)
	}
	// A heartbeat through b (no cache) reaches a's cached copy once b flushes.
	req, _ := http.NewRequest("GET", b.url+"/v1/nodes/ping", nil)
	req.Header.Set("Authorization", "Bearer "+agent)
	req.Header.Set("Node-Id", strconv.FormatInt(n.PK, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("heartbeat: %d", resp.StatusCode)
	}
	apitest.Eventually(t, 3*time.Second, "the heartbeat shows on the cached replica", func() bool {
		return node(a)["last_seen"] != nil
	})
	if x, y := node(a)["last_seen"], node(b)["last_seen"]; x != y {
		t.Errorf("last_seen %v on the cached replica, %v in PostgreSQL", x, y)
	}
	code, body = call(t, "PATCH", fmt.Sprintf("%s/v1/nodes/%d", b.url, n.PK), `{"driver_version":"560"}`, admin)
	if code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	apitest.Eventually(t, nodecache.DefaultMaxStale, "the update shows on the cached replica", func() bool {
		return node(a)["driver_version"] == "560"
	})
	// The cached replica holds the whole fleet, so it answers list pages
	// from memory, b's update included; /metrics says so.
	apitest.Eventually(t, 5*time.Second, "the cache holds the whole fleet", func() bool {
		return apitest.Scrape(t, a.url+"/metrics").Get(t, "registryd_node_cache_complete") == 1
	})
	pages := apitest.Scrape(t, a.url+"/metrics").Get(t, "registryd_node_cache_list_pages_total", "source", "memory")
	code, body = call(t, "POST", a.url+"/v1/nodes/list", `{"free":true,"limit":10}`, admin)
	var listed []map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &listed) != nil || len(listed) != 1 || listed[0]["driver_version"] != "560" {
		t.Fatalf("list on the cached replica: %d %s", code, body)
	}
	if got := apitest.Scrape(t, a.url+"/metrics").Get(t, "registryd_node_cache_list_pages_total", "source", "memory"); got != pages+1 {
		t.Fatalf("list pages from memory %v, want %v", got, pages+1)
	}
}

func TestLogHeartbeatsConfig(t *testing.T) {
	for v, want := range map[string]bool{"": false, "false": false, "true": true, "1": true} {
		c, err := loadConfig(envFunc(map[string]string{"REGISTRY_LOG_HEARTBEATS": v}))
		if err != nil || c.LogHeartbeats != want {
			t.Errorf("REGISTRY_LOG_HEARTBEATS=%q: %v, %v; want %v", v, c.LogHeartbeats, err, want)
		}
	}
	if _, err := loadConfig(envFunc(map[string]string{"REGISTRY_LOG_HEARTBEATS": "sometimes"})); err == nil || !strings.Contains(err.Error(), "REGISTRY_LOG_HEARTBEATS") {
		t.Errorf("REGISTRY_LOG_HEARTBEATS=sometimes: %v, want an error naming the variable", err)
	}
}
