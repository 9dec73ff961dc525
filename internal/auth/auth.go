// Package auth verifies and mints the bearer tokens (JWT) that every API
// request carries. Algorithms are pinned per key type: an HMAC secret only
// verifies HS256, RSA keys only RS*/PS*, ECDSA keys only the ES* of their
// curve, Ed25519 keys only EdDSA. "none" never verifies.
package auth

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/registryd/registryd/internal/registry"
)

// MinSecretBytes is the shortest HS256 secret accepted: a shorter key is
// guessable offline from any token.
const MinSecretBytes = 32

// Leeway is the clock skew tolerated on exp, nbf and iat.
const Leeway = 60 * time.Second

// The default caps on token lifetimes. Admin tokens can do everything, so
// a leaked one must die soon; agents and schedulers run unattended and get
// longer ones.
const (
	DefaultMaxTTL      = 90 * 24 * time.Hour
	DefaultAdminMaxTTL = 24 * time.Hour
)

// Lifetimes caps how long a token may live, by role.
type Lifetimes struct {
	Max   time.Duration // reader, scheduler and agent tokens; DefaultMaxTTL when 0
	Admin time.Duration // admin tokens; DefaultAdminMaxTTL when 0
}

// For returns the cap for role.
func (l Lifetimes) For(role registry.Role) time.Duration {
	if role == registry.RoleAdmin {
		return cmp.Or(l.Admin, DefaultAdminMaxTTL)
	}
	return cmp.Or(l.Max, DefaultMaxTTL)
}

// Longest returns the largest cap of any role: no token registryd accepts
// lives longer (plus Leeway).
func (l Lifetimes) Longest() time.Duration {
	return max(l.For(registry.RoleAdmin), l.For(registry.RoleAgent))
}

// LifetimeError means a token would live longer than its role's cap.
type LifetimeError struct {
	Role registry.Role
	TTL  time.Duration
	Max  time.Duration
}

func (e *LifetimeError) Error() string {
	return fmt.Sprintf("auth: a lifetime of %s exceeds the %s that %s tokens may have", FormatDuration(e.TTL), FormatDuration(e.Max), e.Role)
}

// FormatDuration prints d without the trailing zero units of
// time.Duration.String ("2160h", not "2160h0m0s").
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Revocations answers from memory whether a token was revoked, so that
// checking costs no query. *revoke.List implements it.
type Revocations interface {
	// Revoked reports whether the token of sub with id jti ("" when it has
	// none), issued at iat (nil when it carries no "iat"), is revoked. It
	// returns an error matching registry.ErrUnavailable while the list is
	// not loaded: no token is accepted before then.
	Revoked(sub, jti string, iat *time.Time) (bool, error)
}

// Config holds the keys and checks a Verifier applies.
type Config struct {
	Secret     []byte             // HS256 key; optional when PublicKeys is set
	PublicKeys []crypto.PublicKey // RSA, ECDSA or Ed25519 keys of external issuers
	Issuer     string             // required "iss" when set
	Audience   string             // required in "aud" when set
	Now        func() time.Time   // clock; time.Now when nil
	// Lifetimes refuses tokens that would live longer than their role's
	// cap (exp − iat, or exp − now without iat), wherever they came from.
	Lifetimes Lifetimes
	// RequireAgentIPs refuses agent tokens without an "ips" claim.
	RequireAgentIPs bool
	// Revocations, when set, refuses revoked tokens.
	Revocations Revocations
	// CacheSize is how many verified tokens the Verifier remembers (see
	// Verify); 0 remembers none.
	CacheSize int
}

// Verifier checks bearer tokens.
type Verifier struct {
	cfg     Config
	parser  *jwt.Parser
	rsa     []jwt.VerificationKey
	ecdsa   map[string][]jwt.VerificationKey // by alg
	ed25519 []jwt.VerificationKey
	cache   *tokenCache // nil: every token is verified in full
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
	v := &Verifier{cfg: cfg, ecdsa: map[string][]jwt.VerificationKey{}, cache: newTokenCache(cfg.CacheSize)}
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
	Role string    `json:"role"`
	IPs  *[]string `json:"ips,omitempty"`
	// Lineage ("lid") and LineageStart ("lat") are set on a renewed
	// token: the "jti" and "iat" of the token minted by hand that the
	// renewals descend from. Revoking that jti, or the subject's tokens
	// issued before a time after lat, revokes every renewal of it too.
	Lineage      string           `json:"lid,omitempty"`
	LineageStart *jwt.NumericDate `json:"lat,omitempty"`
	jwt.RegisteredClaims
}

