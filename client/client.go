package client

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/registryd/registryd/client/internal/oapi"
)

// Client calls one registryd server. It is safe for concurrent use.
type Client struct {
	raw       *oapi.Client
	server    string
	hc        *http.Client
	token     TokenSource
	retry     Retry
	userAgent string
}

// TokenSource returns the bearer token to send. It is called for every
// request (and every reconnection of a watch), so a source that reads a
// file picks up a replaced token without a restart.
type TokenSource func(ctx context.Context) (string, error)

// Option configures a Client.
type Option func(*Client) error

// WithToken sends token as the bearer token of every request.
func WithToken(token string) Option {
	return func(c *Client) error {
		c.token = func(context.Context) (string, error) { return token, nil }
		return nil
	}
}

// WithTokenSource asks src for the bearer token of every request.
func WithTokenSource(src TokenSource) Option {
	return func(c *Client) error {
		if src == nil {
			return errors.New("client: nil token source")
		}
		c.token = src
		return nil
	}
}

// WithHTTPClient sends requests through hc (its Transport, TLS settings,
// Timeout; a Timeout ends watch streams too, so leave it zero and use
// contexts). The default is a client of its own with no timeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: nil http.Client")
		}
		c.hc = hc
		return nil
	}
}

// WithRetry sets how idempotent calls are retried; Retry{Attempts: 1}
// turns retries off.
func WithRetry(r Retry) Option {
	return func(c *Client) error {
		if r.Attempts < 0 || r.MinDelay < 0 || r.MaxDelay < 0 || r.MaxRetryAfter < 0 {
			return errors.New("client: negative retry setting")
		}
		c.retry = r.withDefaults()
		return nil
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) error {
		c.userAgent = ua
		return nil
	}
}

// New returns a client of the server at base (such as
// "http://127.0.0.1:8080"; a path prefix is kept).
func New(base string, opts ...Option) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: server %q is not an http(s) URL", base)
	}
	c := &Client{server: strings.TrimSuffix(base, "/"), hc: &http.Client{}, retry: Retry{}.withDefaults(),
		userAgent: "registryd-client"}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	raw, err := oapi.NewClient(c.server, oapi.WithHTTPClient(&retrier{next: c.hc, policy: &c.retry}),
		oapi.WithRequestEditorFn(c.authorize))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c.raw = raw
	return c, nil
}

