package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/registryd/registryd/internal/registry"
)

// rawToken signs header and claims exactly as written, byte for byte: the
// only way to make the duplicate members and odd types these tests need.
func rawToken(key []byte, header, claims string) string {
	s := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(s))
	return s + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// Finding 8 of issue 8: tokens the JWT library accepts but that must not
// be. Each refused case has an accepted twin that differs only in the
// flaw, so the refusal is for the flaw and nothing else.
func TestVerifyRefusesLenientTokens(t *testing.T) {
	v, err := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour).Unix()
	iat := now.Unix()
	const hs = `{"alg":"HS256","typ":"JWT"}`
	claims := func(extra string) string {
		return fmt.Sprintf(`{"sub":"agent-7","role":"agent","iat":%d,"exp":%d%s}`, iat, exp, extra)
	}
	good := rawToken(secret, hs, claims(""))
	for _, tc := range []struct {
		name, token, twin, reason string
	}{
		{"crit naming an unknown extension",
			rawToken(secret, `{"alg":"HS256","crit":["x-registry-ext"],"x-registry-ext":true}`, claims("")),
			rawToken(secret, `{"alg":"HS256","x-registry-ext":true}`, claims("")), `"crit"`},
		{"crit naming a registered claim", rawToken(secret, `{"alg":"HS256","crit":["exp"]}`, claims("")), good, `"crit"`},
		{"empty crit", rawToken(secret, `{"alg":"HS256","crit":[]}`, claims("")), good, `"crit"`},
		{"exp as a string",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","iat":%d,"exp":"%d"}`, iat, exp)), good, `"exp" claim must be a JSON number`},
		{"nbf as a string", rawToken(secret, hs, claims(fmt.Sprintf(`,"nbf":"%d"`, iat))),
			rawToken(secret, hs, claims(fmt.Sprintf(`,"nbf":%d`, iat))), `"nbf" claim must be a JSON number`},
		{"iat as a string",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","iat":"%d","exp":%d}`, iat, exp)), good, `"iat" claim must be a JSON number`},
		{"duplicate role, last one admin",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","role":"admin","iat":%d,"exp":%d}`, iat, exp)), good, `"role" twice`},
		{"duplicate role spelled with an escape",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","r\u006fle":"admin","iat":%d,"exp":%d}`, iat, exp)), good, `"role" twice`},
		{"duplicate sub", rawToken(secret, hs, fmt.Sprintf(`{"sub":"x","sub":"agent-7","role":"agent","iat":%d,"exp":%d}`, iat, exp)), good, `"sub" twice`},
		{"duplicate exp", rawToken(secret, hs, claims(fmt.Sprintf(`,"exp":%d`, exp+10))), good, `"exp" twice`},
		{"duplicate member deep inside a claim", rawToken(secret, hs, claims(`,"ext":{"a":[{"b":1,"b":2}]}`)),
			rawToken(secret, hs, claims(`,"ext":{"a":[{"b":1,"c":2}]}`)), `"b" twice`},
		{"duplicate alg in the header", rawToken(secret, `{"alg":"none","alg":"HS256"}`, claims("")), good, `"alg" twice`},
		{"lone surrogate in sub",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7\ud800","role":"agent","iat":%d,"exp":%d}`, iat, exp)),
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7\ud83d\ude00","role":"agent","iat":%d,"exp":%d}`, iat, exp)), "surrogate"},
		{"lone low surrogate in sub",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7\udc00","role":"agent","iat":%d,"exp":%d}`, iat, exp)), good, "surrogate"},
		{"high surrogate before another escape",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7\ud800\u0041","role":"agent","iat":%d,"exp":%d}`, iat, exp)),
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7\\ud800\u0041","role":"agent","iat":%d,"exp":%d}`, iat, exp)), "surrogate"},
		{"nesting 20 deep", rawToken(secret, hs, claims(`,"x":`+strings.Repeat("[", 20)+strings.Repeat("]", 20))),
			rawToken(secret, hs, claims(`,"x":`+strings.Repeat("[", 10)+strings.Repeat("]", 10))), "nests deeper"},
		{"invalid UTF-8 in sub",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7`+"\xff"+`","role":"agent","iat":%d,"exp":%d}`, iat, exp)), good, "UTF-8"},
		{"data after the claims object", rawToken(secret, hs, claims("")+` {}`), good, "not valid JSON"},
		{"aud as a number", rawToken(secret, hs, claims(`,"aud":7`)), rawToken(secret, hs, claims(`,"aud":["x"]`)), `"aud" claim must be`},
		{"jti as a number", rawToken(secret, hs, claims(`,"jti":7`)), rawToken(secret, hs, claims(`,"jti":"7"`)), `"jti" claim must be a string`},
		{"typ as a number", rawToken(secret, `{"alg":"HS256","typ":1}`, claims("")), good, `"typ" must be a string`},
		// The jti is looked up in the revocation list and shown in logs.
		{"jti with a control character", rawToken(secret, hs, claims(`,"jti":"a\u0007b"`)),
			rawToken(secret, hs, claims(`,"jti":"ab"`)), `"jti" claim must not contain control characters`},
		{"jti of 201 characters", rawToken(secret, hs, claims(`,"jti":"`+strings.Repeat("j", 201)+`"`)),
			rawToken(secret, hs, claims(`,"jti":"`+strings.Repeat("j", 200)+`"`)), `"jti" claim must be at most 200 characters`},
		{"longer than 16 KiB", rawToken(secret, hs, claims(`,"x":"`+strings.Repeat("x", MaxTokenBytes)+`"`)),
			rawToken(secret, hs, claims(`,"x":"`+strings.Repeat("x", MaxTokenBytes/2)+`"`)), "longer than 16384 bytes"},
		{"padded segment", strings.Replace(good, ".", "=.", 1), good, "base64url"},
		// encoding/json reads member names without regard to case.
		{"role differing in case, after role",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","Role":"admin","iat":%d,"exp":%d}`, iat, exp)), good, `"Role" differs from "role" only in case`},
		{"sub spelled with a long s",
			rawToken(secret, hs, fmt.Sprintf(`{"ſub":"agent-7","role":"agent","iat":%d,"exp":%d}`, iat, exp)), good, "only in case"},
		{"EXP as a string",
			rawToken(secret, hs, fmt.Sprintf(`{"sub":"agent-7","role":"agent","iat":%d,"exp":%d,"EXP":"%d"}`, iat, exp, exp)), good, "only in case"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := v.Verify(tc.twin); err != nil {
				t.Fatalf("the twin without the flaw is refused: %v", err)
			}
			p, err := v.Verify(tc.token)
			if err == nil {
				t.Fatalf("accepted as %+v", p)
			}
			if _, ok := err.(*TokenError); !ok {
				t.Errorf("error %T, want *TokenError", err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("reason %q does not say %q", err, tc.reason)
			}
		})
	}
}

// A token may not outlive its role's cap, however it was minted: counted
// from iat, or from now when it has none.
func TestVerifyCapsLifetime(t *testing.T) {
	clock := func() time.Time { return now }
	mk := func(role string, iat *time.Time, exp time.Time) string {
		c := fmt.Sprintf(`{"sub":"s","role":%q,"exp":%d`, role, exp.Unix())
		if iat != nil {
			c += fmt.Sprintf(`,"iat":%d`, iat.Unix())
		}
		return rawToken(secret, `{"alg":"HS256"}`, c+"}")
	}
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	defaults, _ := NewVerifier(Config{Secret: secret, Now: clock})
	raised, _ := NewVerifier(Config{Secret: secret, Now: clock, Lifetimes: Lifetimes{Max: 365 * 24 * time.Hour, Admin: 7 * 24 * time.Hour}})
	day := 24 * time.Hour
	for _, tc := range []struct {
		name    string
		v       *Verifier
		token   string
		ok      bool
		because string
	}{
		{"agent, 89 days", defaults, mk("agent", at(0), now.Add(89*day)), true, ""},
		{"agent, 90 days", defaults, mk("agent", at(0), now.Add(90*day)), true, ""},
		{"agent, 91 days", defaults, mk("agent", at(0), now.Add(91*day)), false, "2160h"},
		{"reader, 100 years", defaults, mk("reader", at(0), now.Add(100*365*day)), false, "lives longer"},
		{"admin, 24 hours", defaults, mk("admin", at(0), now.Add(day)), true, ""},
		{"admin, 25 hours", defaults, mk("admin", at(0), now.Add(25*time.Hour)), false, "24h"},
		{"admin minted 30 days ago, valid 2 more hours", defaults, mk("admin", at(-30*day), now.Add(2*time.Hour)), false, "lives longer"},
		{"admin without iat, 2 hours left", defaults, mk("admin", nil, now.Add(2*time.Hour)), true, ""},
		{"admin without iat, 30 days left", defaults, mk("admin", nil, now.Add(30*day)), false, "lives longer"},
		{"admin, 7 days under a raised cap", raised, mk("admin", at(0), now.Add(7*day)), true, ""},
		{"agent, 300 days under a raised cap", raised, mk("agent", at(0), now.Add(300*day)), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.v.Verify(tc.token)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("accepted")
			case !tc.ok && !strings.Contains(err.Error(), tc.because):
				t.Errorf("reason %q does not say %q", err, tc.because)
			}
		})
	}
}

// Agent tokens may be bound to addresses, by registryd or by an identity
// provider; other roles may not carry the claim.
func TestBoundTokens(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	pubs, err := ParsePublicKeys(pemOf(t, &rsaKey.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return now }
	v, _ := NewVerifier(Config{Secret: secret, PublicKeys: pubs, Now: clock})
	strict, _ := NewVerifier(Config{Secret: secret, PublicKeys: pubs, Now: clock, RequireAgentIPs: true})
	s := Signer{Secret: secret}

	m, err := s.Mint(TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.7", "::ffff:10.1.0.0/120"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*Verifier{v, strict} {
		p, err := v.Verify(m.Token)
		if err != nil {
			t.Fatal(err)
		}
		if got := registry.FormatIPSet(p.IPs); got != "10.0.0.7, 10.1.0.0/24" {
			t.Errorf("principal bound to %q", got)
		}
	}
	// The claim holds the canonical spellings.
	claims, _ := CheckCompact(m.Token)
	if got := string(claims["ips"]); got != `["10.0.0.7","10.1.0.0/24"]` {
		t.Errorf("ips claim %s", got)
	}

	unbound, _ := s.Sign("agent-7", registry.RoleAgent, time.Hour, now)
	if p, err := v.Verify(unbound); err != nil || p.IPs != nil {
		t.Errorf("unbound agent: %+v %v", p, err)
	}
	if _, err := strict.Verify(unbound); err == nil || !strings.Contains(err.Error(), "REGISTRY_AGENT_REQUIRE_IP") {
		t.Errorf("unbound agent with REQUIRE_IP: %v", err)
	}
	reader, _ := s.Sign("r", registry.RoleReader, time.Hour, now)
	if _, err := strict.Verify(reader); err != nil {
		t.Errorf("REQUIRE_IP refused a reader: %v", err)
	}

	// An identity provider's token carries the same claim.
	idp := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, rsaKey, c) }
	p, err := strict.Verify(idp(jwt.MapClaims{"sub": "agent-9", "role": "agent", "exp": now.Add(time.Hour).Unix(), "ips": []string{"2001:db8::/64"}}))
	if err != nil || registry.FormatIPSet(p.IPs) != "2001:db8::/64" {
		t.Errorf("identity-provider token with ips: %+v %v", p, err)
	}
	if _, err := strict.Verify(idp(jwt.MapClaims{"sub": "agent-9", "role": "agent", "exp": now.Add(time.Hour).Unix()})); err == nil {
		t.Error("identity-provider agent token without ips accepted under REQUIRE_IP")
	}
	if _, err := v.Verify(idp(jwt.MapClaims{"sub": "s", "role": "scheduler", "exp": now.Add(time.Hour).Unix(), "ips": []string{"10.0.0.1"}})); err == nil {
		t.Error("a scheduler token with ips accepted")
	}

	// Minting refuses what verification would.
	for _, spec := range []TokenSpec{
		{Sub: "r", Role: registry.RoleReader, TTL: time.Hour, IPs: []string{"10.0.0.1"}},
		{Sub: "a", Role: registry.RoleAdmin, TTL: time.Hour, IPs: []string{"10.0.0.1"}},
		{Sub: "a", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.1/8"}},
		{Sub: "a", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{}},
		{Sub: "a", Role: registry.RoleAgent, TTL: 91 * 24 * time.Hour},
		{Sub: "a", Role: registry.RoleAdmin, TTL: 25 * time.Hour},
	} {
		if _, err := s.Mint(spec, now); err == nil {
			t.Errorf("minted %+v", spec)
		}
	}
}

// Every minted token has its own id, for revoking it alone.
func TestMintedTokenIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		m, err := Signer{Secret: secret}.Mint(TokenSpec{Sub: "s", Role: registry.RoleReader, TTL: time.Hour}, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.ID) < 20 || seen[m.ID] {
			t.Fatalf("id %q (seen before: %v)", m.ID, seen[m.ID])
		}
		seen[m.ID] = true
		if c, _ := CheckCompact(m.Token); string(c["jti"]) != `"`+m.ID+`"` {
			t.Fatalf("jti claim %s, id %s", c["jti"], m.ID)
		}
	}
}

// revocations is a fixed answer for the verifier, standing in for the
// in-memory list (internal/revoke has the real one's tests).
type revocations struct {
	revoked   bool
	err       error
	sub, jti  string
	iat       *time.Time
	consulted int
}

func (r *revocations) Revoked(sub, jti string, iat *time.Time) (bool, error) {
	r.consulted++
	r.sub, r.jti, r.iat = sub, jti, iat
	return r.revoked, r.err
}

func TestVerifyConsultsRevocations(t *testing.T) {
	list := &revocations{}
	v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, Revocations: list})
	m, _ := Signer{Secret: secret}.Mint(TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour}, now)
	if _, err := v.Verify(m.Token); err != nil {
		t.Fatal(err)
	}
	if list.sub != "agent-7" || list.jti != m.ID || list.iat == nil || !list.iat.Equal(now.Truncate(time.Second)) {
		t.Errorf("asked about sub %q jti %q iat %v", list.sub, list.jti, list.iat)
	}
	list.revoked = true
	if _, err := v.Verify(m.Token); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("revoked token: %v", err)
	}
	// A token without iat: the list hears "unknown".
	noIat := rawToken(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"s","role":"reader","exp":%d}`, now.Add(time.Hour).Unix()))
	v.Verify(noIat)
	if list.iat != nil {
		t.Errorf("iat %v for a token without one", list.iat)
	}
	// A forged token never reaches the list.
	list.consulted = 0
	v.Verify(rawToken([]byte("another-secret-another-secret-0000"), `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"s","role":"reader","exp":%d}`, now.Add(time.Hour).Unix())))
	if list.consulted != 0 {
		t.Error("the revocation list was consulted for a token with a bad signature")
	}
	// Not loaded: fail closed, and say it is not the token's fault.
	list.revoked, list.err = false, fmt.Errorf("not loaded: %w", registry.ErrUnavailable)
	_, err := v.Verify(m.Token)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("list not loaded: %v", err)
	}
	if _, ok := err.(*TokenError); ok {
		t.Error("list not loaded is reported as a bad token")
	}
}