// TokenError says why a token was refused, in words safe to show the
// caller: it never contains the token.
type TokenError struct{ Reason string }

func (e *TokenError) Error() string { return "invalid token: " + e.Reason }

// Verify checks raw and returns its principal, or a *TokenError. Before
// the signature it checks the token's shape strictly (see CheckCompact);
// after it, the claims registryd gives meaning to, the lifetime cap and
// the revocation list. An error that is not a *TokenError (the revocation
// list not loaded yet) matches registry.ErrUnavailable.
//
// With a cache (Config.CacheSize), a token that passed every check is
// remembered by its SHA-256, and its next uses skip the parsing and the
// signature, the costly part. Not the rest: every use checks the clock
// against its exp, nbf and iat (with Leeway, as the parser does) and the
// lifetime cap, and asks the revocation list again, so a token revoked or
// expired while cached is refused at its very next use. Refusals are not
// remembered: a token not valid yet (nbf) is accepted once it is, and
// tokens that fail to verify cannot fill the cache. The principal of a
// hit is shared between requests: its IPs must not be changed.
func (v *Verifier) Verify(raw string) (registry.Principal, error) {
	if v.cache == nil {
		e, err := v.verify(raw)
		if err != nil {
			return registry.Principal{}, err
		}
		return e.p, nil
	}
	key := sha256.Sum256([]byte(raw))
	if e := v.cache.get(&key); e != nil {
		if e.usableAt(v.cfg.Now()) {
			if err := v.checkRevoked(e); err != nil {
				return registry.Principal{}, err
			}
			return e.p, nil
		}
		// Expired (or the clock went back before nbf): verify it in full,
		// for the refusal's reason.
		v.cache.remove(&key, e)
	}
	e, err := v.verify(raw)
	if err != nil {
		return registry.Principal{}, err
	}
	v.cache.put(&key, &e)
	return e.p, nil
}

// checkRevoked asks the revocation list, when there is one, about the
// token e, and about the token minted by hand that it renews, if any: a
// renewal is revoked with its lineage (by its jti, or by a revocation of
// the subject's tokens issued after the lineage began).
func (v *Verifier) checkRevoked(e *verified) error {
	if v.cfg.Revocations == nil {
		return nil
	}
	revoked, err := v.cfg.Revocations.Revoked(e.p.Sub, e.jti, e.iat)
	if err == nil && !revoked && e.lid != "" {
		revoked, err = v.cfg.Revocations.Revoked(e.p.Sub, e.lid, e.lat)
	}
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if revoked {
		return &TokenError{Reason: "the token has been revoked"}
	}
	return nil
}

// verify checks raw in full (see Verify) and returns what a cache keeps.
func (v *Verifier) verify(raw string) (verified, error) {
	e, _, err := v.verifyClaims(raw)
	return e, err
}

// verifyClaims is verify, also returning the token's claims.
func (v *Verifier) verifyClaims(raw string) (verified, claims, error) {
	var c claims
	e, err := v.check(raw, &c)
	return e, c, err
}

