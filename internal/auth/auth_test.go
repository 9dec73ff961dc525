package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/registryd/registryd/internal/registry"
)

var (
	secret = []byte("0123456789abcdef0123456789abcdef-test")
	now    = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
)

// handMade builds an HS256 token without the JWT library, the way an
// operator's script would: proof that the format is the standard one.
func handMade(key []byte, header, claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(header) + "." + enc(claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func claimsAt(role string, exp time.Time) map[string]any {
	return map[string]any{"sub": "agent-7", "role": role, "exp": exp.Unix(), "iat": now.Unix()}
}

func sign(t *testing.T, method jwt.SigningMethod, key any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pemOf(t *testing.T, keys ...crypto.PublicKey) []byte {
	t.Helper()
	var out []byte
	for _, k := range keys {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out
}

func TestVerify(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	pubPEM := pemOf(t, &rsaKey.PublicKey, &ecKey.PublicKey, edPub)
	pubs, err := ParsePublicKeys(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return now }
	v, err := NewVerifier(Config{Secret: secret, PublicKeys: pubs, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour)
	good := jwt.MapClaims{"sub": "agent-7", "role": "agent", "exp": exp.Unix()}
	with := func(k string, val any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for kk, vv := range good {
			c[kk] = vv
		}
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	signed, _ := Signer{Secret: secret}.Sign("agent-7", registry.RoleAgent, time.Hour, now)

	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"our own signer", signed, true},
		{"hand-made HS256", handMade(secret, map[string]any{"alg": "HS256", "typ": "JWT"}, claimsAt("agent", exp)), true},
		{"RS256 from an identity provider", sign(t, jwt.SigningMethodRS256, rsaKey, good), true},
		{"PS384", sign(t, jwt.SigningMethodPS384, rsaKey, good), true},
		{"ES256", sign(t, jwt.SigningMethodES256, ecKey, good), true},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, edPriv, good), true},
		{"expired within leeway", sign(t, jwt.SigningMethodHS256, secret, with("exp", now.Add(-30*time.Second).Unix())), true},
		{"nbf within leeway", sign(t, jwt.SigningMethodHS256, secret, with("nbf", now.Add(30*time.Second).Unix())), true},

		{"alg none", handMadeNone(claimsAt("admin", exp)), false},
		{"wrong secret", sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-0000"), good), false},
		{"HS384 with the right secret (algorithm not pinned)", sign(t, jwt.SigningMethodHS384, secret, good), false},
		{"HS/RS confusion: public key PEM as HMAC secret", handMade(pubPEM, map[string]any{"alg": "HS256"}, claimsAt("admin", exp)), false},
		{"HS/RS confusion: DER public key as HMAC secret", sign(t, jwt.SigningMethodHS256, mustDER(t, &rsaKey.PublicKey), good), false},
		{"RS256 by an unknown key", sign(t, jwt.SigningMethodRS256, otherRSA, good), false},
		{"ES384 header on a P-256 key", mustSignES384Header(t, ecKey, good), false},
		{"expired", sign(t, jwt.SigningMethodHS256, secret, with("exp", now.Add(-61*time.Second).Unix())), false},
		{"not valid yet", sign(t, jwt.SigningMethodHS256, secret, with("nbf", now.Add(2*time.Minute).Unix())), false},
		{"issued in the future", sign(t, jwt.SigningMethodHS256, secret, with("iat", now.Add(2*time.Minute).Unix())), false},
		{"missing exp", sign(t, jwt.SigningMethodHS256, secret, with("exp", nil)), false},
		{"unknown role", sign(t, jwt.SigningMethodHS256, secret, with("role", "root")), false},
		{"missing role", sign(t, jwt.SigningMethodHS256, secret, with("role", nil)), false},
		{"missing sub", sign(t, jwt.SigningMethodHS256, secret, with("sub", nil)), false},
		{"role of the wrong type", sign(t, jwt.SigningMethodHS256, secret, with("role", 1)), false},
		{"tampered payload", tamper(signed), false},
		{"garbage", "not.a.token", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Verify(tc.token)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if p.Sub != "agent-7" || p.Role != registry.RoleAgent {
					t.Errorf("principal %+v", p)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %+v", p)
			}
			if _, ok := err.(*TokenError); !ok {
				t.Errorf("error %T, want *TokenError", err)
			}
			if tc.token != "" && strings.Contains(err.Error(), tc.token) {
				t.Errorf("error contains the token")
			}
		})
	}
}

func handMadeNone(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]any{"alg": "none"}) + "." + enc(claims) + "."
}

func mustDER(t *testing.T, k crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// mustSignES384Header signs with P-256 but claims ES384, which the
// verifier must not try against P-256 keys.
func mustSignES384Header(t *testing.T, k *ecdsa.PrivateKey, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, c)
	tok.Header["alg"] = "ES384"
	s, err := tok.SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	b, _ := base64.RawURLEncoding.DecodeString(parts[1])
	b = []byte(strings.Replace(string(b), `"agent"`, `"admin"`, 1))
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestIssuerAndAudience(t *testing.T) {
	v, err := NewVerifier(Config{Secret: secret, Issuer: "https://idp.example", Audience: "registryd", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(iss, aud string) string {
		tok, err := Signer{Secret: secret, Issuer: iss, Audience: aud}.Sign("s", registry.RoleReader, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if _, err := v.Verify(mk("https://idp.example", "registryd")); err != nil {
		t.Errorf("right iss and aud refused: %v", err)
	}
	for _, tok := range []string{mk("https://evil.example", "registryd"), mk("https://idp.example", "other"), mk("", "")} {
		if _, err := v.Verify(tok); err == nil {
			t.Errorf("wrong iss/aud accepted")
		}
	}
}

func TestNewVerifierRefusesWeakConfig(t *testing.T) {
	if _, err := NewVerifier(Config{}); err != ErrNoKeys {
		t.Errorf("no keys: %v", err)
	}
	if _, err := NewVerifier(Config{Secret: []byte("short")}); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
	if _, err := (Signer{Secret: secret}).Sign("s", "root", time.Hour, now); err == nil {
		t.Error("signed an unknown role")
	}
	if _, err := (Signer{Secret: secret}).Sign("", registry.RoleAdmin, time.Hour, now); err == nil {
		t.Error("signed an empty subject")
	}
}

func TestParsePublicKeys(t *testing.T) {
	if _, err := ParsePublicKeys([]byte("no pem here")); err == nil {
		t.Error("accepted a file without keys")
	}
	priv, _ := rsa.GenerateKey(rand.Reader, 2048)
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(priv)})
	if _, err := ParsePublicKeys(privPEM); err == nil {
		t.Error("accepted a private key as a public one")
	}
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&priv.PublicKey)})
	if keys, err := ParsePublicKeys(pkcs1); err != nil || len(keys) != 1 {
		t.Errorf("PKCS #1 public key: %v", err)
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "jwt-secret")
	s1, created, err := LoadOrCreateSecret(path)
	if err != nil || !created || len(s1) < MinSecretBytes {
		t.Fatalf("create: %v %v %d", err, created, len(s1))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file mode %v, %v", fi.Mode(), err)
	}
	s2, created, err := LoadOrCreateSecret(path)
	if err != nil || created || string(s1) != string(s2) {
		t.Fatalf("reuse: %v %v", err, created)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, _, err := LoadOrCreateSecret(short); err == nil {
		t.Error("accepted a short secret file")
	}
}
