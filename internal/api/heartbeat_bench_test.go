package api_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/metrics"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkHeartbeat is the agents' hot path: GET /v1/nodes/ping with a
// Node-Id, which records a heartbeat (flushed in batches in the
// background), from parallel clients over 1,000 nodes; without metrics
// and with every metric wired as serve wires them; with the verified-token
// cache serve uses (REGISTRY_TOKEN_CACHE) and without it. Clients keep
// their connections, as agents do. Client and server share the process:
// allocs/op counts both.
func BenchmarkHeartbeat(b *testing.B) {
	for _, metrics := range []bool{false, true} {
		for _, cache := range []int{0, auth.DefaultCacheSize} {
			name := fmt.Sprintf("%s/cache=%d", map[bool]string{false: "plain", true: "metrics"}[metrics], cache)
			b.Run(name, func(b *testing.B) { benchHeartbeat(b, metrics, cache, true) })
		}
	}
}

// BenchmarkPing is the same request without Node-Id: token verification
// and HTTP only, no query.
func BenchmarkPing(b *testing.B) {
	for _, cache := range []int{0, auth.DefaultCacheSize} {
		b.Run(fmt.Sprintf("cache=%d", cache), func(b *testing.B) { benchHeartbeat(b, false, cache, false) })
	}
}

func benchHeartbeat(b *testing.B, withMetrics bool, cacheSize int, nodeID bool) {
	const n = 1000
	ctx := context.Background()
	m := metrics.New()
	opts := store.Options{}
	if withMetrics {
		opts.ObserveQuery = m.ObserveQuery
	}
	st := pgtest.Open(b, pgtest.New(b), opts)
	_, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT ('10.0.0.0'::inet + (g / 8)), g % 8, 1, 'd' FROM generate_series(0, `+fmt.Sprint(n-1)+`) g`)
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, CacheSize: cacheSize})
	if err != nil {
		b.Fatal(err)
	}
	cfg := api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier}
	hopts := heartbeat.Options{}
	if withMetrics {
		hopts.Observer = m
		cfg.Observer, cfg.Metrics = m, m.Handler()
	}
	beats := heartbeat.New(st, hopts)
	cfg.Heartbeats = beats
	b.Cleanup(lifecycle.Go(ctx, beats.Run))
	ts := httptest.NewServer(api.New(cfg))
	b.Cleanup(ts.Close)
	client := &http.Client{Transport: bearer{token: tokenFor(b, "bench", registry.RoleAdmin),
		next: &http.Transport{MaxIdleConnsPerHost: 64}}}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest("GET", ts.URL+"/v1/nodes/ping", nil)
			if err != nil {
				b.Fatal(err)
			}
			if nodeID {
				req.Header.Set("Node-Id", fmt.Sprint(1+rand.IntN(n)))
			}
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			// Read to the end, or the client drops the connection and
			// every request pays a dial.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