func (v *Verifier) check(raw string, cp *claims) (verified, error) {
	if _, err := CheckCompact(raw); err != nil {
		return verified{}, err
	}
	c := cp
	tok, err := v.parser.ParseWithClaims(raw, c, v.key)
	if err != nil {
		return verified{}, &TokenError{Reason: reason(err)}
	}
	_, secret := tok.Method.(*jwt.SigningMethodHMAC)
	if c.Subject == "" {
		return verified{}, &TokenError{Reason: `the "sub" claim is missing`}
	}
	// The subject becomes a node's owner and lands in logs and the audit
	// log: it must be a printable label of sane length.
	if msg := registry.CheckLabel(c.Subject, registry.MaxPrincipalLen); msg != "" {
		return verified{}, &TokenError{Reason: `the "sub" claim ` + msg}
	}
	role, ok := registry.ParseRole(c.Role)
	if !ok {
		return verified{}, &TokenError{Reason: `the "role" claim must be one of admin, scheduler, agent, reader`}
	}
	if msg := registry.CheckLabel(c.ID, registry.MaxTokenIDLen); msg != "" {
		return verified{}, &TokenError{Reason: `the "jti" claim ` + msg}
	}
	if c.Lineage != "" || c.LineageStart != nil {
		if msg := registry.CheckLabel(c.Lineage, registry.MaxTokenIDLen); msg != "" || c.Lineage == "" {
			return verified{}, &TokenError{Reason: strings.TrimSuffix(`a renewed token needs a "lid" claim, a token id, with its "lat"; `+msg, "; ")}
		}
		// A renewal names when its lineage began, which is no later than
		// it was itself issued.
		if c.LineageStart == nil || c.IssuedAt == nil || c.LineageStart.After(c.IssuedAt.Time) {
			return verified{}, &TokenError{Reason: `a renewed token needs "lat" no later than its "iat"`}
		}
	}
	// A token minted before the cap, or by a careless script, must not
	// live for a century: measure from iat, or from now without one.
	start := v.cfg.Now()
	if c.IssuedAt != nil {
		start = c.IssuedAt.Time
	}
	if limit := v.cfg.Lifetimes.For(role); c.ExpiresAt.Sub(start) > limit+Leeway {
		return verified{}, &TokenError{Reason: fmt.Sprintf("the token lives longer than the %s that %s tokens may (exp - iat)", FormatDuration(limit), role)}
	}
	p := registry.Principal{Sub: c.Subject, Role: role, Token: registry.TokenInfo{
		ID: c.ID, Lineage: cmp.Or(c.Lineage, c.ID), Expires: c.ExpiresAt.Time}}
	if c.IssuedAt != nil {
		p.Token.Issued = c.IssuedAt.Time
	}
	switch {
	case c.IPs != nil && role != registry.RoleAgent:
		// A claim that would bind nothing is a mistake of whoever minted
		// the token; refusing says so instead of pretending it binds.
		return verified{}, &TokenError{Reason: `the "ips" claim binds agent tokens only; ` + string(role) + ` tokens may not carry it`}
	case c.IPs != nil:
		if p.IPs, err = registry.ParseIPSet(*c.IPs); err != nil {
			return verified{}, &TokenError{Reason: `the "ips" claim ` + err.Error()}
		}
	case role == registry.RoleAgent && v.cfg.RequireAgentIPs:
		return verified{}, &TokenError{Reason: `agent tokens must carry an "ips" claim binding them to their hosts (REGISTRY_AGENT_REQUIRE_IP is on)`}
	}
	e := verified{p: p, jti: c.ID, lid: c.Lineage, secret: secret, end: c.ExpiresAt.Add(Leeway)}
	if c.LineageStart != nil {
		e.lat = &c.LineageStart.Time
	}
	// The clock readings at which the parser's checks and the cap above
	// pass: now < exp+Leeway, now >= nbf-Leeway, now >= iat-Leeway, and
	// without iat, exp-now <= cap+Leeway.
	if c.IssuedAt != nil {
		e.iat = &c.IssuedAt.Time
		e.from = c.IssuedAt.Add(-Leeway)
	} else {
		e.from = c.ExpiresAt.Add(-v.cfg.Lifetimes.For(role) - Leeway)
	}
	if c.NotBefore != nil && c.NotBefore.Add(-Leeway).After(e.from) {
		e.from = c.NotBefore.Add(-Leeway)
	}
	if err := v.checkRevoked(&e); err != nil {
		return verified{}, err
	}
	return e, nil
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
	Secret    []byte
	Issuer    string
	Audience  string
	Lifetimes Lifetimes // a longer TTL is refused with a *LifetimeError
}

// TokenSpec is what a minted token says.
type TokenSpec struct {
	Sub  string
	Role registry.Role
	TTL  time.Duration
	// IPs binds an agent token to addresses or CIDR prefixes (the "ips"
	// claim); only agent tokens may carry it.
	IPs []string
	// Lineage and LineageStart, set together, make the token a renewal
	// of the token minted by hand whose jti and iat they are (see
	// Verifier.Renewal).
	Lineage      string
	LineageStart time.Time
}

// Minted is a signed token and what is needed to manage it.
type Minted struct {
	Token   string
	ID      string // the "jti", for `registryd token revoke --jti`
	Expires time.Time
}

// Sign returns a token for sub with role, valid for ttl from now.
func (s Signer) Sign(sub string, role registry.Role, ttl time.Duration, now time.Time) (string, error) {
	m, err := s.Mint(TokenSpec{Sub: sub, Role: role, TTL: ttl}, now)
	return m.Token, err
}

