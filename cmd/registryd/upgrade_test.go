package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// balancer is what a Kubernetes Service does for the test: it spreads
// requests over the backends in rotation whose readiness probe (/readyz,
// every 100ms) passes, and a backend is taken out of rotation before its
// replica stops (the endpoint removed, then the pod sent SIGTERM).
type balancer struct {
	mu       sync.Mutex
	backends []*backend
	next     int
}

type backend struct {
	name     string
	url      string
	ready    atomic.Bool
	proxy    *httputil.ReverseProxy
	inFlight atomic.Int64
	served   atomic.Int64
}

func (b *balancer) add(name, rawURL string) *backend {
	u, _ := url.Parse(rawURL)
	be := &backend{name: name, url: rawURL, proxy: httputil.NewSingleHostReverseProxy(u)}
	be.ready.Store(probeReady(rawURL))
	b.mu.Lock()
	b.backends = append(b.backends, be)
	b.mu.Unlock()
	return be
}

// remove takes be out of rotation and waits, at most 10s, for the
// requests it is serving.
func (b *balancer) remove(t *testing.T, be *backend) {
	t.Helper()
	b.mu.Lock()
	for i, x := range b.backends {
		if x == be {
			b.backends = append(b.backends[:i], b.backends[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
	apitest.Eventually(t, 10*time.Second, be.name+" drained", func() bool { return be.inFlight.Load() == 0 })
}

func probeReady(rawURL string) bool {
	resp, err := http.Get(rawURL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// probe runs the backends' readiness probes until ctx ends.
func (b *balancer) probe(ctx context.Context) {
	for ctx.Err() == nil {
		b.mu.Lock()
		bs := append([]*backend(nil), b.backends...)
		b.mu.Unlock()
		for _, be := range bs {
			be.ready.Store(probeReady(be.url))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	var ready []*backend
	for _, be := range b.backends {
		if be.ready.Load() {
			ready = append(ready, be)
		}
	}
	if len(ready) == 0 {
		b.mu.Unlock()
		http.Error(w, "no ready backend", http.StatusServiceUnavailable)
		return
	}
	be := ready[b.next%len(ready)]
	b.next++
	be.inFlight.Add(1) // under the lock: remove sees it
	b.mu.Unlock()
	defer be.inFlight.Add(-1)
	be.served.Add(1)
	be.proxy.ServeHTTP(w, r)
}

// A running two-replica deployment of one release is upgraded to the next
// under load: the next release's migration (an expand step that lets the
// older release serve) is applied while both old replicas serve, both stay
// ready and keep serving, then each is replaced in turn by a replica of the
// next release. Not one request fails.
func TestRollingUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	latest, err := pgtest.Open(t, db, store.Options{}).LatestVersion()
	if err != nil {
		t.Fatal(err)
	}
	next := pgtest.MigrationsWith(t, map[string]string{fmt.Sprintf("%05d_upgrade_probe.sql", latest+1): fmt.Sprintf(`-- +goose Up
-- registryd:compatible-from %d
SET LOCAL lock_timeout = '2s';
ALTER TABLE nodes ADD COLUMN upgrade_probe text;
CREATE TABLE upgrade_probe (id bigint PRIMARY KEY);
-- +goose Down
DROP TABLE upgrade_probe;
ALTER TABLE nodes DROP COLUMN upgrade_probe;
`, latest)})
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_LISTEN": "127.0.0.1:0",
		"REGISTRY_LEADER_TTL": "1s"}
	start := func(migrations fs.FS) *server {
		cfg, err := loadConfig(envFunc(env))
		if err != nil {
			t.Fatal(err)
		}
		cfg.migrations = migrations
		return startServing(t, func(ctx context.Context, stdout, stderr io.Writer) error {
			return serve(ctx, cfg, nil, stdout, stderr)
		})
	}
	oldA, oldB := start(nil), start(nil)
	lb := &balancer{}
	beA, beB := lb.add("old A", oldA.url), lb.add("old B", oldB.url)
	front := httptest.NewServer(lb)
	t.Cleanup(front.Close)
	probeCtx, stopProbes := context.WithCancel(context.Background())
	probing := make(chan struct{})
	go func() { lb.probe(probeCtx); close(probing) }()
	t.Cleanup(func() { stopProbes(); <-probing })

	admin := adminToken(t, env)
	mint := func(args ...string) string {
		out, stderr, err := runCmd(t, env, append([]string{"token"}, args...)...)
		if err != nil {
			t.Fatalf("token: %v\n%s", err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[len(lines)-1]
	}
	agentTok := mint("--sub", "upgrade-agent", "--role", "agent", "--ip", "10.9.0.0/24")
	schedTok := mint("--sub", "upgrade-scheduler", "--role", "scheduler")
	var pks []int64
	for i := range 16 {
		code, body := call(t, "POST", front.URL+"/v1/nodes/create", fmt.Sprintf(
			`{"ip":"10.9.0.%d","index":0,"cpu_mem":1073741824,"driver_version":"550.54.15","hardware_generation":null,"gpu_mem":null}`, i+1), agentTok)
		if code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
		var n struct{ PK int64 }
		json.Unmarshal([]byte(body), &n)
		pks = append(pks, n.PK)
	}

	// The load: heartbeats, lists, claims and releases, agent writes.
	var total, failed atomic.Int64
	var failures sync.Map
	client := &http.Client{Timeout: 20 * time.Second}
	send := func(method, path, body, token string, header ...string) {
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		total.Add(1)
		resp, err := client.Do(req)
		if err != nil {
			failed.Add(1)
			failures.Store(method+" "+path+": "+err.Error(), true)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// A claim may find every node taken (409): that is an answer.
		if resp.StatusCode >= 500 || resp.StatusCode >= 400 && !(resp.StatusCode == 409 && strings.HasSuffix(path, "/claim")) {
			failed.Add(1)
			failures.Store(fmt.Sprintf("%s %s: %d %s", method, path, resp.StatusCode, b), true)
		}
	}
	ctx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	for w := range 4 {
		load.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				pk := pks[(w*4+i)%len(pks)]
				switch i % 4 {
				case 0:
					send("GET", "/v1/nodes/ping", "", agentTok, "Node-Id", fmt.Sprint(pk))
				case 1:
					send("POST", "/v1/nodes/list", `{"limit":50}`, admin)
				case 2:
					job := w*1000000 + i
					send("POST", "/v1/nodes/claim", fmt.Sprintf(`{"job":%d,"count":1}`, job), schedTok)
					send("POST", "/v1/nodes/release", fmt.Sprintf(`{"job":%d}`, job), schedTok)
				case 3:
					send("PATCH", fmt.Sprintf("/v1/nodes/%d", pk), fmt.Sprintf(`{"driver_version":"550.%d"}`, i), agentTok, "Node-Id", fmt.Sprint(pk))
				}
			}
		})
	}
	defer func() { stopLoad(); load.Wait() }()
	time.Sleep(time.Second)

	// The next release's migration, while both old replicas serve.
	cfg, err := loadConfig(envFunc(env))
	if err != nil {
		t.Fatal(err)
	}
	cfg.migrations = next
	// Both old replicas are asked for readiness all through the
	// migration: not one answer may be 503.
	probeDone, stopProbing := make(chan int), make(chan struct{})
	go func() {
		unready := 0
		for {
			select {
			case <-stopProbing:
				probeDone <- unready
				return
			default:
			}
			for _, s := range []*server{oldA, oldB} {
				if !probeReady(s.url) {
					unready++
				}
			}
		}
	}()
	var out strings.Builder
	err = migrate(context.Background(), cfg, []string{"up"}, &out, io.Discard)
	close(stopProbing)
	if unready := <-probeDone; unready > 0 {
		t.Errorf("the old replicas were unready %d times during the migration", unready)
	}
	if err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	if !strings.Contains(out.String(), "upgrade_probe") {
		t.Fatalf("migrate up ran: %s", out.String())
	}
	servedBefore := beA.served.Load() + beB.served.Load()
	time.Sleep(time.Second)
	for _, s := range []*server{oldA, oldB} {
		if code, body := call(t, "GET", s.url+"/readyz", ""); code != 200 {
			t.Fatalf("an old replica on the expanded schema is not ready: %d %s", code, body)
		}
	}
	if beA.served.Load()+beB.served.Load() <= servedBefore {
		t.Fatal("the old replicas served nothing after the migration")
	}

	// Roll: each old replica out of rotation, stopped, replaced.
	for _, old := range []struct {
		srv *server
		be  *backend
	}{{oldA, beA}, {oldB, beB}} {
		lb.remove(t, old.be)
		if err := old.srv.stop(); err != nil {
			t.Fatalf("%s stopped with %v", old.be.name, err)
		}
		if !strings.Contains(old.srv.stderr.String(), "newer than this registryd; serving it") {
			t.Errorf("%s did not log that it serves a newer schema:\n%s", old.be.name, old.srv.stderr.String())
		}
		fresh := start(next)
		apitest.Eventually(t, 30*time.Second, "the new replica ready", func() bool {
			code, _ := call(t, "GET", fresh.url+"/readyz", "")
			return code == 200
		})
		be := lb.add("new "+old.be.name, fresh.url)
		apitest.Eventually(t, 10*time.Second, "the new replica serving", func() bool { return be.served.Load() > 20 })
	}
	time.Sleep(time.Second)
	stopLoad()
	load.Wait()
	t.Logf("%d requests through the upgrade", total.Load())
	failures.Range(func(k, _ any) bool { t.Errorf("failed: %s", k); return true })
	if failed.Load() > 0 || total.Load() < 200 {
		t.Fatalf("%d of %d requests failed (want none of at least 200)", failed.Load(), total.Load())
	}
}
