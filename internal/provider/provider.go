// Package provider holds what the cloud importers share: the inventory they
// hand to the sync worker, and an HTTP helper with per-request timeouts and
// retries. Each cloud has its own client package (scp, e2e) built on it.
package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// GiB is the provider's "GB": PROVIDERS.md stores it as 2^30 bytes.
const GiB = int64(1) << 30

// Host is one provider machine as the registry needs it: one registry node
// per GPU (index 0..GPUs-1), or one node with index 0 and no GPU memory for
// a CPU-only host.
type Host struct {
	ExternalID  string // provider id, unique within the provider
	Name        string
	IP          string // as the provider reports it; empty hosts are skipped upstream
	State       string // the provider's own word, for logs and summaries
	Running     bool   // only running hosts are schedulable
	GPUModel    string // hardware generation name; "" for CPU-only hosts
	GPUs        int    // GPUs on the host; 0 for CPU-only
	GPUMemBytes int64  // per GPU
	CPUMemBytes int64  // host memory

	// Fabric names the interconnect domain the host is wired into (an
	// SCP cluster fabric, an E2E training cluster): hosts of one provider
	// with the same Fabric share it. It is the provider's stable id for
	// the domain, never a display name, so it stays the same across passes
	// while the domain exists. It is unique within its provider only;
	// "" when the provider does not say.
	Fabric string
	// Labels are what the provider says about the host, under keys with
	// the provider's own prefix (e.g. "scp.registryd.io/region") that
	// only its import sets. Every value is a non-empty valid label value
	// (LabelValue); a fact with no such form is left out. nil when none.
	Labels map[string]string
}

// SetLabel sets h.Labels[key] to LabelValue(value), or deletes key when
// nothing of value remains.
func (h *Host) SetLabel(key, value string) {
	v, ok := LabelValue(value)
	if !ok {
		delete(h.Labels, key)
		return
	}
	if h.Labels == nil {
		h.Labels = make(map[string]string, 4)
	}
	h.Labels[key] = v
}

// Skip is a host the provider reported that cannot become registry nodes,
// and why (no address, unknown product, …).
type Skip struct {
	ExternalID string
	Name       string
	Reason     string
}

// Inventory is everything one provider reported in one pass.
type Inventory struct {
	Hosts   []Host
	Skipped []Skip
}

// Error is a failed provider call, in words safe to log and print: no
// credentials, no signatures, no query strings with keys.
type Error struct {
	Provider string
	Op       string // e.g. "GET /v1/gpu-nodes page 2"
	Status   int    // HTTP status, 0 for transport failures
	Message  string
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s: %s: HTTP %d: %s", e.Provider, e.Op, e.Status, e.Message)
	}
	return fmt.Sprintf("%s: %s: %s", e.Provider, e.Op, e.Message)
}

// Retry configures Do.
type Retry struct {
	Attempts int           // total tries; default 4
	Base     time.Duration // first backoff; default 500ms
	Max      time.Duration // backoff cap and Retry-After cap; default 30s
	Timeout  time.Duration // per request; default 30s
	Logger   *slog.Logger
}

func (r Retry) withDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = 4
	}
	if r.Base <= 0 {
		r.Base = 500 * time.Millisecond
	}
	if r.Max <= 0 {
		r.Max = 30 * time.Second
	}
	if r.Timeout <= 0 {
		r.Timeout = 30 * time.Second
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r
}

// Do sends the request newReq builds (a fresh one per attempt, so signed
// requests get a fresh timestamp) and returns the body of a 2xx answer.
// 429, 5xx and timeouts are retried with exponential backoff and full
// jitter, honouring Retry-After; other statuses fail at once with the
// provider's message from errMessage. ctx cancellation stops everything.
func Do(ctx context.Context, client *http.Client, r Retry, providerName, op string,
	newReq func(ctx context.Context) (*http.Request, error), errMessage func(body []byte) string) ([]byte, error) {
	r = r.withDefaults()
	var last error
	for attempt := 1; ; attempt++ {
		body, status, retryAfter, err := once(ctx, client, r.Timeout, newReq)
		switch {
		case err == nil && status/100 == 2:
			return body, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errOtherOrigin), errors.Is(err, errOverLimit):
			return nil, &Error{Provider: providerName, Op: op, Message: err.Error()} // no use asking again
		case err != nil:
			last = &Error{Provider: providerName, Op: op, Message: err.Error()}
		default:
			msg := errMessage(body)
			if msg == "" {
				msg = http.StatusText(status)
			}
			last = &Error{Provider: providerName, Op: op, Status: status, Message: msg}
			if status != http.StatusTooManyRequests && status/100 != 5 {
				return nil, last
			}
		}
		if attempt >= r.Attempts {
			return nil, last
		}
		wait := backoff(r, attempt)
		if retryAfter > 0 {
			wait = min(retryAfter, r.Max)
		}
		r.Logger.Warn("provider call failed; retrying", "provider", providerName, "op", op,
			"attempt", attempt, "wait", wait.String(), "err", last.Error())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func once(ctx context.Context, client *http.Client, timeout time.Duration,
	newReq func(ctx context.Context) (*http.Request, error)) (body []byte, status int, retryAfter time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := newReq(ctx)
	if err != nil {
		return nil, 0, 0, err
	}
	resp, err := sameOrigin(client, req.URL).Do(req)
	if err != nil {
		if errors.Is(err, errOtherOrigin) {
			return nil, 0, 0, errors.Unwrap(err) // not the url.Error: its URL may hold keys
		}
		var ue interface{ Timeout() bool }
		if errors.As(err, &ue) && ue.Timeout() {
			return nil, 0, 0, fmt.Errorf("no answer within %s", timeout)
		}
		return nil, 0, 0, errors.New(transportMessage(err))
	}
	defer resp.Body.Close()
	ok := resp.StatusCode/100 == 2
	answer := int64(maxAnswer)
	if !ok {
		// Only the provider's message is read from it, and cut short.
		answer = maxErrorAnswer
	}
	limit := answer + 1 // one byte past it tells
	b, _ := ctx.Value(budgetKey{}).(*readBudget)
	if b != nil {
		limit = min(limit, max(b.left.Load(), 0)+1)
	}
	body, err = readBody(resp, limit)
	if b != nil && b.left.Add(-int64(len(body))) < 0 {
		return nil, 0, 0, fmt.Errorf("the pass has read more than %s from the provider, its budget: %w", sizeText(b.limit), errOverLimit)
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading the answer: %s", transportMessage(err))
	}
	if int64(len(body)) > answer {
		if ok {
			return nil, 0, 0, fmt.Errorf("the answer is larger than %s, the most one answer may be: %w", sizeText(answer), errOverLimit)
		}
		body = body[:answer]
	}
	return body, resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After")), nil
}

// readBody reads at most limit bytes of resp's body into a buffer sized
// once when the answer says its length, so a large answer is not copied
// as its buffer grows.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if n := resp.ContentLength; n > 0 {
		buf.Grow(int(min(n, limit)))
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, limit))
	return buf.Bytes(), err
}