// Mint signs a token as spec says, issued now, with a random "jti".
func (s Signer) Mint(spec TokenSpec, now time.Time) (Minted, error) {
	if len(s.Secret) < MinSecretBytes {
		return Minted{}, fmt.Errorf("auth: the JWT secret must be at least %d bytes", MinSecretBytes)
	}
	if spec.Sub == "" {
		return Minted{}, errors.New("auth: the subject must not be empty")
	}
	if msg := registry.CheckLabel(spec.Sub, registry.MaxPrincipalLen); msg != "" {
		return Minted{}, errors.New("auth: the subject " + msg)
	}
	if _, ok := registry.ParseRole(string(spec.Role)); !ok {
		return Minted{}, fmt.Errorf("auth: unknown role %q (want admin, scheduler, agent or reader)", spec.Role)
	}
	if spec.TTL <= 0 {
		return Minted{}, errors.New("auth: the lifetime must be positive")
	}
	if limit := s.Lifetimes.For(spec.Role); spec.TTL > limit {
		return Minted{}, &LifetimeError{Role: spec.Role, TTL: spec.TTL, Max: limit}
	}
	var ips *[]string
	if spec.IPs != nil {
		if spec.Role != registry.RoleAgent {
			return Minted{}, fmt.Errorf("auth: only agent tokens are bound to addresses; a %s token may not be", spec.Role)
		}
		set, err := registry.ParseIPSet(spec.IPs)
		if err != nil {
			return Minted{}, fmt.Errorf("auth: the addresses: %w", err)
		}
		canon := make([]string, len(set))
		for i := range set {
			canon[i] = registry.FormatIPSet(set[i : i+1])
		}
		ips = &canon
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Minted{}, err
	}
	exp := now.Add(spec.TTL)
	c := claims{Role: string(spec.Role), IPs: ips, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   spec.Sub,
		Issuer:    s.Issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(exp),
		ID:        base64.RawURLEncoding.EncodeToString(id[:]),
	}}
	if s.Audience != "" {
		c.Audience = jwt.ClaimStrings{s.Audience}
	}
	if spec.Lineage != "" {
		if spec.LineageStart.IsZero() || spec.LineageStart.After(now.Add(Leeway)) {
			return Minted{}, errors.New("auth: a renewal's lineage must have begun before now")
		}
		// A clock a little ahead where the lineage began: it began now.
		start := spec.LineageStart
		if start.After(now) {
			start = now
		}
		c.Lineage, c.LineageStart = spec.Lineage, jwt.NewNumericDate(start)
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(s.Secret)
	if err != nil {
		return Minted{}, fmt.Errorf("auth: sign: %w", err)
	}
	return Minted{Token: tok, ID: c.ID, Expires: c.ExpiresAt.Time}, nil
}

// RenewalError says why a token may not be renewed, in words safe to show
// its bearer.
type RenewalError struct{ Reason string }

func (e *RenewalError) Error() string { return "the token cannot be renewed: " + e.Reason }

// Renewal verifies raw in full and returns what its renewal says: the
// same subject, role and addresses, the same lifetime (exp − iat, within
// today's cap for the role), and the lineage of the token minted by hand
// that it descends from. Only agent tokens bound to addresses (an "ips"
// claim) are renewed, so a renewable token is only ever good for the
// hosts it names; they also need a "jti" and an "iat", which every token
// registryd mints has. A refusal is a *TokenError (raw is not valid) or
// a *RenewalError.
func (v *Verifier) Renewal(raw string) (TokenSpec, error) {
	e, c, err := v.verifyClaims(raw)
	if err != nil {
		return TokenSpec{}, err
	}
	switch {
	case !e.secret:
		// Another issuer's token: its lifetime and its revocation are
		// that issuer's, and a renewal signed here would escape both.
		return TokenSpec{}, &RenewalError{Reason: "only tokens this registry signed (HS256) are renewed; renew it with its issuer"}
	case e.p.Role != registry.RoleAgent:
		return TokenSpec{}, &RenewalError{Reason: "only agent tokens are renewed; mint another " + string(e.p.Role) + " token with registryd token"}
	case c.IPs == nil:
		return TokenSpec{}, &RenewalError{Reason: `it is not bound to addresses (no "ips" claim): mint one with registryd token --ip so that only its hosts can use it`}
	case c.ID == "" || c.IssuedAt == nil:
		return TokenSpec{}, &RenewalError{Reason: `it has no "jti" or no "iat" (not minted by registryd token)`}
	}
	spec := TokenSpec{Sub: e.p.Sub, Role: e.p.Role, IPs: *c.IPs,
		TTL:     min(c.ExpiresAt.Sub(c.IssuedAt.Time), v.cfg.Lifetimes.For(e.p.Role)),
		Lineage: c.ID, LineageStart: c.IssuedAt.Time}
	if c.Lineage != "" {
		spec.Lineage, spec.LineageStart = c.Lineage, c.LineageStart.Time
	}
	if spec.TTL <= 0 {
		return TokenSpec{}, &RenewalError{Reason: `its "exp" is not after its "iat"`}
	}
	// Not before half its life: a token cannot be renewed into copies the
	// moment it is issued (each renewal starts its own half-life).
	if from := c.IssuedAt.Add(c.ExpiresAt.Sub(c.IssuedAt.Time) / 2); v.cfg.Now().Before(from) {
		return TokenSpec{}, &RenewalError{Reason: "a token is renewed once half its lifetime is over, from " + from.UTC().Format(time.RFC3339)}
	}
	return spec, nil
}

