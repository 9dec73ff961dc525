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
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, false, fmt.Errorf("auth: secret directory: %w", err)
	}
	defer root.Close()
	dfi, err := root.Stat(".")
	if err != nil {
		return nil, false, fmt.Errorf("auth: secret directory: %w", err)
	}
	if err := CheckPrivate(filepath.Clean(dir), dfi, 0o022); err != nil {
		return nil, false, err
	}
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