// maxAnswer bounds one answer's body: a page of inventory is far less (a
// page of 100 SCP nodes, or 50 E2E clusters of 64 workers, is under a
// megabyte), and what a pass holds at once is one answer.
// maxErrorAnswer is what is read of an answer that is not a success: one
// cut there reads as the HTTP status alone.
const (
	maxAnswer      = 16 << 20
	maxErrorAnswer = 64 << 10
)

type budgetKey struct{}

// readBudget is what the calls of one pass may still read.
type readBudget struct {
	limit int64
	left  atomic.Int64
}

// WithReadBudget bounds what every call of Do under ctx reads from the
// provider, together, to limit bytes: a call past it fails, and is not
// retried, so a pass over it fails and changes nothing however the
// provider pages (the sync worker's REGISTRY_SYNC_MAX_READ_MIB).
func WithReadBudget(ctx context.Context, limit int64) context.Context {
	b := &readBudget{limit: limit}
	b.left.Store(limit)
	return context.WithValue(ctx, budgetKey{}, b)
}

// sizeText is n bytes in MiB when it is a whole number of them.
func sizeText(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// errOverLimit is what a call past the pass's read budget, or an answer
// past maxAnswer, ends in.
var errOverLimit = errors.New("inventory not applied")

// errOtherOrigin is what a redirect to another origin ends in.
var errOtherOrigin = errors.New("credentials are sent to the configured endpoint only")

// sameOrigin is client following redirects only within origin's scheme,
// host and port, as client would: a provider's keys ride in headers (SCP's
// access key and signature) or the query string (E2E's apikey), and Go
// keeps custom headers and the redirect's query on a redirect to another
// host. A redirect elsewhere fails, naming the host it pointed to.
func sameOrigin(client *http.Client, origin *url.URL) *http.Client {
	c := *client
	next := client.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != origin.Scheme || req.URL.Host != origin.Host {
			return fmt.Errorf("the provider redirected to %s://%s: %w", req.URL.Scheme, req.URL.Host, errOtherOrigin)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &c
}

// transportMessage drops the URL from net/http errors: it may carry keys in
// its query string.
func transportMessage(err error) string {
	var ue interface{ Unwrap() error }
	msg := err.Error()
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil && strings.Contains(msg, "://") {
			msg = inner.Error()
		}
	}
	return msg
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// backoff is exponential with full jitter: uniform in (0, base·2^(n-1)].
func backoff(r Retry, attempt int) time.Duration {
	ceil := r.Base << (attempt - 1)
	if ceil <= 0 || ceil > r.Max {
		ceil = r.Max
	}
	return time.Duration(rand.Int64N(int64(ceil))) + 1
}

// GPUSpec is a GPU model's memory and how many a bare-metal node has.
type GPUSpec struct {
	MemGB int64
	Count int
}

// DefaultGPUTable is PROVIDERS.md's built-in table, used when a product
// description does not say.
func DefaultGPUTable() map[string]GPUSpec {
	return map[string]GPUSpec{
		"H100": {80, 8}, "H200": {141, 8}, "A100": {80, 8}, "L40S": {48, 8},
		"L4": {24, 8}, "B200": {180, 8}, "B300": {268, 8},
	}
}

// ParseGPUTable reads overrides like "H100=80x8,B300=268x8" (GB per GPU ×
// GPUs per node; "x8" may be left out) on top of the default table.
func ParseGPUTable(s string) (map[string]GPUSpec, error) {
	t := DefaultGPUTable()
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		model, spec, ok := strings.Cut(item, "=")
		mem, count, hasCount := strings.Cut(spec, "x")
		gb, err := strconv.ParseInt(strings.TrimSpace(mem), 10, 64)
		n := 8
		if hasCount {
			n, err = strconv.Atoi(strings.TrimSpace(count))
		}
		if !ok || err != nil || gb <= 0 || n <= 0 || strings.TrimSpace(model) == "" {
			return nil, fmt.Errorf("GPU table entry %q: want MODEL=GB or MODEL=GBxCOUNT", item)
		}
		t[strings.TrimSpace(model)] = GPUSpec{MemGB: gb, Count: n}
	}
	return t, nil
}
