package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
)

// sse is a fake watch endpoint: each connection gets the next of its
// streams (a function writing to the open stream, or an error answer);
// it records the Last-Event-Id of every request.
type sse struct {
	mu      sync.Mutex
	conns   []func(w http.ResponseWriter, r *http.Request)
	resumes []string
	tokens  []string
}

func (s *sse) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.resumes)
	s.resumes = append(s.resumes, r.Header.Get("Last-Event-Id"))
	s.tokens = append(s.tokens, r.Header.Get("Authorization"))
	conn := s.conns[min(n, len(s.conns)-1)]
	s.mu.Unlock()
	conn(w, r)
}

func (s *sse) seen() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resumes), slices.Clone(s.tokens)
}

// stream opens an event stream, writes frames and ends it (or, with hold,
// keeps it open until the client goes).
func stream(hold bool, frames ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, f := range frames {
			io.WriteString(w, f)
			http.NewResponseController(w).Flush()
		}
		if hold {
			<-r.Context().Done()
		}
	}
}

func event(id int64, kind string, pk int64) string {
	node := fmt.Sprintf(`{"pk":%d,"ip":"10.0.0.7","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":1,"gpu_mem":null,`+
		`"last_seen":null,"current_job":7001,"owner":null,"source":"api","schedulable":true,"external_id":null,"provider_state":null,`+
		`"created_at":"2026-01-02T03:04:05Z","updated_at":"2026-01-02T03:04:05Z"}`, pk)
	return fmt.Sprintf("id: %d\nevent: %s\ndata: {\"kind\":%q,\"at\":\"2026-01-02T03:04:05Z\",\"node\":%s}\n\n", id, kind, kind, node)
}

// collect watches until it has n events (or the watch ends), then stops it.
func collect(t *testing.T, c *client.Client, w client.WatchOptions, n int) ([]client.Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []client.Event
	err := c.Watch(ctx, w, func(ev client.Event) error {
		got = append(got, ev)
		if len(got) == n {
			cancel()
		}
		return nil
	})
	if len(got) < n && errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%d of %d events within 10s", len(got), n)
	}
	return got, err
}

