package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/registryd/registryd/internal/registry"
)

// setList is a revocation list backed by the registry's real set.
type setList struct {
	set atomic.Pointer[registry.RevocationSet]
}

func (l *setList) revoke(rs ...registry.Revocation) { l.set.Store(registry.NewRevocationSet(rs)) }
func (l *setList) Revoked(sub, jti string, iat *time.Time) (bool, error) {
	return l.set.Load().Revokes(sub, jti, iat), nil
}

// renewer mints and verifies with one secret and clock, as a replica does.
func renewer(t *testing.T, c *clock, list Revocations) (Signer, *Verifier) {
	t.Helper()
	v, err := NewVerifier(Config{Secret: secret, Now: c.now, Revocations: list, CacheSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	return Signer{Secret: secret}, v
}

// renew is what POST /v1/tokens/renew does.
func renew(t *testing.T, s Signer, v *Verifier, tok string, at time.Time) Minted {
	t.Helper()
	spec, err := v.Renewal(tok)
	if err != nil {
		t.Fatalf("renewal refused: %v", err)
	}
	m, err := s.Mint(spec, at)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRenewalKeepsSubjectRoleAddressesAndLifetime(t *testing.T) {
	c := newClock(now)
	list := &setList{}
	list.revoke()
	s, v := renewer(t, c, list)
	first, err := s.Mint(TokenSpec{Sub: "agents-a", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.0/24"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	// Renewed over and over, well past the first token's lifetime, each
	// renewal from the one before.
	tok, at := first, now
	for i := range 5 {
		at = at.Add(40 * time.Minute)
		c.set(at)
		next := renew(t, s, v, tok.Token, at)
		p, err := v.Verify(next.Token)
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		if p.Sub != "agents-a" || p.Role != registry.RoleAgent || registry.FormatIPSet(p.IPs) != "10.0.0.0/24" {
			t.Fatalf("renewal %d is %+v", i, p)
		}
		if got := next.Expires.Sub(at); got != time.Hour {
			t.Fatalf("renewal %d lives %s, want the first token's 1h", i, got)
		}
		if p.Token.Lineage != first.ID {
			t.Fatalf("renewal %d has lineage %q, want the first token's jti %q", i, p.Token.Lineage, first.ID)
		}
		tok = next
	}
	if _, err := v.Verify(first.Token); err == nil {
		t.Fatal("the first token outlived its hour")
	}
}

func TestRenewalsAreRevokedWithTheirLineage(t *testing.T) {
	mint := func(t *testing.T, s Signer) Minted {
		m, err := s.Mint(TokenSpec{Sub: "agents-a", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.1"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	t.Run("by the first token's jti", func(t *testing.T) {
		c := newClock(now)
		list := &setList{}
		list.revoke()
		s, v := renewer(t, c, list)
		first := mint(t, s)
		c.set(now.Add(31 * time.Minute))
		second := renew(t, s, v, first.Token, now.Add(31*time.Minute))
		if _, err := v.Verify(second.Token); err != nil {
			t.Fatal(err)
		}
		list.revoke(registry.Revocation{JTI: first.ID})
		var te *TokenError
		if _, err := v.Verify(second.Token); !errors.As(err, &te) || !strings.Contains(te.Reason, "revoked") {
			t.Fatalf("the renewal of a revoked token: %v", err)
		}
		if _, err := v.Renewal(second.Token); !errors.As(err, &te) {
			t.Fatalf("renewing the renewal of a revoked token: %v", err)
		}
	})
	t.Run("by subject, though renewed after the revocation", func(t *testing.T) {
		// A replica that has not loaded the revocation yet renews the
		// token a second after it: the renewal is issued after the
		// revocation's instant, but its lineage began before it.
		c := newClock(now)
		list := &setList{}
		list.revoke()
		s, v := renewer(t, c, list)
		first := mint(t, s)
		revokedAt := now.Add(40 * time.Minute)
		c.set(revokedAt.Add(time.Second))
		late := renew(t, s, v, first.Token, revokedAt.Add(time.Second))
		list.revoke(registry.Revocation{Sub: "agents-a", Before: revokedAt})
		if _, err := v.Verify(late.Token); err == nil {
			t.Fatal("a renewal issued after the subject's revocation, of a token issued before it, is accepted")
		}
		// A token minted by hand after the revocation is fine.
		c.set(revokedAt.Add(time.Minute))
		fresh, err := s.Mint(TokenSpec{Sub: "agents-a", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.1"}}, revokedAt.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(fresh.Token); err != nil {
			t.Fatalf("a token minted after the revocation: %v", err)
		}
	})
}

func TestRenewalRefusals(t *testing.T) {
	c := newClock(now)
	s, v := renewer(t, c, nil)
	mint := func(spec TokenSpec) string {
		m, err := s.Mint(spec, now)
		if err != nil {
			t.Fatal(err)
		}
		return m.Token
	}
	for name, tc := range map[string]struct {
		tok  string
		want string
	}{
		"scheduler": {mint(TokenSpec{Sub: "s", Role: registry.RoleScheduler, TTL: time.Hour}), "only agent tokens"},
		"unbound":   {mint(TokenSpec{Sub: "a", Role: registry.RoleAgent, TTL: time.Hour}), "not bound to addresses"},
		"no jti": {handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"},
			map[string]any{"sub": "a", "role": "agent", "ips": []string{"10.0.0.1"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}), `no "jti"`},
		"expired": {handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"},
			map[string]any{"sub": "a", "role": "agent", "jti": "x", "ips": []string{"10.0.0.1"}, "iat": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(-time.Hour).Unix()}), "expired"},
		"lineage without its start": {handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"},
			map[string]any{"sub": "a", "role": "agent", "jti": "x", "lid": "y", "ips": []string{"10.0.0.1"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}), `"lat"`},
		"lineage start without a lineage": {handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"},
			map[string]any{"sub": "a", "role": "agent", "jti": "x", "lat": now.Unix(), "ips": []string{"10.0.0.1"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}), `"lid"`},
		"too early": {mint(TokenSpec{Sub: "a", Role: registry.RoleAgent, TTL: 3 * time.Hour, IPs: []string{"10.0.0.1"}}), "once half its lifetime is over"},
		"lineage begun after the token": {handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"},
			map[string]any{"sub": "a", "role": "agent", "jti": "x", "lid": "y", "lat": now.Add(time.Hour).Unix(), "ips": []string{"10.0.0.1"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}), `"lat"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := v.Renewal(tc.tok)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// A token of another issuer is not renewed: its lifetime and its
// revocation are that issuer's, and a renewal signed here would escape
// both.
func TestRenewalRefusesOtherIssuers(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := newClock(now.Add(8 * time.Minute))
	v, err := NewVerifier(Config{Secret: secret, PublicKeys: []crypto.PublicKey{&key.PublicKey}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodES256, key, jwt.MapClaims{"sub": "a", "role": "agent", "jti": "idp-1",
		"ips": []string{"10.0.0.1"}, "iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()})
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("the issuer's token itself: %v", err)
	}
	var re *RenewalError
	if _, err := v.Renewal(tok); !errors.As(err, &re) || !strings.Contains(re.Reason, "HS256") {
		t.Fatalf("renewing another issuer's token: %v", err)
	}
}