// Renewer renews agent tokens: it checks the token again (revocation
// included) and signs its renewal (see Verifier.Renewal).
type Renewer struct {
	Verifier *Verifier
	Signer   Signer
	Now      func() time.Time // time.Now when nil
	// Observe, when set, is told each outcome: "renewed", "refused" or
	// "error".
	Observe func(result string)
	// Current, when set, says whether the revocation list is recent
	// enough to renew by (an error matching registry.ErrUnavailable
	// otherwise): a replica cut off from the database must not mint
	// renewals of tokens revoked meanwhile.
	Current func() error
}

// Renew returns the renewal of raw. A token that may not be renewed, or
// was revoked or expired since the request was let in, is a
// *registry.Error of kind registry.ErrForbidden with code
// registry.CodeNotRenewable.
func (r *Renewer) Renew(raw string) (registry.RenewedToken, error) {
	observe := r.Observe
	if observe == nil {
		observe = func(string) {}
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	if r.Current != nil {
		if err := r.Current(); err != nil {
			observe("error")
			return registry.RenewedToken{}, err
		}
	}
	spec, err := r.Verifier.Renewal(raw)
	var m Minted
	if err == nil {
		m, err = r.Signer.Mint(spec, now())
	}
	var re *RenewalError
	var te *TokenError
	switch {
	case err == nil:
		observe("renewed")
		return registry.RenewedToken{Token: m.Token, ID: m.ID, Lineage: spec.Lineage, Expires: m.Expires}, nil
	case errors.As(err, &re), errors.As(err, &te):
		observe("refused")
		return registry.RenewedToken{}, &registry.Error{Kind: registry.ErrForbidden, Code: registry.CodeNotRenewable, Message: err.Error()}
	}
	observe("error")
	return registry.RenewedToken{}, err
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
//
// A secret anyone else could have written is no secret: whoever planted it
// can sign any token. So the directory holding it must belong to the user
// we run as with no group or other write access, and the file must be a
// regular file of ours that nobody else may read or write (CheckPrivate);
// otherwise the error names the path, what is wrong and the fix. Both are
// checked on what was actually opened, not on the names, so a directory or
// file swapped in after a caller's own checks is caught too.
func LoadOrCreateSecret(path string) (secret []byte, created bool, err error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, false, fmt.Errorf("auth: create secret: %w", err)
	}
	root, err := openSecretDir(dir)
	if err != nil {
		return nil, false, err
	}
	defer root.Close()
	// Two tries: a file that appears between "not there" and O_EXCL is
	// another process's fresh secret, to be read instead.
	for range 2 {
		secret, err := readSecret(root, path, name)
		if !errors.Is(err, fs.ErrNotExist) {
			return secret, false, err
		}
		secret, err = createSecret(root, path, name)
		if !errors.Is(err, fs.ErrExist) {
			return secret, err == nil, err
		}
	}
	return nil, false, fmt.Errorf("auth: %s keeps appearing and disappearing", path)
}

// LoadSecret is LoadOrCreateSecret for those who must not make a secret:
// a missing directory or file is an error wrapping fs.ErrNotExist.
func LoadSecret(path string) ([]byte, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	root, err := openSecretDir(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return readSecret(root, path, name)
}

// openSecretDir opens dir, the directory of a secret, refusing one that
// is not private (see LoadOrCreateSecret).
func openSecretDir(dir string) (*os.Root, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("auth: secret directory: %w", err)
	}
	dfi, err := root.Stat(".")
	if err == nil {
		err = CheckPrivate(filepath.Clean(dir), dfi, 0o022)
	} else {
		err = fmt.Errorf("auth: secret directory: %w", err)
	}
	if err != nil {
		root.Close()
		return nil, err
	}
	return root, nil
}

// readSecret reads name in root, refusing anything but a private regular
// file. A missing file is an error wrapping fs.ErrNotExist.
func readSecret(root *os.Root, path, name string) ([]byte, error) {
	lfi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("auth: read secret: %w", err)
	}
	if !lfi.Mode().IsRegular() {
		return nil, fmt.Errorf("auth: %s is not a regular file (%v); a token secret must be one: remove it and start again to make a new secret", path, lfi.Mode().Type())
	}
	f, err := root.Open(name)
	if err != nil {
		return nil, fmt.Errorf("auth: read secret: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth: read secret: %w", err)
	}
	if !os.SameFile(lfi, fi) {
		return nil, fmt.Errorf("auth: %s changed while being opened; try again", path)
	}
	if err := CheckPrivate(path, fi, 0o077); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, fmt.Errorf("auth: read secret: %w", err)
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) < MinSecretBytes {
		return nil, fmt.Errorf("auth: %s holds a secret shorter than %d bytes", path, MinSecretBytes)
	}
	return s, nil
}

