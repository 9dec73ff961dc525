package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// cachedBenchServer is benchServer's fleet of n nodes served with the node
// cache wired as serve wires it (following the feed), every node read
// once first so the cache is warm, as on a replica that has run a while.
// Run with a fixed -benchtime (e.g. 200000x) so that the warm-up happens
// once.
func cachedBenchServer(b *testing.B, n, size int, withBeats bool) string {
	b.Helper()
	ctx := context.Background()
	st, verifier := benchFleet(b, n)
	c := nodecache.New(st, nodecache.Options{Size: size, LivenessChannel: store.LivenessChannel})
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
	// A pass may read through without filling while the loaded machine
	// delays the feed's proof; read again until every node is in.
	for pass := 0; pass < 5 && c.Stats().Size < min(n, size); pass++ {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for pk := int64(1 + w); pk <= int64(min(n, size)); pk += 8 {
					if _, err := c.GetNode(ctx, pk); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	warm := c.Stats()
	if warm.Size != min(n, size) {
		b.Fatalf("warm-up left %+v", warm)
	}
	b.Cleanup(func() {
		s := c.Stats()
		reads := (s.Hits + s.Misses + s.Bypassed) - (warm.Hits + warm.Misses + warm.Bypassed)
		b.ReportMetric(float64(s.Hits-warm.Hits)/float64(max(1, reads)), "hit-ratio")
		b.ReportMetric(peakRSS(b), "peak-RSS-MB")
	})
	return ts.URL
}

// peakRSS is the process's peak resident set (VmHWM) in MB: the server,
// its cache and the benchmark's clients together.
func peakRSS(b *testing.B) float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuTime is the process's user and system CPU so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timed runs fn as the timed part of b and reports the CPU this process
// (server and clients; PostgreSQL not included) spent per operation: on a
// shared machine wall-clock time per operation mostly measures the others.
func timed(b *testing.B, fn func()) {
	b.Helper()
	start := cpuTime()
	b.ResetTimer()
	fn()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// getRandom is the read of BenchmarkGetNode: random pks out of n, from
// parallel clients.
func getRandom(b *testing.B, url string, n int) {
	client := benchClient(b)
	timed(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				call(b, client, "GET", fmt.Sprintf("%s/v1/nodes/%d", url, 1+rand.IntN(n)), "", http.StatusOK)
			}
		})
	})
}

// BenchmarkReadByPK is BenchmarkGetNode (100,000 nodes) before and after
// the node cache: postgres reads every node from PostgreSQL, cache from a
// warm node cache. Run with a fixed -benchtime (e.g. 20000x).
func BenchmarkReadByPK(b *testing.B) {
	const n = 100_000
	b.Run("postgres", func(b *testing.B) { getRandom(b, benchServer(b, n), n) })
	b.Run("cache", func(b *testing.B) { getRandom(b, cachedBenchServer(b, n, n, false), n) })
}

// BenchmarkGetNodeCached1M reads random nodes out of 1,000,000 through a
// cache of the default size (200,000): most reads miss, read through and
// evict; every one must still answer.
func BenchmarkGetNodeCached1M(b *testing.B) {
	const n = 1_000_000
	getRandom(b, cachedBenchServer(b, n, nodecache.DefaultSize, false), n)
}

// BenchmarkNodeIDCheck is BenchmarkHeartbeat's plain case (ping with a
// Node-Id over 1,000 nodes) before and after the node cache.
func BenchmarkNodeIDCheck(b *testing.B) {
	b.Run("postgres", func(b *testing.B) { benchNodeID(b, false) })
	b.Run("cache", func(b *testing.B) { benchNodeID(b, true) })
}

func benchNodeID(b *testing.B, cached bool) {
	const n = 1000
	ctx := context.Background()
	var url string
	if cached {
		url = cachedBenchServer(b, n, n, true)
	} else {
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
		url = ts.URL
	}
	client := benchClient(b)
	timed(b, func() {
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
	})
}
