package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/registryd/registryd/internal/jsonscan"
)

// MaxTokenBytes bounds a token's length. Identity-provider tokens with many
// claims run to a few KiB; anything longer is refused before it is parsed.
const MaxTokenBytes = 16 << 10

// maxJSONDepth bounds nesting inside a token's header and claims, the
// object itself counting as one level; registryd reads flat members only.
const maxJSONDepth = 16

// CheckCompact checks raw as a JWS compact serialization more strictly than
// the JWT library does, before the library parses it, and returns the
// claims' members. Refused, each with a reason safe to show the caller:
//   - anything but three non-empty base64url parts (unpadded, canonical);
//   - a header or claims set that is not exactly one JSON object, holds
//     invalid UTF-8 or a lone surrogate escape, or names any member twice at
//     any depth (the library would let the last one win);
//   - a "crit" header member: RFC 7515 §4.1.11 says a recipient must refuse
//     extensions it does not understand, and registryd understands none;
//   - header and claim members of the wrong JSON type: "alg", "typ", "cty",
//     "kid", "sub", "role", "iss", "jti" strings; "exp" (required), "nbf",
//     "iat" numbers, not strings that look like numbers; "aud" a string or
//     an array of strings; "ips" an array of strings;
//   - claim names that differ from those only in case ("Role", "EXP"),
//     which encoding/json would read as them.
//
// It never verifies the signature; Verify does both.
func CheckCompact(raw string) (map[string]json.RawMessage, error) {
	if len(raw) > MaxTokenBytes {
		return nil, &TokenError{Reason: fmt.Sprintf("the token is longer than %d bytes", MaxTokenBytes)}
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return nil, &TokenError{Reason: "the token is malformed: a JWS has three dot-separated parts"}
	}
	var segs [3][]byte
	for i, p := range parts {
		b, err := decodeSegment(p)
		if err != nil {
			return nil, &TokenError{Reason: "the token is malformed: " + [3]string{"header", "claims", "signature"}[i] + " " + err.Error()}
		}
		segs[i] = b
	}
	header, err := strictObject(segs[0])
	if err != nil {
		return nil, &TokenError{Reason: "the token header " + err.Error()}
	}
	if _, ok := header["crit"]; ok {
		return nil, &TokenError{Reason: `the token header names critical extensions ("crit"); registryd supports none`}
	}
	if _, ok := header["alg"]; !ok {
		return nil, &TokenError{Reason: `the token header has no "alg"`}
	}
	for _, name := range []string{"alg", "typ", "cty", "kid"} {
		if v, ok := header[name]; ok && kind(v) != '"' {
			return nil, &TokenError{Reason: fmt.Sprintf("the token header member %q must be a string", name)}
		}
	}
	claims, err := strictObject(segs[1])
	if err != nil {
		return nil, &TokenError{Reason: "the token's claims set " + err.Error()}
	}
	if err := checkClaimTypes(claims); err != nil {
		return nil, err
	}
	return claims, nil
}

// decodeSegment decodes one unpadded base64url part. Strict decoding
// refuses non-zero padding bits, so every part has one spelling and a token
// cannot be varied without breaking its signature.
func decodeSegment(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("is empty")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return nil, errors.New("is not unpadded base64url")
		}
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, errors.New("is not canonical base64url")
	}
	return b, nil
}

// claimNames are the claims registryd reads.
var claimNames = []string{"sub", "role", "exp", "nbf", "iat", "iss", "aud", "jti", "ips"}

