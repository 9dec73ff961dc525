// Package auth verifies and mints the bearer tokens (JWT) that every API
// request carries. Algorithms are pinned per key type: an HMAC secret only
// verifies HS256, RSA keys only RS*/PS*, ECDSA keys only the ES* of their
// curve, Ed25519 keys only EdDSA. "none" never verifies.
package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/registryd/registryd/internal/registry"
)

// MinSecretBytes is the shortest HS256 secret accepted: a shorter key is
// guessable offline from any token.
const MinSecretBytes = 32

// Leeway is the clock skew tolerated on exp, nbf and iat.
const Leeway = 60 * time.Second

// Config holds the keys and checks a Verifier applies.
type Config struct {
	Secret     []byte             // HS256 key; optional when PublicKeys is set
	PublicKeys []crypto.PublicKey // RSA, ECDSA or Ed25519 keys of external issuers
	Issuer     string             // required "iss" when set
	Audience   string             // required in "aud" when set
	Now        func() time.Time   // clock; time.Now when nil
}

// Verifier checks bearer tokens.
type Verifier struct {
	cfg     Config
	parser  *jwt.Parser
	rsa     []jwt.VerificationKey
	ecdsa   map[string][]jwt.VerificationKey // by alg
	ed25519 []jwt.VerificationKey
}

// ErrNoKeys means neither a secret nor public keys are configured.
var ErrNoKeys = errors.New("auth: no token keys configured (set REGISTRY_JWT_SECRET, REGISTRY_JWT_SECRET_FILE or REGISTRY_JWT_PUBLIC_KEYS)")

// NewVerifier validates cfg and prepares a Verifier.
func NewVerifier(cfg Config) (*Verifier, error) {
	if cfg.Secret == nil && len(cfg.PublicKeys) == 0 {
		return nil, ErrNoKeys
	}
	if cfg.Secret != nil && len(cfg.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("auth: the JWT secret is %d bytes; it must be at least %d", len(cfg.Secret), MinSecretBytes)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	v := &Verifier{cfg: cfg, ecdsa: map[string][]jwt.VerificationKey{}}
	var methods []string
	if cfg.Secret != nil {
		methods = append(methods, "HS256")
	}
	for _, k := range cfg.PublicKeys {
		switch k := k.(type) {
		case *rsa.PublicKey:
			if len(v.rsa) == 0 {
				methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
			}
			v.rsa = append(v.rsa, k)
		case *ecdsa.PublicKey:
			alg, ok := map[elliptic.Curve]string{elliptic.P256(): "ES256", elliptic.P384(): "ES384", elliptic.P521(): "ES512"}[k.Curve]
			if !ok {
				return nil, errors.New("auth: unsupported ECDSA curve")
			}
			if len(v.ecdsa[alg]) == 0 {
				methods = append(methods, alg)
			}
			v.ecdsa[alg] = append(v.ecdsa[alg], k)
		case ed25519.PublicKey:
			if len(v.ed25519) == 0 {
				methods = append(methods, "EdDSA")
			}
			v.ed25519 = append(v.ed25519, k)
		default:
			return nil, fmt.Errorf("auth: unsupported public key type %T", k)
		}
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(Leeway),
		jwt.WithTimeFunc(func() time.Time { return v.cfg.Now() }),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// claims is what registryd reads from a token.
type claims struct {
	Role string `json:"role"`
	jwt.RegisteredClaims
}

// TokenError says why a token was refused, in words safe to show the
// caller: it never contains the token.
type TokenError struct{ Reason string }

func (e *TokenError) Error() string { return "invalid token: " + e.Reason }

// Verify checks raw and returns its principal, or a *TokenError.
func (v *Verifier) Verify(raw string) (registry.Principal, error) {
	var c claims
	_, err := v.parser.ParseWithClaims(raw, &c, v.key)
	if err != nil {
		return registry.Principal{}, &TokenError{Reason: reason(err)}
	}
	if c.Subject == "" {
		return registry.Principal{}, &TokenError{Reason: `the "sub" claim is missing`}
	}
	// The subject becomes a node's owner and lands in logs and the audit
	// log: it must be a printable label of sane length.
	if msg := registry.CheckLabel(c.Subject, registry.MaxPrincipalLen); msg != "" {
		return registry.Principal{}, &TokenError{Reason: `the "sub" claim ` + msg}
	}
	role, ok := registry.ParseRole(c.Role)
	if !ok {
		return registry.Principal{}, &TokenError{Reason: `the "role" claim must be one of admin, scheduler, agent, reader`}
	}
	return registry.Principal{Sub: c.Subject, Role: role}, nil
}

// key picks the keys that may verify t, by its algorithm's key type, so a
// public key is never used as an HMAC secret (the HS/RS confusion).
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if v.cfg.Secret != nil {
			return v.cfg.Secret, nil
		}
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		if len(v.rsa) > 0 {
			return jwt.VerificationKeySet{Keys: v.rsa}, nil
		}
	case *jwt.SigningMethodECDSA:
		if keys := v.ecdsa[t.Method.Alg()]; len(keys) > 0 {
			return jwt.VerificationKeySet{Keys: keys}, nil
		}
	case *jwt.SigningMethodEd25519:
		if len(v.ed25519) > 0 {
			return jwt.VerificationKeySet{Keys: v.ed25519}, nil
		}
	}
	return nil, jwt.ErrTokenUnverifiable
}

func reason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "the token is malformed"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "the signature does not verify, or the algorithm is not accepted"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return `the "exp" claim is missing`
	case errors.Is(err, jwt.ErrTokenExpired):
		return "the token has expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "the token is not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "the token has the wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "the token has the wrong audience"
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return "the token's claims are invalid"
	}
	return "the token cannot be verified"
}

