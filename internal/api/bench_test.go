package api_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// benchFleet is a fresh database holding n nodes (over n/8 hosts), made
// in SQL, and a verifier of the test tokens.
func benchFleet(b *testing.B, n int) (*store.Store, *auth.Verifier) {
	b.Helper()
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	_, err := st.Pool().Exec(context.Background(), `
		SET statement_timeout = 0; -- a million rows on a busy machine
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
	return st, verifier
}

// benchServer serves a fresh database holding n nodes (over n/8 hosts) and
// returns its URL. Rows are made in SQL: the benchmark measures reads, not
// seeding.
func benchServer(b *testing.B, n int) string {
	st, verifier := benchFleet(b, n)
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	b.Cleanup(ts.Close)
	return ts.URL
}

// call sends one request, drains the answer, fails on a status other than
// want and returns the body's size. body "" sends none.
func call(b *testing.B, client *http.Client, method, url, body string, want int) int64 {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		b.Fatalf("%s %s: status %d, want %d", method, url, resp.StatusCode, want)
	}
	return n
}

// benchClient sends an admin token with every request.
func benchClient(b *testing.B) *http.Client {
	return &http.Client{Transport: bearer{token: tokenFor(b, "bench", registry.RoleAdmin),
		next: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (t bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(r)
}

// BenchmarkGetNode retrieves random nodes by pk out of 100,000, in parallel.
func BenchmarkGetNode(b *testing.B) {
	const n = 100_000
	url := benchServer(b, n)
	client := benchClient(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			call(b, client, "GET", fmt.Sprintf("%s/v1/nodes/%d", url, 1+rand.IntN(n)), "", http.StatusOK)
		}
	})
}

// BenchmarkCreateNode registers new nodes, in parallel.
func BenchmarkCreateNode(b *testing.B) {
	url := benchServer(b, 1)
	client := benchClient(b)
	var seq atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			body := fmt.Sprintf(`{"ip":"10.%d.%d.%d","index":%d,"cpu_mem":1,"driver_version":"d","hardware_generation":1,"gpu_mem":1}`,
				(i>>16)&255, (i>>8)&255, i&255, i>>24)
			call(b, client, "POST", url+"/v1/nodes/create", body, http.StatusCreated)
		}
	})
}

// BenchmarkListFreePage reads one page of 100 free nodes out of 100,000.
func BenchmarkListFreePage(b *testing.B) {
	url := benchServer(b, 100_000)
	client := benchClient(b)
	b.ResetTimer()
	for b.Loop() {
		call(b, client, "POST", url+"/v1/nodes/list",
			`{"free":true,"hardware_generation":1,"min_gpu_mem":85899345920,"after":50000,"limit":100}`, http.StatusOK)
	}
}

// BenchmarkListAll streams all 100,000 nodes in one response.
func BenchmarkListAll(b *testing.B) {
	url := benchServer(b, 100_000)
	client := benchClient(b)
	b.ResetTimer()
	for b.Loop() {
		b.SetBytes(call(b, client, "POST", url+"/v1/nodes/list", "", http.StatusOK))
	}
}

// BenchmarkClaimRelease claims one free node for a job and releases it,
// from parallel schedulers over 100,000 nodes (one op = claim + release).
func BenchmarkClaimRelease(b *testing.B) {
	url := benchServer(b, 100_000)
	client := benchClient(b)
	var job atomic.Int64
	b.SetParallelism(8) // 16 schedulers on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			j := job.Add(1)
			for _, path := range []string{"/v1/nodes/claim", "/v1/nodes/release"} {
				call(b, client, "POST", url+path, fmt.Sprintf(`{"job":%d}`, j), http.StatusOK)
			}
		}
	})
}