func ids(evs []client.Event) []int64 {
	var out []int64
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

// The stream is parsed as Server-Sent Events: comments and retry ignored,
// typed node and reset events, data of an unknown type kept raw; when it
// ends the watch reconnects with Last-Event-ID and the token source is
// asked again.
func TestWatchParsesAndResumes(t *testing.T) {
	t.Parallel()
	f := &sse{conns: []func(http.ResponseWriter, *http.Request){
		stream(false, "retry: 2000\n: watching\n\n", event(41, "claimed", 7), ": keep-alive\r\n\r\n", event(42, "released", 7)),
		// The second connection breaks off mid-event: that event is not delivered.
		stream(false, "id: 43\nevent: reset\ndata: {\"reason\":\"gone\",\n", "data: \"last_event_id\":43}\n\n", "id: 44\nevent: upd"),
		stream(true, "id: 45\nevent: future\ndata: {\"new\":true}\n\n", event(46, "deleted", 7)),
	}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	var n int
	c, err := client.New(ts.URL, client.WithTokenSource(func(context.Context) (string, error) {
		n++
		return fmt.Sprint("t", n), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(t, c, client.WatchOptions{After: client.Ptr(int64(40)), Reconnect: time.Millisecond}, 5)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("watch ended with %v", err)
	}
	if !slices.Equal(ids(got), []int64{41, 42, 43, 45, 46}) {
		t.Fatalf("event ids %v", ids(got))
	}
	if got[0].Type != "claimed" || got[0].Node.Kind != client.EventClaimed || got[0].Node.Node.PK != 7 || *got[0].Node.Node.CurrentJob != 7001 {
		t.Errorf("claimed event %+v", got[0])
	}
	if got[2].Type != client.EventReset || got[2].Reset == nil || got[2].Reset.LastEventID != 43 || got[2].Reset.Reason != "gone" {
		t.Errorf("reset event %+v", got[2])
	}
	if got[3].Type != "future" || got[3].Node != nil || string(got[3].Data) != `{"new":true}` {
		t.Errorf("unknown event %+v", got[3])
	}
	resumes, tokens := f.seen()
	if !slices.Equal(resumes, []string{"40", "42", "43"}) {
		t.Errorf("Last-Event-Id sent: %q", resumes)
	}
	if !slices.Equal(tokens, []string{"Bearer t1", "Bearer t2", "Bearer t3"}) {
		t.Errorf("tokens sent: %q", tokens)
	}
}

// Refusals that retrying cannot cure end the watch with the *Error;
// 429 and 503 with Retry-After are waited out and retried.
func TestWatchErrors(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404} {
		f := &sse{conns: []func(http.ResponseWriter, *http.Request){problem(status, "")}}
		ts := httptest.NewServer(f)
		c := newClient(t, ts.URL)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := c.Watch(ctx, client.WatchOptions{}, func(client.Event) error { return nil })
		cancel()
		var e *client.Error
		if !errors.As(err, &e) || e.Status != status {
			t.Errorf("%d: watch ended with %v", status, err)
		}
		ts.Close()
	}
	// Watching disabled: 503 without Retry-After is no reason to wait.
	f := &sse{conns: []func(http.ResponseWriter, *http.Request){problem(503, "")}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := newClient(t, ts.URL).Watch(ctx, client.WatchOptions{}, func(client.Event) error { return nil }); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("503 without Retry-After: %v", err)
	}

	f = &sse{conns: []func(http.ResponseWriter, *http.Request){problem(429, "1"), problem(503, "0"), problem(502, ""), hangUp,
		stream(true, event(9, "created", 1))}}
	ts = httptest.NewServer(f)
	t.Cleanup(ts.Close)
	start := time.Now()
	got, err := collect(t, newClient(t, ts.URL), client.WatchOptions{Reconnect: time.Millisecond}, 1)
	if !errors.Is(err, context.Canceled) || len(got) != 1 || got[0].ID != 9 {
		t.Errorf("after 429, 503, 502 and a hang-up: %v, %+v", err, got)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("reconnected %v after a 429 with Retry-After: 1", d)
	}

	// The caller's error ends the watch, and is returned as it is.
	f = &sse{conns: []func(http.ResponseWriter, *http.Request){stream(true, event(1, "created", 1), event(2, "created", 1))}}
	ts = httptest.NewServer(f)
	t.Cleanup(ts.Close)
	stop := errors.New("enough")
	calls := 0
	err = newClient(t, ts.URL).Watch(ctx, client.WatchOptions{}, func(client.Event) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("handler error: %v after %d calls", err, calls)
	}
}

// A stream that goes silent (no event, no keep-alive) is dropped after
// IdleTimeout and resumed; a canceled context ends the watch promptly.
func TestWatchIdleAndCancel(t *testing.T) {
	t.Parallel()
	f := &sse{conns: []func(http.ResponseWriter, *http.Request){stream(true, event(5, "updated", 1)), stream(true, event(6, "updated", 1))}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	got, err := collect(t, newClient(t, ts.URL), client.WatchOptions{IdleTimeout: 100 * time.Millisecond, Reconnect: time.Millisecond}, 2)
	if !errors.Is(err, context.Canceled) || !slices.Equal(ids(got), []int64{5, 6}) {
		t.Errorf("idle stream: %v, %v", err, ids(got))
	}
	if resumes, _ := f.seen(); !slices.Equal(resumes[:2], []string{"", "5"}) {
		t.Errorf("Last-Event-Id sent: %q", resumes)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- newClient(t, ts.URL).Watch(ctx, client.WatchOptions{}, func(client.Event) error { return nil })
	}()
	apitest.Eventually(t, 5*time.Second, "the watch connects", func() bool { r, _ := f.seen(); return len(r) >= 3 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("canceled watch: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end within 5s of its context")
	}
}
