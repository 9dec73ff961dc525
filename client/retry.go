package client

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Retry says how idempotent calls are retried (see the package doc for
// which calls are). Zero members take the defaults.
type Retry struct {
	// Attempts is how many times a call is sent at most: 1 turns retries
	// off. Default 4.
	Attempts int
	// MinDelay is the first backoff; each retry doubles it, up to
	// MaxDelay, and waits a random time between half of it and all of it.
	// Defaults 100ms and 5s.
	MinDelay, MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After honoured: an answer asking
	// for more is returned as it is (an *Error with RetryAfter set), not
	// slept on. Default 30s.
	MaxRetryAfter time.Duration
}

func (r Retry) withDefaults() Retry {
	if r.Attempts == 0 {
		r.Attempts = 4
	}
	if r.MinDelay == 0 {
		r.MinDelay = 100 * time.Millisecond
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = 5 * time.Second
	}
	r.MaxDelay = max(r.MaxDelay, r.MinDelay)
	if r.MaxRetryAfter == 0 {
		r.MaxRetryAfter = 30 * time.Second
	}
	return r
}

// backoff is the wait before retry n (1 for the first): exponential, with
// jitter in its upper half so that clients turned away together do not
// come back together.
func (r Retry) backoff(n int) time.Duration {
	d := r.MinDelay
	for i := 1; i < n && d < r.MaxDelay; i++ {
		d *= 2
	}
	d = min(d, r.MaxDelay)
	return d/2 + rand.N(d/2+1)
}

// attemptsKey carries a call's attempt counter (*int) in its context.
type attemptsKey struct{}

// noRetryKey marks a request the retrier must send once (a watch, which
// reconnects by itself).
type noRetryKey struct{}

// retrier sends requests, again when that is safe and may help: an
// idempotent request that got 503 or 429, or no answer at all.
type retrier struct {
	next   *http.Client
	policy *Retry
}

// readOnlyPOSTs are the POST operations that only read: listing with a
// filter in the body.
var readOnlyPOSTs = []string{"/v1/nodes/list", "/v1/hardware/list", "/v1/audit/list"}

// idempotentPOSTs are the POSTs whose repeat changes nothing more: a
// renewal sets the leases from now again, a cordon finds its nodes
// cordoned for that reason already. (An uncordon is not one: sent again,
// it reports the nodes it uncordoned the first time as not cordoned.)
var idempotentPOSTs = []string{"/v1/nodes/renew", "/v1/nodes/cordon"}

// keyedPOSTs are the POSTs that take an Idempotency-Key.
var keyedPOSTs = []string{"/v1/nodes/claim", "/v1/nodes/release", "/v1/nodes/renew", "/v1/nodes/cordon", "/v1/nodes/uncordon"}

// idempotent reports whether sending req twice has the effect of sending
// it once: a read, a PUT or DELETE, or a request with an Idempotency-Key.
func idempotent(req *http.Request) bool {
	if req.Header.Get("Idempotency-Key") != "" {
		return true
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		return true
	case http.MethodPost:
		for _, p := range slices.Concat(readOnlyPOSTs, idempotentPOSTs) {
			if strings.HasSuffix(req.URL.Path, p) {
				return true
			}
		}
	}
	return false
}

// retryable reports whether a failure to get an answer is worth another
// try: the connection was refused, reset or closed, or timed out. A
// canceled context, a bad URL or a certificate error is not.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

func (r *retrier) Do(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	attempts, _ := ctx.Value(attemptsKey{}).(*int)
	limit := 1
	if idempotent(req) && ctx.Value(noRetryKey{}) == nil {
		limit = r.policy.Attempts
	}
	for n := 1; ; n++ {
		if attempts != nil {
			*attempts = n
		}
		send := req
		if n > 1 {
			send = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				send.Body = body
			} else if req.Body != nil && req.Body != http.NoBody {
				return nil, errors.New("client: cannot resend a request body")
			}
		}
		resp, err := r.next.Do(send)
		if n >= limit {
			return resp, err
		}
		var wait time.Duration
		switch {
		case err != nil:
			if !retryable(ctx, err) {
				return nil, err
			}
			wait = r.policy.backoff(n)
		case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
			wait = r.policy.backoff(n)
			if ra, ok := retryAfter(resp.Header, time.Now()); ok {
				if ra > r.policy.MaxRetryAfter {
					return resp, nil
				}
				wait = max(wait, ra+wait/2)
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblemBytes))
			resp.Body.Close()
		default:
			return resp, nil
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