// createSecret writes a new secret to name in root; an existing file is an
// error wrapping fs.ErrExist. The secret is written to a temporary file
// first and then linked into place, so a process starting at the same
// moment sees either no secret or a whole one, never a half-written file.
func createSecret(root *os.Root, path, name string) ([]byte, error) {
	raw := make([]byte, 40)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	s := []byte(hex.EncodeToString(raw[:32]))
	tmp := name + ".new-" + hex.EncodeToString(raw[32:])
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auth: create secret: %w", err)
	}
	defer root.Remove(tmp)
	_, err = f.Write(append(s, '\n'))
	if err := errors.Join(err, f.Sync(), f.Close()); err != nil {
		return nil, fmt.Errorf("auth: write secret: %w", err)
	}
	// Link, unlike rename, fails when name exists: two processes starting
	// at once must not both install a secret.
	if err := root.Link(tmp, name); errors.Is(err, fs.ErrExist) {
		return nil, fs.ErrExist
	} else if err != nil {
		return nil, fmt.Errorf("auth: create secret: %w", err)
	}
	return s, nil
}

// CheckPrivate returns an error unless fi, the file or directory at path,
// belongs to the user this process runs as (root, when running as root)
// and has none of the permission bits in deny: 0o022 for "nobody else may
// write it", 0o077 for "nobody else may touch it". The error names the
// path, the owner or mode found and the command that fixes it.
func CheckPrivate(path string, fi fs.FileInfo, deny fs.FileMode) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("auth: %s: cannot tell its owner on this system", path)
	}
	what := "file"
	if fi.IsDir() {
		what = "directory"
	}
	if me := os.Geteuid(); int(st.Uid) != me {
		name := strconv.Itoa(me)
		if u, err := user.LookupId(name); err == nil {
			name = u.Username
		}
		return fmt.Errorf("auth: %s %s belongs to %s, but registryd runs as %s: another user may have made it and put "+
			"their own contents there; remove it, or if it is yours after all, run: chown %s %s",
			what, path, userName(int(st.Uid)), userName(me), name, path)
	}
	if bad := fi.Mode().Perm() & deny; bad != 0 {
		return fmt.Errorf("auth: %s %s has mode %v: %s; run: chmod %s %s",
			what, path, fi.Mode(), whoMay(bad), chmodArg(bad), path)
	}
	return nil
}

// userName is "uid N (name)", or "uid N" for an unknown user.
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// whoMay says what the permission bits in bad let other users do.
func whoMay(bad fs.FileMode) string {
	var may []string
	if bad&0o044 != 0 {
		may = append(may, "read")
	}
	if bad&0o022 != 0 {
		may = append(may, "write")
	}
	if bad&0o011 != 0 {
		may = append(may, "enter or run")
	}
	return "group or other users may " + strings.Join(may, " and ") + " it"
}

// chmodArg is the symbolic chmod mode removing the bits in bad, e.g. go-w.
func chmodArg(bad fs.FileMode) string {
	var who, perms string
	if bad&0o070 != 0 {
		who += "g"
	}
	if bad&0o007 != 0 {
		who += "o"
	}
	for i, p := range "rwx" {
		if bad&(0o044>>i) != 0 {
			perms += string(p)
		}
	}
	return who + "-" + perms
}