// Signer mints HS256 tokens with the shared secret.
type Signer struct {
	Secret   []byte
	Issuer   string
	Audience string
}

// Sign returns a token for sub with role, valid for ttl from now.
func (s Signer) Sign(sub string, role registry.Role, ttl time.Duration, now time.Time) (string, error) {
	if len(s.Secret) < MinSecretBytes {
		return "", fmt.Errorf("auth: the JWT secret must be at least %d bytes", MinSecretBytes)
	}
	if sub == "" {
		return "", errors.New("auth: the subject must not be empty")
	}
	if msg := registry.CheckLabel(sub, registry.MaxPrincipalLen); msg != "" {
		return "", errors.New("auth: the subject " + msg)
	}
	if _, ok := registry.ParseRole(string(role)); !ok {
		return "", fmt.Errorf("auth: unknown role %q (want admin, scheduler, agent or reader)", role)
	}
	if ttl <= 0 {
		return "", errors.New("auth: the lifetime must be positive")
	}
	c := claims{Role: string(role), RegisteredClaims: jwt.RegisteredClaims{
		Subject:   sub,
		Issuer:    s.Issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	if s.Audience != "" {
		c.Audience = jwt.ClaimStrings{s.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(s.Secret)
}

// ParsePublicKeys reads every PUBLIC KEY (PKIX) or RSA PUBLIC KEY (PKCS #1)
// block of a PEM file. Certificates are accepted too; their key is used.
func ParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var k any
		var err error
		switch block.Type {
		case "PUBLIC KEY":
			k, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			k, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				k = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("auth: PEM block %q is not a public key", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("auth: parse %s: %w", block.Type, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("auth: no PEM public keys found")
	}
	return keys, nil
}

// LoadOrCreateSecret returns the secret kept in path, creating it (0600,
// 32 random bytes as 64 hex characters) when the file does not exist yet.
// created reports whether this call made it.
func LoadOrCreateSecret(path string) (secret []byte, created bool, err error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s := []byte(strings.TrimSpace(string(b)))
		if len(s) < MinSecretBytes {
			return nil, false, fmt.Errorf("auth: %s holds a secret shorter than %d bytes", path, MinSecretBytes)
		}
		return s, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("auth: read secret: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, false, err
	}
	s := []byte(hex.EncodeToString(raw))
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, false, fmt.Errorf("auth: create secret: %w", err)
	}
	// O_EXCL: two processes starting at once must not both write a secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return LoadOrCreateSecret(path)
	}
	if err != nil {
		return nil, false, fmt.Errorf("auth: create secret: %w", err)
	}
	if _, err := f.Write(append(s, '\n')); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("auth: write secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("auth: write secret: %w", err)
	}
	return s, true, nil
}
