package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// countList takes exactly the whole fleet as one closed JSON array of
// nodes in pk order, and nothing else.
func TestCountList(t *testing.T) {
	t.Parallel()
	if n, err := countList(strings.NewReader(`[{"pk":1,"ip":"10.0.0.1"},{"pk":2},{"pk":7}]`+"\n"), 3); n != 3 || err != nil {
		t.Fatalf("countList = %d, %v; want 3 nodes", n, err)
	}
	for name, tc := range map[string]struct{ body, want string }{
		"short":         {`[{"pk":1},{"pk":2}]`, "2 nodes, want 3"},
		"long":          {`[{"pk":1},{"pk":2},{"pk":3},{"pk":4}]`, "4 nodes, want 3"},
		"empty":         {`[]`, "0 nodes, want 3"},
		"cut in a node": {`[{"pk":1},{"pk":2},{"pk"`, "node 3"},
		"not closed":    {`[{"pk":1},{"pk":2},{"pk":3}`, "node 4: jsontext: unexpected EOF"},
		"repeated pk":   {`[{"pk":1},{"pk":1},{"pk":3}]`, "pk 1, want one above 1"},
		"pk a string":   {`[{"pk":"1"}]`, "want a number"},
		"no pk":         {`[{"pk":1},{"ip":"10.0.0.1"},{"pk":3}]`, "pk missing"},
		"not an array":  {`{"pk":1}`, "not a JSON array"},
		"not objects":   {`[1,2,3]`, "node 1"},
		"more after":    {`[{"pk":1},{"pk":2},{"pk":3}] []`, "more after the array"},
		"nothing":       {``, "not a JSON array"},
	} {
		_, err := countList(strings.NewReader(tc.body), 3)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: countList = %v, want an error with %q", name, err, tc.want)
		}
	}
	if _, err := countList(strings.NewReader(`[{"pk":1}]`), 3); !errors.Is(err, errShortList) {
		t.Errorf("short list: %v, want errShortList", err)
	}
}

