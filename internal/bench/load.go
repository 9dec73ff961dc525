package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// requestTimeout bounds one request of the load generator; a request that
// takes longer is an error, not a long sample.
const requestTimeout = 30 * time.Second

// op is one unit of a workload (a request, or a claim and its release),
// sent through c. It returns nil only when every answer was a 2xx and
// checked out; the load generator times it.
type op func(ctx context.Context, c *http.Client, rng *rand.Rand) error

// errStop, returned by an op, ends its client's part of the load (the
// fleet has nothing left for it): neither an op nor an error.
var errStop = errors.New("bench: nothing left to do")

// statusError is a non-2xx answer.
type statusError struct {
	method, path string
	code         int
	body         string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.method, e.path, e.code, e.body)
}

// kind is the key errors are counted under: the status alone, so that a
// thousand 503s are one line with their count.
func errorKind(err error) string {
	if se, ok := errors.AsType[*statusError](err); ok {
		return fmt.Sprintf("HTTP %d %s", se.code, se.path)
	}
	if errors.Is(err, errDoubleAssignment) {
		return "double assignment"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	msg := err.Error()
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return msg
}

// Load is what one run of the load generator measured.
type Load struct {
	Ops      int64         // ops that succeeded
	Errors   int64         // ops that failed (non-2xx, transport error, failed check)
	Elapsed  time.Duration // from the first op's start to the last op's end
	Rate     float64       // successful ops per second
	P50, P99 time.Duration // latency of successful ops
	Max      time.Duration
	// ErrorKinds counts failed ops by kind; ErrorSamples holds the first
	// error of each kind in full.
	ErrorKinds   map[string]int64
	ErrorSamples map[string]string
}

// generate runs do from clients goroutines, each with its own keep-alive
// connection, back to back for warmup and then d, and measures every op
// that ends after warmup (connections are open, statements prepared by
// then). Ops in flight when d ends run to completion and count.
func generate(ctx context.Context, clients int, warmup, d time.Duration, do op) Load {
	type worker struct {
		lat     []time.Duration
		errs    map[string]int64
		samples map[string]string
	}
	workers := make([]worker, clients)
	start := time.Now().Add(warmup)
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range workers {
		w := &workers[i]
		w.errs, w.samples = map[string]int64{}, map[string]string{}
		// One connection per client, kept alive, never a shared pool
		// that opens more under load; requests are bounded by
		// requestTimeout (see connTransport).
		tr := &connTransport{}
		c := &http.Client{Transport: tr}
		rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				err := do(ctx, c, rng)
				dt := time.Since(t0)
				if err != nil { // counted during the warm-up too: an error is an error
					if ctx.Err() != nil || errors.Is(err, errStop) {
						return
					}
					k := errorKind(err)
					if w.errs[k] == 0 {
						w.samples[k] = err.Error()
					}
					w.errs[k]++
					continue
				}
				// Measured: the ops that end after the warm-up, so that
				// ops slower than the whole run still show.
				if t0.Add(dt).After(start) {
					w.lat = append(w.lat, dt)
				}
			}
		})
	}
	wg.Wait()
	l := Load{Elapsed: time.Since(start), ErrorKinds: map[string]int64{}, ErrorSamples: map[string]string{}}
	var all []time.Duration
	for _, w := range workers {
		all = append(all, w.lat...)
		for k, n := range w.errs {
			if l.ErrorKinds[k] == 0 {
				l.ErrorSamples[k] = w.samples[k]
			}
			l.ErrorKinds[k] += n
			l.Errors += n
		}
	}
	l.Ops = int64(len(all))
	if l.Elapsed > 0 {
		l.Rate = float64(l.Ops) / l.Elapsed.Seconds()
	}
	if len(all) > 0 {
		slices.Sort(all)
		l.P50, l.P99, l.Max = percentile(all, 0.50), percentile(all, 0.99), all[len(all)-1]
	}
	return l
}

// percentile of sorted samples, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// call sends one request with a bearer token (and headers in pairs) and
// returns the body of a 2xx answer; anything else is a *statusError.
func call(ctx context.Context, c *http.Client, method, url, token string, body []byte, headers ...string) ([]byte, error) {
	resp, err := send(ctx, c, method, url, token, body, headers...)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// send is call for a body the caller reads as it comes: the response of a
// 2xx answer, whose body the caller closes; anything else is a
// *statusError.
func send(ctx context.Context, c *http.Client, method, url, token string, body []byte, headers ...string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, err
	}
	path := req.URL.Path
	if strings.HasPrefix(path, "/v1/nodes/") && strings.Trim(path[len("/v1/nodes/"):], "0123456789") == "" {
		path = "/v1/nodes/{pk}"
	}
	snippet := strings.TrimSpace(string(b))
	if len(snippet) > 300 {
		snippet = snippet[:300]
	}
	return nil, &statusError{method: method, path: path, code: resp.StatusCode, body: snippet}
}
