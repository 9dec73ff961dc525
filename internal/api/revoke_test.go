package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/revoke"
	"github.com/registryd/registryd/internal/store"
)

// revocationCounter counts the revocation loads that reach the database.
type revocationCounter struct {
	*store.Store
	loads     atomic.Int64
	listening atomic.Bool // the LISTEN session is up (its first callback ran)
}

func (c *revocationCounter) Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error {
	return c.Store.Listen(ctx, channels, func(channel, payload string) {
		c.listening.Store(true)
		fn(channel, payload)
	})
}

func (c *revocationCounter) Revocations(ctx context.Context) ([]registry.Revocation, error) {
	c.loads.Add(1)
	return c.Store.Revocations(ctx)
}

// replica is one more registryd server on b's database, with a store, a
// watch hub and a revocation list of its own, as a second process would
// have. Its list reloads only on NOTIFY (the fallback is an hour away).
type replica struct {
	*bundle
	list  *revoke.List
	store *revocationCounter
}

func newReplica(b *bundle, opts ...option) *replica {
	t := b.t
	t.Helper()
	st := pgtest.Open(t, b.dbURL, store.Options{})
	cs := &revocationCounter{Store: st}
	list := revoke.New(cs, revoke.Options{Channel: store.RevocationsChannel, Reload: time.Hour})
	t.Cleanup(lifecycle.Go(context.Background(), list.Run))
	select {
	case <-list.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the revocation list did not load within 10s")
	}
	// Connecting the LISTEN session asks for one more load; let it settle
	// so that tests counting loads count only what requests cause.
	apitest.Eventually(t, 10*time.Second, "the revocation list's LISTEN session comes up", func() bool {
		return cs.listening.Load() && cs.loads.Load() >= 2
	})
	// Cached, as serve runs: the tokens each replica has seen are in its
	// cache when they are revoked.
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, Revocations: list, CacheSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping, Auth: verifier, Events: startHub(t, st)}
	for _, o := range opts {
		o(&cfg)
	}
	ts := httptest.NewServer(api.New(cfg))
	t.Cleanup(ts.Close)
	r := *b
	r.url = ts.URL
	return &replica{bundle: &r, list: list, store: cs}
}

// mint signs a token for sub with role as if issued at iat.
func mint(t *testing.T, sub string, role registry.Role, iat time.Time) auth.Minted {
	t.Helper()
	m, err := auth.Signer{Secret: testSecret}.Mint(auth.TokenSpec{Sub: sub, Role: role, TTL: time.Hour}, iat)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// status sends a ping with tok to r.
func (r *replica) status(tok string) (int, string) {
	resp := r.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+tok)
	return resp.status, resp.header.Get("WWW-Authenticate")
}

