package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkHeartbeat is the agents' hot path: GET /v1/nodes/ping with a
// Node-Id, which records a heartbeat (flushed in batches in the
// background), from parallel clients over 1,000 nodes.
func BenchmarkHeartbeat(b *testing.B) {
	const n = 1000
	ctx := context.Background()
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	_, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT ('10.0.0.0'::inet + (g / 8)), g % 8, 1, 'd' FROM generate_series(0, `+fmt.Sprint(n-1)+`) g`)
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	beats := heartbeat.New(st, heartbeat.Options{})
	b.Cleanup(lifecycle.Go(ctx, beats.Run))
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier, Heartbeats: beats}))
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
			req.Header.Set("Node-Id", fmt.Sprint(1+rand.IntN(n)))
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
