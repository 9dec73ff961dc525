package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/agent"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// tokenTap stands between the agent and registryd and notes, for every
// request, when it was sent, the expiry of the token it carried and the
// answer's status.
type tokenTap struct {
	mu   sync.Mutex
	seen []tapped
}

type tapped struct {
	at      time.Time
	path    string
	token   string
	expires time.Time
	status  int
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (tp *tokenTap) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		info, _ := readTokenInfo(tok)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		at := time.Now()
		next.ServeHTTP(sw, r)
		tp.mu.Lock()
		tp.seen = append(tp.seen, tapped{at: at, path: r.URL.Path, token: tok, expires: info.Expires.Time, status: sw.status})
		tp.mu.Unlock()
	})
}

func (tp *tokenTap) snapshot() []tapped {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]tapped(nil), tp.seen...)
}

// An agent whose token lives 6 seconds heartbeats for more than three of
// its lifetimes without one refused request and without ever sending an
// expired token (registryd accepts a minute past exp, for clock skew: the
// test does not count on it); a restarted agent, configured with the
// first token long expired, goes on with its latest renewal.
func TestAgentRenewsItsToken(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	out, stderr, err := runCmd(t, r.srvEnv, "token", "--sub", "agent-host-1", "--role", "agent", "--ip", "127.0.0.1", "--ttl", "6s")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	first := lines[len(lines)-1]
	if !strings.Contains(out, "valid until") || !strings.Contains(out, "renews") {
		t.Errorf("registryd token does not say when the token expires and that the agent renews it:\n%s", out)
	}
	target, _ := url.Parse("http://" + r.addr)
	tap := &tokenTap{}
	proxy := httptest.NewServer(tap.wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(proxy.Close)
	r.agentEnv["REGISTRY_SERVER"] = proxy.URL
	r.agentEnv["REGISTRY_TOKEN"] = first
	r.tokenCheck = 100 * time.Millisecond
	r.smi.GPUs(gpu0, gpu1)

	ra := r.startAgent()
	start := time.Now()
	ra.await(t, "a first good pass", ok)
	for time.Since(start) < 19*time.Second {
		ra.await(t, "every pass good", func(rep agent.Report) bool {
			if !ok(rep) {
				t.Fatalf("a failed pass at %s: %+v\nagent log:\n%s", time.Since(start).Round(time.Millisecond), rep, ra.logs.String())
			}
			return true
		})
	}
	seen := tap.snapshot()
	tokens := map[string]bool{}
	for _, s := range seen {
		tokens[s.token] = true
		if s.status >= 400 {
			t.Errorf("%s at %s answered %d", s.path, s.at.Sub(start).Round(time.Millisecond), s.status)
		}
		if !s.at.Before(s.expires) {
			t.Errorf("%s at %s sent a token that expired at %s", s.path, s.at.Sub(start).Round(time.Millisecond), s.expires.Sub(start))
		}
	}
	// 19s of a 6s token, renewed with a third of it left: four renewals
	// at least.
	if len(tokens) < 4 {
		t.Errorf("%d tokens used in %d requests, want the first and at least 3 renewals", len(tokens), len(seen))
	}
	if !strings.Contains(ra.logs.String(), "agent token renewed") {
		t.Errorf("no renewal logged:\n%s", ra.logs.String())
	}
	if err := ra.stop(); err != nil {
		t.Fatal(err)
	}
	kept, err := os.ReadFile(filepath.Join(filepath.Dir(r.agentEnv["REGISTRY_AGENT_STATE"]), "state.token"))
	if err != nil {
		t.Fatalf("the renewal is not kept beside the state: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(filepath.Dir(r.agentEnv["REGISTRY_AGENT_STATE"]), "state.token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("the kept token is %v, want 0600", fi.Mode().Perm())
	}

	// Restarted much later, the first token long gone (here: its 6s are
	// over), the agent goes on with the renewal it kept.
	if !strings.Contains(string(kept), ".") {
		t.Fatalf("kept %q", kept)
	}
	before := len(tap.snapshot())
	r.tokenCheck = 0
	ra = r.startAgent()
	ra.await(t, "a good pass after the restart", ok)
	for _, s := range tap.snapshot()[before:] {
		if s.token == first || s.status >= 400 {
			t.Errorf("after the restart %s sent the first token, or was refused: %d", s.path, s.status)
		}
	}
}

// The keeper alone, with real tokens and a renewal that is a function:
// it renews only once a third of the lifetime is left, keeps the renewal
// over the configured token it descends from, gives way to a configured
// token of another lineage, stops asking once the server says a token is
// not renewed, and warns once a day about a token it cannot renew.
func TestTokenKeeper(t *testing.T) {
	t.Parallel()
	signer := auth.Signer{Secret: []byte(testSecret)}
	now := time.Now()
	mint := func(spec auth.TokenSpec, at time.Time) string {
		t.Helper()
		m, err := signer.Mint(spec, at)
		if err != nil {
			t.Fatal(err)
		}
		return m.Token
	}
	bound := auth.TokenSpec{Sub: "pool", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.1"}}
	var configured atomic.Pointer[string]
	setConf := func(tok string) { configured.Store(&tok) }
	logs := &apitest.Buffer{}
	state := filepath.Join(t.TempDir(), "state.json")
	k := newTokenKeeper(func(context.Context) (string, error) { return *configured.Load(), nil }, state,
		slog.New(slog.NewTextHandler(logs, nil)))
	k.now = func() time.Time { return now }
	var renewals int
	var refuse bool
	renew := func(ctx context.Context) (client.RenewedToken, error) {
		renewals++
		if refuse {
			return client.RenewedToken{}, &client.Error{Status: 403, Code: client.CodeTokenNotRenewable}
		}
		sent, _ := k.Token(ctx)
		v, _ := auth.NewVerifier(auth.Config{Secret: []byte(testSecret), Now: k.now})
		spec, err := v.Renewal(sent)
		if err != nil {
			return client.RenewedToken{}, err
		}
		m, err := signer.Mint(spec, now)
		return client.RenewedToken{Token: m.Token, ID: m.ID, Lineage: spec.Lineage, Expires: m.Expires}, err
	}
	ctx := context.Background()
	current := func() string { tok, _ := k.Token(ctx); return tok }

	// 30 minutes into an hour: not due; the wait ends when it is.
	first := mint(bound, now.Add(-30*time.Minute))
	setConf(first)
	if wait := k.step(ctx, renew); renewals != 0 || wait <= 0 || wait > time.Minute {
		t.Fatalf("renewed %d times (wait %s) with half the lifetime left", renewals, wait)
	}
	// 45 minutes in: due.
	now = now.Add(15 * time.Minute)
	k.step(ctx, renew)
	renewed := current()
	if renewals != 1 || renewed == first {
		t.Fatalf("%d renewals; still the first token: %v", renewals, renewed == first)
	}
	kept, err := os.ReadFile(renewalPath(state))
	if err != nil || strings.TrimSpace(string(kept)) != renewed {
		t.Fatalf("the renewal is not kept: %v", err)
	}
	// The configured token, read again, does not displace its renewal;
	// nor does it in a keeper started afresh (the agent restarted).
	k.step(ctx, renew)
	if current() != renewed || renewals != 1 {
		t.Fatal("the configured token displaced its own renewal, or a fresh token was renewed")
	}
	restarted := newTokenKeeper(func(context.Context) (string, error) { return *configured.Load(), nil }, state, k.log)
	restarted.now = k.now
	if tok, _ := restarted.Token(ctx); tok != renewed {
		t.Fatal("after a restart the agent went back to the configured token its renewal replaced")
	}
	// The server refuses the renewal (401: revoked by its own id, or a
	// secret rotated): the configured token again, and the kept renewal
	// forgotten.
	k.Refused(first) // not the token held: nothing happens
	if current() != renewed {
		t.Fatal("a refusal of another token displaced the renewal")
	}
	k.Refused(renewed)
	if current() != first {
		t.Fatal("a refused renewal is still used")
	}
	if _, err := os.Stat(renewalPath(state)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused renewal is still kept: %v", err)
	}
	// A token of another lineage configured: it wins.
	other := mint(bound, now)
	setConf(other)
	if current() != other {
		t.Fatal("a rotated configured token was not taken up")
	}
	// The server refuses to renew it: not asked again at once, but once a
	// quarter of what is left has passed (another replica may renew it).
	now = now.Add(50 * time.Minute)
	refuse = true
	k.step(ctx, renew)
	k.step(ctx, renew)
	if renewals != 2 {
		t.Fatalf("%d renewal requests, want 2: a refused lineage is not asked again at once", renewals)
	}
	now = now.Add(3 * time.Minute)
	k.step(ctx, renew)
	if renewals != 3 {
		t.Fatalf("%d renewal requests, want 3: a refused lineage is asked again later", renewals)
	}
	if !strings.Contains(logs.String(), "renewal failed") || strings.Count(logs.String(), "will not be renewed") != 1 {
		t.Fatalf("log:\n%s", logs.String())
	}
	// An unbound token 3 days from expiry: warned about once a day, never
	// sent for renewal.
	setConf(mint(auth.TokenSpec{Sub: "pool", Role: registry.RoleAgent, TTL: 90 * 24 * time.Hour}, now.Add(-87*24*time.Hour)))
	before := strings.Count(logs.String(), "will not be renewed")
	k.step(ctx, renew)
	now = now.Add(time.Hour)
	k.step(ctx, renew)
	if got := strings.Count(logs.String(), "will not be renewed") - before; got != 1 || renewals != 3 {
		t.Fatalf("%d warnings in an hour (want 1), %d renewals (want 3)", got, renewals)
	}
	now = now.Add(24 * time.Hour)
	k.step(ctx, renew)
	if got := strings.Count(logs.String(), "will not be renewed") - before; got != 2 {
		t.Fatalf("%d warnings after a day, want 2", got)
	}
}

// A refused renewal gives way only to a configured token that is still
// valid: when that one has long expired (what renewals are for), the
// renewal is all the agent has, and it stays, kept for restarts.
func TestTokenKeeperKeepsRenewalOverExpiredConfigured(t *testing.T) {
	t.Parallel()
	signer := auth.Signer{Secret: []byte(testSecret)}
	now := time.Now()
	spec := auth.TokenSpec{Sub: "pool", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.1"}}
	first, err := signer.Mint(spec, now.Add(-3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	spec.Lineage, spec.LineageStart = first.ID, now.Add(-3*time.Hour)
	renewal, err := signer.Mint(spec, now.Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(renewalPath(state), []byte(renewal.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &apitest.Buffer{}
	k := newTokenKeeper(func(context.Context) (string, error) { return first.Token, nil }, state, slog.New(slog.NewTextHandler(logs, nil)))
	if tok, _ := k.Token(context.Background()); tok != renewal.Token {
		t.Fatal("the kept renewal is not used")
	}
	k.Refused(renewal.Token)
	if tok, _ := k.Token(context.Background()); tok != renewal.Token {
		t.Fatal("a refused renewal gave way to a configured token that expired hours ago")
	}
	if _, err := os.Stat(renewalPath(state)); err != nil {
		t.Fatalf("the renewal is no longer kept: %v", err)
	}
	if !strings.Contains(logs.String(), "mint a new token") {
		t.Errorf("log:\n%s", logs.String())
	}
}