// authorize sets the headers every request carries.
func (c *Client) authorize(ctx context.Context, req *http.Request) error {
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if c.token == nil {
		return nil
	}
	tok, err := c.token(ctx)
	if err != nil {
		return fmt.Errorf("client: token: %w", err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return nil
}

// CallOption adjusts one call.
type CallOption func(*call)

type call struct {
	nodeID       *int64
	ifMatch      *string
	ifNoneMatch  *string
	cacheControl *string
	requestID    string
	idemKey      string
	into         *Response
	attempts     int
	header       http.Header // the answer's headers, once finish read it
}

// AsNode sends Node-Id: pk, so that the call acts on behalf of that node:
// agents need it to change or delete their node, and a call that succeeds
// with it is the node's heartbeat. It goes with any call, whether or not
// the spec declares Node-Id for it.
func AsNode(pk int64) CallOption { return func(c *call) { c.nodeID = &pk } }

// IfMatch makes a PUT, PATCH or DELETE conditional on the row's ETag (as
// Response.ETag reported it): a row changed since is an *Error with
// status 412 (errors.Is(err, ErrPreconditionFailed)).
func IfMatch(etag string) CallOption { return func(c *call) { c.ifMatch = &etag } }

// IfNoneMatch makes a GET of a node or hardware generation answer
// ErrNotModified when its ETag is still etag.
func IfNoneMatch(etag string) CallOption { return func(c *call) { c.ifNoneMatch = &etag } }

// MaxStale sends Cache-Control: max-stale on a read (GetNode, HeadNode,
// ListNodes, ListNodesWithPosition, and Ping and HeadPing for the
// AsNode check; other calls ignore it): the replica
// answers from its node cache as it is, without waiting for it to catch
// up, so another replica's writes of the last 2 seconds may be missing.
// Without it (or NoCache) every read is consistent: it reflects every
// write any replica acknowledged before the read was sent.
func MaxStale() CallOption { return cacheControl("max-stale") }

// NoCache sends Cache-Control: no-cache on a read (GetNode, HeadNode,
// ListNodes, ListNodesWithPosition, Ping, HeadPing; other calls ignore
// it): the replica
// reads PostgreSQL instead of its node cache.
func NoCache() CallOption { return cacheControl("no-cache") }

func cacheControl(v string) CallOption { return func(c *call) { c.cacheControl = &v } }

// RequestID sends X-Request-Id: id (kept by the server as the client's
// request id, in its logs and the audit log, when it matches
// ^[A-Za-z0-9._:-]{1,64}$).
func RequestID(id string) CallOption { return func(c *call) { c.requestID = id } }

// IdempotencyKey sends Idempotency-Key: key on a claim, release, renewal,
// cordon or uncordon (other calls ignore it). The server runs the first
// call with a key once and answers its retries, from any replica, with
// the first answer, so the call is safe to retry: the client retries it
// (as it does reads) after a 503, a 429 or a lost connection. Use a new
// key for each new operation (NewIdempotencyKey) and the same one for
// its retries, including your own after a timeout; the same key with
// another body is an *Error of status 422 and code
// CodeIdempotencyKeyReused.
func IdempotencyKey(key string) CallOption { return func(c *call) { c.idemKey = key } }

// NewIdempotencyKey returns a fresh random key (128 bits, hex).
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Into fills r with what the answer said besides its body: status,
// headers, ETag, the server's request id and how many attempts it took.
func Into(r *Response) CallOption { return func(c *call) { c.into = r } }

// Response is what a call's answer said besides its body (see Into).
type Response struct {
	Status    int
	Header    http.Header
	ETag      string
	RequestID string
	// Attempts is how many times the request was sent (retries + 1).
	Attempts int
}

func newCall(opts []CallOption) *call {
	c := &call{}
	for _, o := range opts {
		o(c)
	}
	return c
}

// editors are the request editors of a call's own headers.
func (cl *call) editors() []oapi.RequestEditorFn {
	if cl.requestID == "" && cl.idemKey == "" && cl.nodeID == nil {
		return nil
	}
	return []oapi.RequestEditorFn{func(_ context.Context, req *http.Request) error {
		// The spec declares Node-Id only where acting as a node means
		// something; the server takes it on every call, and AsNode sends it
		// on every call.
		if cl.nodeID != nil {
			req.Header.Set("Node-Id", strconv.FormatInt(*cl.nodeID, 10))
		}
		if cl.requestID != "" {
			req.Header.Set("X-Request-Id", cl.requestID)
		}
		if cl.idemKey != "" && slices.ContainsFunc(keyedPOSTs, func(p string) bool { return strings.HasSuffix(req.URL.Path, p) }) {
			req.Header.Set("Idempotency-Key", cl.idemKey)
		}
		return nil
	}}
}

// ctx carries the call's attempt counter to the retrier.
func (cl *call) ctx(ctx context.Context) context.Context {
	return context.WithValue(ctx, attemptsKey{}, &cl.attempts)
}

// ErrNotModified is what a GET with IfNoneMatch returns when the row
// still has that ETag.
var ErrNotModified = errors.New("client: not modified")

// maxProblemBytes bounds how much of an error answer is read.
const maxProblemBytes = 64 << 10

// finish reads an answer: its body into out when the status is one of
// ok, an *Error otherwise. It always closes the body.
func (cl *call) finish(resp *http.Response, err error, out any, ok ...int) (status int, _ error) {
	if err != nil {
		return 0, fmt.Errorf("client: %w", err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblemBytes))
		resp.Body.Close()
	}()
	cl.header = resp.Header
	if cl.into != nil {
		*cl.into = Response{Status: resp.StatusCode, Header: resp.Header, ETag: resp.Header.Get("ETag"),
			RequestID: resp.Header.Get("X-Request-Id"), Attempts: max(cl.attempts, 1)}
	}
	for _, s := range ok {
		if resp.StatusCode != s {
			continue
		}
		if out != nil && resp.Request.Method != http.MethodHead && s != http.StatusNoContent && s != http.StatusNotModified {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				return s, fmt.Errorf("client: %s %s: read the answer: %w", resp.Request.Method, resp.Request.URL.Path, err)
			}
		}
		return s, nil
	}
	return resp.StatusCode, problemOf(resp)
}

// pk is a path pk: positive, as the server spells them.
func checkPK(what string, pk int64) error {
	if pk <= 0 {
		return fmt.Errorf("client: %s pk %d: pks are positive", what, pk)
	}
	return nil
}

// maxTokenFileBytes bounds a token file (a JWT is at most 16 KiB here).
const maxTokenFileBytes = 64 << 10

// TokenFile is a TokenSource reading the token from path on every request
// (surrounding whitespace trimmed), so a token rotated on disk is used
// from the next request on. An empty or unreadable file is an error, and
// the request is not sent.
func TokenFile(path string) TokenSource {
	return func(context.Context) (string, error) {
		f, err := os.Open(path)
		if err != nil {
			return "", err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
		switch {
		case err != nil:
			return "", err
		case len(b) > maxTokenFileBytes:
			return "", fmt.Errorf("%s: larger than %d bytes, not a token", path, maxTokenFileBytes)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
		return tok, nil
	}
}