func checkClaimTypes(c map[string]json.RawMessage) error {
	wrong := func(name, want string) error {
		return &TokenError{Reason: fmt.Sprintf("the %q claim must be %s", name, want)}
	}
	// encoding/json matches member names to struct fields without regard
	// to case (Unicode folding, even "ſub"), so "SUB" would be read as
	// "sub" and skip the checks below: only the exact names count.
	for name := range c {
		for _, known := range claimNames {
			if name != known && strings.EqualFold(name, known) {
				return &TokenError{Reason: fmt.Sprintf("the claim %s differs from %q only in case", showName(name), known)}
			}
		}
	}
	if _, ok := c["exp"]; !ok {
		return &TokenError{Reason: `the "exp" claim is missing`}
	}
	for _, name := range []string{"exp", "nbf", "iat"} {
		v, ok := c[name]
		if !ok {
			continue
		}
		if kind(v) != '0' {
			return wrong(name, "a JSON number (seconds since 1970)")
		}
		if _, err := strconv.ParseFloat(string(v), 64); err != nil {
			return wrong(name, "a number of seconds within range")
		}
	}
	for _, name := range []string{"sub", "role", "iss", "jti"} {
		if v, ok := c[name]; ok && kind(v) != '"' {
			return wrong(name, "a string")
		}
	}
	if v, ok := c["aud"]; ok && kind(v) != '"' && !stringArray(v) {
		return wrong("aud", "a string or an array of strings")
	}
	if v, ok := c["ips"]; ok && !stringArray(v) {
		return wrong("ips", "an array of address or CIDR strings")
	}
	return nil
}

// kind is the JSON type of v by its first byte: '"' string, '0' number,
// '{' object, '[' array, 't'/'f' boolean, 'n' null.
func kind(v json.RawMessage) byte {
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; {
	case c == '-' || '0' <= c && c <= '9':
		return '0'
	case c == 'f':
		return 't'
	default:
		return c
	}
}

func stringArray(v json.RawMessage) bool {
	if kind(v) != '[' {
		return false
	}
	allStrings := true
	err := jsonscan.Elements(v, tokenScan, func(elem []byte) bool {
		allStrings = kind(elem) == '"'
		return allStrings
	})
	return err == nil && allStrings
}

// tokenScan is how a token's header and claims are read: registryd reads
// flat members only, so deep nesting is refused, and a member name given
// twice at any depth, since libraries differ on which one counts.
var tokenScan = jsonscan.Options{MaxDepth: maxJSONDepth, NestedDuplicates: true}

// strictObject reads data as exactly one JSON object and returns its
// members, refusing what encoding/json would quietly accept: invalid
// UTF-8, lone surrogate escapes, a member name twice at any depth, and
// anything after the object.
func strictObject(data []byte) (map[string]json.RawMessage, error) {
	members := map[string]json.RawMessage{}
	err := jsonscan.Object(data, tokenScan, func(m jsonscan.Member) error {
		if m.Text != nil {
			return textError(m.Text)
		}
		members[m.Name] = json.RawMessage(m.Value)
		return nil
	})
	e, ok := errors.AsType[*jsonscan.Error](err)
	switch {
	case err == nil:
		return members, nil
	case !ok:
		return nil, err // a textError from above
	case e.Kind == jsonscan.NotObject:
		return nil, errors.New("is not a JSON object")
	case e.Kind == jsonscan.TooDeep:
		return nil, fmt.Errorf("nests deeper than %d levels", maxJSONDepth)
	case e.Kind == jsonscan.Duplicate:
		return nil, fmt.Errorf("has the member %s twice", showName(e.Name))
	case e.Kind == jsonscan.BadName:
		return nil, textError(e.Text)
	}
	return nil, errors.New("is not valid JSON")
}

// textError says why a string of a token is not what was signed:
// encoding/json would read U+FFFD in its place.
func textError(e *jsonscan.TextError) error {
	if e.Escape == 0 {
		return errors.New("is not valid UTF-8")
	}
	return errors.New("holds a lone surrogate escape")
}

// showName quotes a member name for a message when it is short and plain;
// the name comes from the token and the message goes back to the caller.
func showName(name string) string {
	if len(name) > 32 {
		return "(a long name)"
	}
	for _, r := range name {
		if r < 0x20 || r > 0x7e {
			return "(a name with unusual characters)"
		}
	}
	return strconv.Quote(name)
}