// The listall workload against a fake server: a whole list counts with
// its size, while a short list, one cut mid-stream by an aborted handler
// and an error status are each an error of the workload, never a list.
func TestListAllWorkloadReportsBrokenLists(t *testing.T) {
	t.Parallel()
	const whole = `[{"pk":1},{"pk":2},{"pk":3}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The first segment says what to answer: target URLs SRV/whole, SRV/short…
		fake, path, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if r.Method != "POST" || path != "v1/nodes/list" || r.Header.Get("Authorization") != "Bearer sched" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		switch fake {
		case "short":
			w.Write([]byte(`[{"pk":1},{"pk":2}]`))
		case "abort": // as registryd ends a list whose database read failed
			w.Write([]byte(`[{"pk":1},{"pk":2},`))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "500":
			http.Error(w, `{"title":"internal error"}`, http.StatusInternalServerError)
		default:
			w.Write([]byte(whole))
		}
	}))
	t.Cleanup(srv.Close) // after the parallel subtests
	for fake, wantKind := range map[string]string{
		"whole": "",
		"short": "wrong number of nodes: 2 nodes, want 3",
		"abort": "unexpected EOF",
		"500":   "/v1/nodes/list: HTTP 500",
	} {
		t.Run("fake="+fake, func(t *testing.T) {
			t.Parallel()
			tg := &target{url: srv.URL + "/" + fake, fleet: &fleet{nodes: 3, scheduler: "sched"}}
			w, err := tg.workload(ListAll, 8)
			if err != nil {
				t.Fatal(err)
			}
			if w.clients != 1 {
				t.Errorf("listall runs %d clients, want 1", w.clients)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			l := generate(ctx, w.clients, 10*time.Millisecond, 100*time.Millisecond, w.op)
			if wantKind == "" {
				if l.Ops == 0 || l.Errors != 0 || tg.listBytes.Load() != int64(len(whole)) {
					t.Fatalf("whole list: %d ops, errors %v, %d bytes", l.Ops, l.ErrorSamples, tg.listBytes.Load())
				}
				return
			}
			if l.Ops != 0 || l.Errors == 0 || tg.listBytes.Load() != 0 {
				t.Fatalf("%s: %d ops, %d errors, %d bytes: want only errors", fake, l.Ops, l.Errors, tg.listBytes.Load())
			}
			var found bool
			for k, sample := range l.ErrorSamples {
				found = found || strings.Contains(k+" "+sample, wantKind)
			}
			if !found {
				t.Errorf("%s: errors %v, want one with %q", fake, l.ErrorSamples, wantKind)
			}
		})
	}
}

// Against a server the harness did not start, the default workloads leave
// startup out (it could not restart that server), and replica unless a
// second replica is named; asking for startup is an error.
func TestStartupNeedsAServerOfItsOwn(t *testing.T) {
	t.Parallel()
	cfg := Config{URL: "http://127.0.0.1:1", DatabaseURL: "postgres:///x", Token: "t"}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Workloads) != len(AllWorkloads)-2 || slices.Contains(cfg.Workloads, Startup) || slices.Contains(cfg.Workloads, Replica) {
		t.Errorf("default workloads with a URL: %v", cfg.Workloads)
	}
	cfg = Config{URL: "http://127.0.0.1:1", ReplicaURL: "http://127.0.0.1:2", DatabaseURL: "postgres:///x", Token: "t"}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Workloads) != len(AllWorkloads)-1 || slices.Contains(cfg.Workloads, Startup) || !slices.Contains(cfg.Workloads, Replica) {
		t.Errorf("default workloads with a URL and a replica URL: %v", cfg.Workloads)
	}
	cfg = Config{URL: "http://127.0.0.1:1", DatabaseURL: "postgres:///x", Token: "t", Workloads: []string{Startup}}
	if err := cfg.defaults(); err == nil || !strings.Contains(err.Error(), "restarts the server") {
		t.Errorf("startup with a URL: %v", err)
	}
	cfg = Config{Registryd: "registryd"}
	if err := cfg.defaults(); err != nil || !slices.Equal(cfg.Workloads, AllWorkloads) {
		t.Errorf("default workloads of a server it starts: %v, %v", cfg.Workloads, err)
	}
}

// How fast the harness's client counts a list, alone: listall's MB/s
// cannot exceed it, and on a small machine the client's decoding competes
// with the server for the same cores.
func BenchmarkCountList(b *testing.B) {
	const nodes = 10_000
	var body bytes.Buffer
	body.WriteByte('[')
	for i := range nodes {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"pk":%d,"ip":"10.0.%d.%d","index":%d,"cpu_mem":2199023255552,"driver_version":"550.54.15","hardware_generation":2,"gpu_mem":85899345920,"last_seen":"2026-12-02T01:14:09.559826Z","current_job":null,"lease_expires_at":null,"owner":"bench-agent-%d","source":"api","schedulable":true,"lost":false,"cordon_reason":null,"external_id":null,"provider_state":null,"state":"free","created_at":"2026-12-02T01:14:09.559826Z","updated_at":"2026-12-02T01:14:09.559826Z","version":1}`,
			i+1, i/2000, i%250, i%8, i/8)
	}
	body.WriteString("]\n")
	b.SetBytes(int64(body.Len()))
	for b.Loop() {
		if _, err := countList(bytes.NewReader(body.Bytes()), nodes); err != nil {
			b.Fatal(err)
		}
	}
}

// A restart whose exec fails is an error, and the server it leaves behind
// is stopped without a wait or a panic.
func TestRestartThatCannotExec(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	srv, err := startServer(ctx, bin, workDir(t), []byte("bench-test-secret-0123456789abcdef"), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.bin = filepath.Join(t.TempDir(), "gone")
	st, _, err := restarts(ctx, srv, startupRuns)
	if err == nil || !strings.Contains(err.Error(), "start server") || len(st.ReadyMS) != 0 {
		t.Fatalf("restarts = %+v, %v; want a start error", st, err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.stop() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop waited on a server that never ran")
	}
}
