package auth

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// clock is a settable time for verifiers under test.
type clock struct{ t atomic.Pointer[time.Time] }

func newClock(t time.Time) *clock { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)  { c.t.Store(&t) }
func (c *clock) now() time.Time   { return *c.t.Load() }

// listOf is a revocation list safe for concurrent use.
type listOf struct {
	revoked atomic.Bool
	err     atomic.Pointer[error]
	asked   atomic.Int64
}

func (l *listOf) Revoked(sub, jti string, iat *time.Time) (bool, error) {
	l.asked.Add(1)
	if e := l.err.Load(); e != nil {
		return false, *e
	}
	return l.revoked.Load(), nil
}

// cachedHit verifies tok with v as a cache hit only: the secret is swapped
// for the call, so a full verification would fail.
func cachedHit(v *Verifier, tok string) (registry.Principal, error) {
	real := v.cfg.Secret
	v.cfg.Secret = []byte("not-the-secret-not-the-secret-not-the-secret")
	defer func() { v.cfg.Secret = real }()
	return v.Verify(tok)
}

// The cache's time checks are the parser's and the lifetime cap's: at
// every clock reading near a boundary (exp, nbf, iat with Leeway, and
// exp − cap for a token without iat; a clock that goes back included), a
// token the cache remembers is accepted exactly when a verifier without a
// cache accepts it. Each probe first puts the token in the cache at a
// reading where it is valid.
func TestCacheAgreesWithFullCheckOnTime(t *testing.T) {
	lifetimes := Lifetimes{Max: 2 * time.Hour, Admin: time.Hour}
	exp := now.Add(time.Hour)
	tokens := map[string]struct {
		tok   string
		valid time.Time // a reading where it is accepted
		edges []time.Time
	}{
		"iat, nbf, exp": {
			rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"a","role":"agent","iat":%d,"nbf":%d,"exp":%d}`,
				now.Unix(), now.Add(10*time.Minute).Unix(), exp.Unix())),
			now.Add(20 * time.Minute),
			[]time.Time{now.Add(-Leeway), now.Add(10*time.Minute - Leeway), exp.Add(Leeway)},
		},
		"nbf before iat": {
			rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"a","role":"agent","iat":%d,"nbf":%d,"exp":%d}`,
				now.Unix(), now.Add(-10*time.Minute).Unix(), exp.Unix())),
			now.Add(time.Minute),
			[]time.Time{now.Add(-Leeway), now.Add(-10*time.Minute - Leeway), exp.Add(Leeway)},
		},
		"no iat: capped from now": {
			rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"a","role":"admin","exp":%d}`, exp.Unix())),
			now.Add(30 * time.Minute),
			[]time.Time{exp.Add(-time.Hour - Leeway), exp.Add(Leeway)},
		},
		"no iat, nbf": {
			rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"a","role":"reader","nbf":%d,"exp":%d}`,
				now.Add(5*time.Minute).Unix(), exp.Unix())),
			now.Add(30 * time.Minute),
			[]time.Time{now.Add(5*time.Minute - Leeway), exp.Add(-2*time.Hour - Leeway), exp.Add(Leeway)},
		},
		"minted": {
			mustMint(t, TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: 90 * time.Minute, IPs: []string{"10.0.0.7"}}),
			now.Add(time.Minute),
			[]time.Time{now.Add(-Leeway), now.Add(90*time.Minute + Leeway)},
		},
	}
	for name, tc := range tokens {
		c := newClock(tc.valid)
		plain, _ := NewVerifier(Config{Secret: secret, Now: c.now, Lifetimes: lifetimes})
		cached, _ := NewVerifier(Config{Secret: secret, Now: c.now, Lifetimes: lifetimes, CacheSize: 10})
		if _, err := plain.Verify(tc.tok); err != nil {
			t.Fatalf("%s: not valid at %v: %v", name, tc.valid, err)
		}
		for _, edge := range tc.edges {
			for _, d := range []time.Duration{-time.Second, -time.Nanosecond, 0, time.Nanosecond, time.Second} {
				at := edge.Add(d)
				c.set(tc.valid)
				if _, err := cached.Verify(tc.tok); err != nil {
					t.Fatal(err)
				}
				c.set(at)
				_, want := plain.Verify(tc.tok)
				_, got := cachedHit(cached, tc.tok)
				if (got == nil) != (want == nil) {
					t.Errorf("%s at %v (edge %+v): cached says %v, a full check %v", name, at, d, got, want)
				}
			}
		}
	}
}

func mustMint(t *testing.T, spec TokenSpec) string {
	t.Helper()
	m, err := Signer{Secret: secret}.Mint(spec, now)
	if err != nil {
		t.Fatal(err)
	}
	return m.Token
}

// A token revoked while cached is refused at its next use; a list not
// loaded refuses a cached token as unavailable, not as invalid.
func TestCacheAsksRevocationsOnEveryHit(t *testing.T) {
	list := &listOf{}
	v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, Revocations: list, CacheSize: 10})
	tok := mustMint(t, TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour})
	if _, err := v.Verify(tok); err != nil {
		t.Fatal(err)
	}
	asked := list.asked.Load()
	p, err := cachedHit(v, tok)
	if err != nil || p.Sub != "agent-7" || p.Role != registry.RoleAgent {
		t.Fatalf("cache hit: %v %v", p, err)
	}
	if list.asked.Load() != asked+1 {
		t.Errorf("a cache hit asked the revocation list %d times", list.asked.Load()-asked)
	}
	list.revoked.Store(true)
	if _, err := cachedHit(v, tok); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("revoked while cached: %v", err)
	}
	list.revoked.Store(false)
	unavailable := fmt.Errorf("not loaded: %w", registry.ErrUnavailable)
	list.err.Store(&unavailable)
	_, err = cachedHit(v, tok)
	if _, bad := errors.AsType[*TokenError](err); !errors.Is(err, registry.ErrUnavailable) || bad {
		t.Errorf("list not loaded, cached token: %v", err)
	}
}

