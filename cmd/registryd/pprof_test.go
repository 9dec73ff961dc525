package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
)

// get fetches url with a plain client (these paths are no part of the
// API's contract) and returns the status and body.
func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// REGISTRY_PPROF serves Go's profiles on the metrics listener, and only
// there: the API's port answers 404 whether it is on or off, and the
// metrics listener answers 404 when it is off.
func TestServePprof(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	on, off := freeAddr(t), freeAddr(t)
	withPprof := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_METRICS_LISTEN": on, "REGISTRY_PPROF": "true"})
	without := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_METRICS_LISTEN": off})

	if code, body := get(t, "http://"+on+"/debug/pprof/"); code != http.StatusOK || !bytes.Contains(body, []byte("goroutine")) {
		t.Errorf("the profiles' index on the metrics listener: %d %.200s", code, body)
	}
	// A CPU profile is gzipped protobuf.
	if code, body := get(t, "http://"+on+"/debug/pprof/profile?seconds=1"); code != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Errorf("a CPU profile: %d %.200q", code, body)
	}
	for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
		if code, _ := get(t, "http://"+on+path); code != http.StatusOK {
			t.Errorf("%s: %d", path, code)
		}
	}
	if code, _ := get(t, "http://"+on+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics next to the profiles: %d", code)
	}
	for _, url := range []string{"http://" + off + "/debug/pprof/", "http://" + off + "/debug/pprof/profile?seconds=1",
		withPprof.url + "/debug/pprof/", withPprof.url + "/debug/pprof/profile?seconds=1", withPprof.url + "/debug/pprof/heap",
		without.url + "/debug/pprof/"} {
		if code, _ := get(t, url); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", url, code)
		}
	}
}

// REGISTRY_PPROF needs a metrics listener on loopback: anything else
// stops the start, naming the setting; the address actually bound is
// checked again.
func TestPprofConfig(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"REGISTRY_PPROF": "true"},
		{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": "0.0.0.0:6060"},
		{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": ":6060"},
		{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": "[::]:6060"},
		{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": "10.1.2.3:6060"},
		{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": "registry.example.com:6060"},
		{"REGISTRY_PPROF": "maybe", "REGISTRY_METRICS_LISTEN": "127.0.0.1:6060"},
	} {
		env["REGISTRY_DATABASE_URL"] = "postgres://registry@127.0.0.1:1/registry?connect_timeout=2"
		env["REGISTRY_LISTEN"] = "127.0.0.1:0"
		_, _, err := runCmd(t, env, "serve")
		if err == nil || !strings.Contains(err.Error(), "REGISTRY_PPROF") {
			t.Errorf("%v: error %v does not name REGISTRY_PPROF", env, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:6060", "127.0.0.2:6060", "[::1]:6060", "localhost:6060"} {
		cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_PPROF": "true", "REGISTRY_METRICS_LISTEN": addr}))
		if err != nil || !cfg.Metrics.Pprof {
			t.Errorf("%s: %+v, %v", addr, cfg.Metrics, err)
		}
	}
	if cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_METRICS_LISTEN": "0.0.0.0:9090"})); err != nil || cfg.Metrics.Pprof {
		t.Errorf("off by default: %+v, %v", cfg.Metrics, err)
	}
	// Past the configuration: the bound address decides.
	if ln, err := metricsListener(metricsConfig{Listen: "0.0.0.0:0", Pprof: true}); err == nil {
		ln.Close()
		t.Error("profiles on a listener bound to every interface")
	}
	ln, err := metricsListener(metricsConfig{Listen: "127.0.0.1:0", Pprof: true})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

func TestTokenCacheConfig(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int{"": auth.DefaultCacheSize, "0": 0, "1": 1, "250000": 250000} {
		cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_TOKEN_CACHE": v}))
		if err != nil || cfg.TokenCache != want {
			t.Errorf("REGISTRY_TOKEN_CACHE=%q: %d, %v; want %d", v, cfg.TokenCache, err, want)
		}
	}
	for _, v := range []string{"-1", "many", "1e4", fmt.Sprint(maxTokenCache + 1)} {
		if _, err := loadConfig(envFunc(map[string]string{"REGISTRY_TOKEN_CACHE": v})); err == nil || !strings.Contains(err.Error(), "REGISTRY_TOKEN_CACHE") {
			t.Errorf("REGISTRY_TOKEN_CACHE=%q: %v", v, err)
		}
	}
}