// refusedWithin waits, at most 5s, until r refuses tok as revoked.
func (r *replica) refusedWithin(t *testing.T, tok string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, challenge := r.status(tok)
		if code == http.StatusUnauthorized {
			if !strings.Contains(challenge, "the token has been revoked") {
				t.Fatalf("401 without the reason: %q", challenge)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked token still gets %d after 5s", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Revocation end to end over HTTP on two replicas of one database: by
// subject and by token id, each made on one replica and seen by the other
// within 5s; tokens issued after a subject's revocation work; the audit
// log has the entries.
func TestRevokeAcrossReplicas(t *testing.T) {
	b := setup(t)
	one, two := newReplica(b), newReplica(b)
	issued := time.Now().Add(-10 * time.Second)
	leaky := mint(t, "agent-leaky", registry.RoleAgent, issued)
	fine := mint(t, "agent-fine", registry.RoleAgent, issued)
	for _, r := range []*replica{one, two} {
		for _, tok := range []string{leaky.Token, fine.Token} {
			if code, _ := r.status(tok); code != http.StatusOK {
				t.Fatalf("before revoking: %d", code)
			}
		}
	}

	// By subject, through replica one.
	resp := one.must(http.StatusOK, one.do("POST", "/v1/tokens/revoke", map[string]any{"sub": "agent-leaky"}, "X-Request-Id", "revoke-leaky"))
	var rev struct {
		Sub           string    `json:"sub"`
		RevokedBefore time.Time `json:"revoked_before"`
	}
	resp.json(t, &rev)
	if rev.Sub != "agent-leaky" || rev.RevokedBefore.Before(issued) {
		t.Fatalf("answer %s", resp.body)
	}
	two.refusedWithin(t, leaky.Token)
	one.refusedWithin(t, leaky.Token)
	for _, r := range []*replica{one, two} {
		if code, _ := r.status(fine.Token); code != http.StatusOK {
			t.Errorf("another principal's token: %d", code)
		}
		// Issued at the instant, or later: accepted.
		if code, _ := r.status(mint(t, "agent-leaky", registry.RoleAgent, rev.RevokedBefore).Token); code != http.StatusOK {
			t.Errorf("a token issued after the revocation: %d", code)
		}
		if code, _ := r.status(mint(t, "agent-leaky", registry.RoleAgent, rev.RevokedBefore.Add(-time.Second)).Token); code != http.StatusUnauthorized {
			t.Errorf("a token issued a second before the revocation: %d", code)
		}
	}

	// By token id, through replica two; the principal's other token lives.
	first := mint(t, "agent-two", registry.RoleAgent, issued)
	second := mint(t, "agent-two", registry.RoleAgent, issued)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	resp = two.must(http.StatusOK, two.do("POST", "/v1/tokens/revoke", map[string]any{"jti": first.ID, "until": until.Format(time.RFC3339)}))
	if m := resp.object(t); m["jti"] != first.ID || m["until"] != until.Format(time.RFC3339) {
		t.Errorf("answer %s", resp.body)
	}
	one.refusedWithin(t, first.Token)
	two.refusedWithin(t, first.Token)
	if code, _ := one.status(second.Token); code != http.StatusOK {
		t.Errorf("the principal's other token: %d", code)
	}

	// Audited, with who and which request.
	var entries []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"target_type": "token"})).json(t, &entries)
	if len(entries) != 2 {
		t.Fatalf("%d token entries: %v", len(entries), entries)
	}
	e := entries[0]
	after, _ := e["after"].(map[string]any)
	if e["action"] != "token.revoke" || e["principal"] != "admin-test" || e["role"] != "admin" || e["client_request_id"] != "revoke-leaky" || e["request_id"] == "revoke-leaky" ||
		after["sub"] != "agent-leaky" || after["revoked_before"] == nil {
		t.Errorf("audit entry %v", e)
	}
	if after, _ := entries[1]["after"].(map[string]any); after["jti"] != first.ID {
		t.Errorf("audit entry %v", entries[1])
	}
}

func TestRevokeValidation(t *testing.T) {
	b := setup(t)
	for body, fields := range map[string]string{
		`{}`:                    "sub",
		`{"sub":"a","jti":"b"}`: "jti",
		`{"sub":""}`:            "sub",
		`{"jti":""}`:            "jti",
		`{"sub":"a","until":"2030-01-01T00:00:00Z"}`: "until",
		`{"jti":"a","until":"tomorrow"}`:             "until",
		`{"jti":"a","until":"2020-01-01T00:00:00Z"}`: "until", // in the past: pruning would forget it early
		`{"sub":7}`:             "sub",
		`{"sub":"a\u0000"}`:     "sub",
		`{"sub":"a","who":"x"}`: "who",
	} {
		r := b.must(http.StatusBadRequest, b.do("POST", "/v1/tokens/revoke", body))
		if got := strings.Join(r.problemFields(t), ","); got != fields {
			t.Errorf("%s: fields %q, want %q", body, got, fields)
		}
	}
	b.must(http.StatusBadRequest, b.do("POST", "/v1/tokens/revoke", nil))
	b.must(http.StatusBadRequest, b.do("POST", "/v1/tokens/revoke", `[]`))
	var n int
	b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM token_revocations`).Scan(&n)
	if n != 0 {
		t.Errorf("refused requests stored %d revocations", n)
	}
}

// Requests pay no query for the revocation check: many authenticated
// requests, no load.
func TestRevocationCheckCostsNoQuery(t *testing.T) {
	b := setup(t)
	r := newReplica(b)
	loads := r.store.loads.Load()
	tok := mint(t, "reader-1", registry.RoleReader, time.Now()).Token
	for range 50 {
		if code, _ := r.status(tok); code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	if got := r.store.loads.Load(); got != loads {
		t.Errorf("50 requests made %d revocation loads", got-loads)
	}
}

// Before the list is loaded no token is accepted: 503, retry later, and
// not 401, since the token itself may be fine.
func TestRevocationListNotLoaded(t *testing.T) {
	b := setup(t)
	list := revoke.New(b.store, revoke.Options{Channel: store.RevocationsChannel}) // never run
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, Revocations: list})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api.New(api.Config{Store: b.store, OpenAPI: registryd.OpenAPI, Auth: verifier}))
	t.Cleanup(ts.Close)
	c := *b
	c.url = ts.URL
	r := c.must(http.StatusServiceUnavailable, c.do("GET", "/v1/nodes/ping", nil))
	if r.header.Get("Retry-After") == "" || r.header.Get("WWW-Authenticate") != "" {
		t.Errorf("headers %v", r.header)
	}
}
