package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestDoRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusBadGateway)
		case 2:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.Write([]byte(`{"ok":true}`))
		}
	}))
	defer srv.Close()
	req := func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, "GET", srv.URL+"?apikey=SECRET", nil)
	}
	body, err := Do(context.Background(), srv.Client(), Retry{Base: time.Millisecond}, "test", "GET /", req, func([]byte) string { return "" })
	if err != nil || string(body) != `{"ok":true}` || calls.Load() != 3 {
		t.Fatalf("body %q err %v after %d calls", body, err, calls.Load())
	}
}

func TestDoGivesUpAndKeepsSecretsOut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`bad key`))
	}))
	defer srv.Close()
	var calls int
	req := func(ctx context.Context) (*http.Request, error) {
		calls++
		return http.NewRequestWithContext(ctx, "GET", srv.URL+"?apikey=SECRET", nil)
	}
	_, err := Do(context.Background(), srv.Client(), Retry{Base: time.Millisecond}, "test", "GET /x", req,
		func(b []byte) string { return string(b) })
	var pe *Error
	if !errors.As(err, &pe) || pe.Status != 401 || calls != 1 || !strings.Contains(err.Error(), "bad key") {
		t.Fatalf("401: %v after %d calls", err, calls)
	}
	// A dead server: transport errors name no URL (its query holds keys).
	srv.Close()
	_, err = Do(context.Background(), http.DefaultClient, Retry{Attempts: 2, Base: time.Millisecond}, "test", "GET /x", req,
		func([]byte) string { return "" })
	if err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("transport error: %v", err)
	}
}

func TestDoTimeoutAndCancel(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	}))
	defer srv.Close()
	req := func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	}
	start := time.Now()
	_, err := Do(context.Background(), srv.Client(), Retry{Attempts: 2, Base: time.Millisecond, Timeout: 50 * time.Millisecond}, "test", "GET /", req,
		func([]byte) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "no answer within") || time.Since(start) > time.Second {
		t.Fatalf("timeout: %v after %s", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Do(ctx, srv.Client(), Retry{}, "test", "GET /", req, func([]byte) string { return "" }); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

func TestParseGPUTable(t *testing.T) {
	tb, err := ParseGPUTable("H100=94, X9=12x4")
	if err != nil || tb["H100"] != (GPUSpec{94, 8}) || tb["X9"] != (GPUSpec{12, 4}) || tb["B300"] != (GPUSpec{268, 8}) {
		t.Fatalf("%v %v", tb, err)
	}
	for _, bad := range []string{"H100", "H100=", "H100=-1", "=80", "H100=80x0", "H100=eighty"} {
		if _, err := ParseGPUTable(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	if d := parseRetryAfter("3"); d != 3*time.Second {
		t.Errorf("seconds: %v", d)
	}
	if d := parseRetryAfter(time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat)); d <= 0 || d > 3*time.Second {
		t.Errorf("date: %v", d)
	}
	if d := parseRetryAfter("soon"); d != 0 {
		t.Errorf("garbage: %v", d)
	}
}

// A redirect to another origin is refused before anything reaches it:
// Go would carry the provider's key headers and the redirect's query to
// the other host. The call fails at once, naming the host, not the keys;
// a redirect within the endpoint's origin is followed.
func TestDoRefusesRedirectsElsewhere(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Write([]byte(`{"stolen":true}`))
	}))
	defer other.Close()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/v1/gpu-nodes?apikey="+r.URL.Query().Get("apikey"), http.StatusFound)
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusMovedPermanently)
		case "/here":
			w.Write([]byte(`{"ok":true}`))
		}
	}))
	defer srv.Close()
	get := func(path string) ([]byte, error) {
		return Do(context.Background(), &http.Client{}, Retry{Attempts: 3, Base: time.Millisecond}, "scp", "list",
			func(ctx context.Context) (*http.Request, error) {
				req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+path+"?apikey=SECRET", nil)
				if err == nil {
					req.Header.Set("Scp-Accesskey", "SECRET")
				}
				return req, err
			}, func([]byte) string { return "" })
	}
	_, err := get("/away")
	if err == nil || elsewhere.Load() != 0 {
		t.Fatalf("redirect to another host: err %v, %d requests reached it", err, elsewhere.Load())
	}
	if msg := err.Error(); strings.Contains(msg, "SECRET") || !strings.Contains(msg, strings.TrimPrefix(other.URL, "http://")) ||
		!strings.Contains(msg, "configured endpoint only") {
		t.Errorf("error %q: want the other host named, the keys not", msg)
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls to the endpoint: a refused redirect is not retried", calls.Load())
	}
	if body, err := get("/moved"); err != nil || string(body) != `{"ok":true}` {
		t.Errorf("redirect within the endpoint: %s, %v", body, err)
	}
}

// The calls of a pass share one read budget: the answer that passes it
// fails the call at once (no retry, nothing more read), however small
// each answer is.
func TestDoReadBudget(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Write([]byte(strings.Repeat("x", 600)))
	}))
	defer srv.Close()
	ctx := WithReadBudget(context.Background(), 1000)
	get := func() error {
		_, err := Do(ctx, &http.Client{}, Retry{Attempts: 3, Base: time.Millisecond}, "scp", "list",
			func(ctx context.Context) (*http.Request, error) {
				return http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
			},
			func([]byte) string { return "" })
		return err
	}
	if err := get(); err != nil {
		t.Fatalf("600 of 1,000 bytes: %v", err)
	}
	err := get()
	if err == nil || !strings.Contains(err.Error(), "has read more than") || calls.Load() != 2 {
		t.Fatalf("1,200 of 1,000 bytes: %v after %d calls, want a failure without retry", err, calls.Load())
	}
	// Without a budget, the same answers are fine.
	if _, err := Do(context.Background(), &http.Client{}, Retry{}, "scp", "list",
		func(ctx context.Context) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
		},
		func([]byte) string { return "" }); err != nil {
		t.Fatal(err)
	}
}

// One answer is at most maxAnswer: a longer one fails the call at once (no
// retry). Of an error answer only maxErrorAnswer is read, and its status
// still tells.
func TestDoAnswerLimit(t *testing.T) {
	var calls atomic.Int32
	size, status := maxAnswer+1, http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(status)
		w.Write(bytes.Repeat([]byte{'x'}, size))
	}))
	defer srv.Close()
	get := func() ([]byte, error) {
		return Do(context.Background(), &http.Client{}, Retry{Attempts: 3, Base: time.Millisecond}, "scp", "list",
			func(ctx context.Context) (*http.Request, error) {
				return http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
			},
			func(body []byte) string { return fmt.Sprintf("%d bytes", len(body)) })
	}
	if _, err := get(); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") || calls.Load() != 1 {
		t.Fatalf("an answer of 16 MiB and a byte: %v after %d calls, want a failure without retry", err, calls.Load())
	}
	size = maxAnswer
	if body, err := get(); err != nil || len(body) != maxAnswer {
		t.Fatalf("an answer of 16 MiB: %d bytes, %v", len(body), err)
	}
	size, status = 1<<20, http.StatusBadRequest
	var pe *Error
	if _, err := get(); !errors.As(err, &pe) || pe.Status != http.StatusBadRequest || pe.Message != fmt.Sprintf("%d bytes", maxErrorAnswer) {
		t.Fatalf("an error answer of 1 MiB: %v, want HTTP 400 and %d bytes of it read", err, maxErrorAnswer)
	}
}