// The cache holds at most its size, however many distinct tokens pass,
// and a token pushed out is verified again in full, not refused.
func TestCacheBound(t *testing.T) {
	for _, size := range []int{1, 3, 16, 17, 100} {
		v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, CacheSize: size})
		toks := make([]string, 20*size+100) // enough to fill every shard
		for i := range toks {
			toks[i] = mustMint(t, TokenSpec{Sub: fmt.Sprintf("agent-%d", i), Role: registry.RoleAgent, TTL: time.Hour})
			if _, err := v.Verify(toks[i]); err != nil {
				t.Fatal(err)
			}
			if n := v.cache.len(); n > size {
				t.Fatalf("size %d: %d entries after %d tokens", size, n, i+1)
			}
		}
		if n := v.cache.len(); n != size {
			t.Errorf("size %d: %d entries after %d tokens: the cache should be full", size, n, len(toks))
		}
		for _, tok := range toks {
			if _, err := v.Verify(tok); err != nil {
				t.Errorf("size %d: a token pushed out of the cache: %v", size, err)
			}
		}
	}
}

// Only tokens that pass every check get in: garbage, bad signatures and
// tokens not valid yet leave the cache empty, and a token refused for its
// nbf is accepted once its time comes.
func TestCacheKeepsOnlyVerifiedTokens(t *testing.T) {
	c := newClock(now)
	v, _ := NewVerifier(Config{Secret: secret, Now: c.now, CacheSize: 100})
	early := rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"a","role":"agent","nbf":%d,"exp":%d}`,
		now.Add(5*time.Minute).Unix(), now.Add(time.Hour).Unix()))
	forged := rawToken([]byte("another-secret-another-secret-0000"), `{"alg":"HS256"}`,
		fmt.Sprintf(`{"sub":"a","role":"agent","exp":%d}`, now.Add(time.Hour).Unix()))
	for i := range 500 {
		for _, tok := range []string{fmt.Sprintf("garbage.%d.x", i), forged + "x", forged, early} {
			if _, err := v.Verify(tok); err == nil {
				t.Fatalf("accepted %q", tok)
			}
		}
	}
	if n := v.cache.len(); n != 0 {
		t.Errorf("refused tokens left %d cache entries", n)
	}
	c.set(now.Add(5*time.Minute - Leeway))
	if _, err := v.Verify(early); err != nil {
		t.Errorf("once valid: %v", err)
	}
	if n := v.cache.len(); n != 1 {
		t.Errorf("%d entries after one valid token", n)
	}
}

// A cache belongs to its verifier: a token one verifier accepted and
// remembers means nothing to a verifier with another secret, issuer or
// audience.
func TestCacheIsPerVerifier(t *testing.T) {
	at := func() time.Time { return now }
	first, _ := NewVerifier(Config{Secret: secret, Now: at, CacheSize: 10})
	tok := mustMint(t, TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour})
	if _, err := first.Verify(tok); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"another secret": {Secret: []byte("a-rotated-secret-a-rotated-secret-0000")},
		"an issuer":      {Secret: secret, Issuer: "https://idp.example"},
		"an audience":    {Secret: secret, Audience: "registryd"},
		"agents bound":   {Secret: secret, RequireAgentIPs: true},
	} {
		cfg.Now, cfg.CacheSize = at, 10
		other, _ := NewVerifier(cfg)
		if _, err := other.Verify(tok); err == nil {
			t.Errorf("%s: accepted a token only another verifier could", name)
		}
	}
}

// Without a cache every use is verified in full, revocation included.
func TestCacheDisabled(t *testing.T) {
	list := &listOf{}
	v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, Revocations: list})
	if v.cache != nil {
		t.Fatal("a cache of size 0")
	}
	tok := mustMint(t, TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour})
	for range 3 {
		if _, err := v.Verify(tok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cachedHit(v, tok); err == nil {
		t.Error("without a cache, a token was accepted without its signature checked")
	}
	list.revoked.Store(true)
	if _, err := v.Verify(tok); err == nil {
		t.Error("revoked token accepted")
	}
}

// Many goroutines verifying, revoking and expiring at once (run with
// -race): the bound holds and no revoked token is accepted.
func TestCacheConcurrent(t *testing.T) {
	list := &listOf{}
	c := newClock(now)
	v, _ := NewVerifier(Config{Secret: secret, Now: c.now, Revocations: list, CacheSize: 32})
	toks := make([]string, 100)
	for i := range toks {
		toks[i] = mustMint(t, TokenSpec{Sub: fmt.Sprintf("agent-%d", i), Role: registry.RoleAgent, TTL: time.Hour})
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	var acceptedRevoked atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				// Read the flag before: a token accepted then was not
				// revoked yet when the call began.
				revoked := list.revoked.Load()
				if _, err := v.Verify(toks[(g*7+i)%len(toks)]); err == nil && revoked {
					acceptedRevoked.Add(1)
				}
			}
		})
	}
	for range 200 {
		c.set(now.Add(time.Duration(len(toks)) * time.Second))
		if n := v.cache.len(); n > 32 {
			t.Errorf("%d entries", n)
		}
		time.Sleep(100 * time.Microsecond)
	}
	list.revoked.Store(true)
	time.Sleep(20 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if n := acceptedRevoked.Load(); n > 0 {
		t.Errorf("%d revoked tokens accepted", n)
	}
}
