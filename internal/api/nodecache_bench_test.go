package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// cachedBenchServer is benchServer's fleet of n nodes served with the node
// cache wired as serve wires it (following the feed), every node read
// once first so the cache is warm, as on a replica that has run a while.
// Run with a fixed -benchtime (e.g. 200000x) so that the warm-up happens
// once.
func cachedBenchServer(b *testing.B, n int, withBeats bool) string {
	b.Helper()
	ctx := context.Background()
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	_, err := st.Pool().Exec(ctx, `
		INSERT INTO hardware_generations (name) VALUES ('H100');
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem)
		SELECT ('10.0.0.0'::inet + (g / 8)), g % 8, 2199023255552, '550.54.15', 1, 85899345920
		FROM generate_series(0, `+fmt.Sprint(n-1)+`) g;
		ANALYZE nodes;`)
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	c := nodecache.New(st, nodecache.Options{Size: n, LivenessChannel: store.LivenessChannel})
	hub := watch.New(st, watch.Options{
		Channels: watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:   api.EncodeEvent, Follower: c, FollowChannels: []string{store.LivenessChannel},
	})
	b.Cleanup(lifecycle.Go(ctx, hub.Run))
	cfg := api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier, Nodes: c}
	if withBeats {
		beats := heartbeat.New(st, heartbeat.Options{})
		cfg.Heartbeats = beats
		b.Cleanup(lifecycle.Go(ctx, beats.Run))
	}
	ts := httptest.NewServer(api.New(cfg))
	b.Cleanup(ts.Close)
	deadline := time.Now().Add(10 * time.Second)
	for !c.Stats().Serving {
		if time.Now().After(deadline) {
			b.Fatal("the node cache does not serve")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for pk := int64(1 + w); pk <= int64(n); pk += 8 {
				if _, err := c.GetNode(ctx, pk); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if s := c.Stats(); s.Size != n {
		b.Fatalf("warm-up left %+v", s)
	}
	return ts.URL
}

// BenchmarkGetNodeCached is BenchmarkGetNode with a warm node cache.
func BenchmarkGetNodeCached(b *testing.B) {
	const n = 100_000
	url := cachedBenchServer(b, n, false)
	client := benchClient(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			call(b, client, "GET", fmt.Sprintf("%s/v1/nodes/%d", url, 1+rand.IntN(n)), "", http.StatusOK)
		}
	})
}

// BenchmarkHeartbeatCached is BenchmarkHeartbeat's plain case with the
// node cache answering the Node-Id check.
func BenchmarkHeartbeatCached(b *testing.B) {
	const n = 1000
	url := cachedBenchServer(b, n, true)
	client := &http.Client{Transport: bearer{token: tokenFor(b, "bench", registry.RoleAdmin),
		next: &http.Transport{MaxIdleConnsPerHost: 64}}}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest("GET", url+"/v1/nodes/ping", nil)
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
