package auth

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/registry"
)

// topLevelKeys lists an object's member names in order, duplicates kept:
// an oracle for the strict pre-check, written apart from it.
func topLevelKeys(data []byte) ([]string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, false
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return keys, true
}

func unique(keys []string) bool {
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

// FuzzVerify signs arbitrary header and claims bytes with the verifier's
// own secret, so the fuzzer explores what lies past the signature. Seeds
// are in testdata/fuzz/FuzzVerify. It must never panic; whatever it
// accepts must keep every strict rule, checked here independently; and a
// token accepted once is accepted again with the same principal.
func FuzzVerify(f *testing.F) {
	v, err := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, header, claims []byte) {
		tok := rawToken(secret, string(header), string(claims))
		p, err := v.Verify(tok)
		if err != nil {
			if _, ok := err.(*TokenError); !ok {
				t.Fatalf("error %T, want *TokenError: %v", err, err)
			}
			return
		}
		for name, seg := range map[string][]byte{"header": header, "claims": claims} {
			keys, ok := topLevelKeys(seg)
			if !ok || !unique(keys) || !utf8.Valid(seg) {
				t.Fatalf("accepted a %s that is not one object with unique members: %q", name, seg)
			}
		}
		var h map[string]any
		json.Unmarshal(header, &h)
		if _, crit := h["crit"]; crit || h["alg"] != "HS256" {
			t.Fatalf("accepted header %q", header)
		}
		var c map[string]any
		dec := json.NewDecoder(bytes.NewReader(claims))
		dec.UseNumber()
		dec.Decode(&c)
		for _, name := range []string{"exp", "nbf", "iat"} {
			if val, ok := c[name]; ok {
				if _, num := val.(json.Number); !num {
					t.Fatalf("accepted %s = %#v, not a number", name, val)
				}
			}
		}
		if _, ok := c["exp"]; !ok {
			t.Fatal("accepted a token without exp")
		}
		if c["sub"] != p.Sub || c["role"] != string(p.Role) || p.Sub == "" {
			t.Fatalf("principal %+v from claims %q", p, claims)
		}
		if _, ok := c["ips"]; ok != (p.IPs != nil) || (ok && p.Role != registry.RoleAgent) {
			t.Fatalf("principal %+v from ips %v", p, c["ips"])
		}
		exp, _ := c["exp"].(json.Number).Float64()
		start := float64(now.Unix())
		if iat, ok := c["iat"].(json.Number); ok {
			start, _ = iat.Float64()
		}
		if limit := v.cfg.Lifetimes.For(p.Role) + Leeway; exp-start > limit.Seconds()+1 {
			t.Fatalf("accepted a lifetime of %.0fs over a cap of %s", exp-start, limit)
		}
		again, err := v.Verify(tok)
		if err != nil || !reflect.DeepEqual(p, again) {
			t.Fatalf("accepted once as %+v, then %+v, %v", p, again, err)
		}
	})
}

// hasLoneSurrogate reports whether a JSON text escapes half a UTF-16
// surrogate pair without its other half: an oracle for the scanner,
// working on the text with regular expressions instead of a scan.
func hasLoneSurrogate(data []byte) bool {
	s := strings.ReplaceAll(string(data), `\\`, "__") // escaped backslashes start no escape
	s = surrogatePair.ReplaceAllString(s, "")
	return surrogateHalf.MatchString(s)
}

var (
	surrogatePair = regexp.MustCompile(`\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}`)
	surrogateHalf = regexp.MustCompile(`\\u[dD][89a-fA-F]`)
)

// FuzzStrictObject holds the strict JSON scanner to encoding/json: what it
// accepts is valid UTF-8 JSON, one object with unique member names, whose
// members are exactly what encoding/json reads; and every such object
// without surrogate escapes is accepted. Seeds are in
// testdata/fuzz/FuzzStrictObject.
func FuzzStrictObject(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		members, err := strictObject(data)
		keys, object := topLevelKeys(data)
		valid := json.Valid(data) && utf8.Valid(data) && object
		if err != nil {
			if valid && unique(keys) && !hasLoneSurrogate(data) && !deep(data) && !nestedDuplicate(data) {
				t.Fatalf("refused %q: %v", data, err)
			}
			return
		}
		if !valid || !unique(keys) || hasLoneSurrogate(data) || deep(data) || nestedDuplicate(data) {
			t.Fatalf("accepted %q", data)
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", data, err)
		}
		if len(want) != len(members) {
			t.Fatalf("members %q, encoding/json reads %q", members, want)
		}
		for k, v := range want {
			if !bytes.Equal(members[k], v) {
				t.Fatalf("member %q: %q, encoding/json reads %q", k, members[k], v)
			}
		}
	})
}

// deep reports whether data nests deeper than the scanner allows: more
// than maxJSONDepth levels, the top object counting as one.
func deep(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if depth++; depth > maxJSONDepth {
				return true
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// nestedDuplicate reports whether some object below the top names a
// member twice, decoding each object into a map and counting its keys.
func nestedDuplicate(data []byte) bool {
	var walk func(v json.RawMessage, top bool) bool
	walk = func(v json.RawMessage, top bool) bool {
		switch kind(bytes.TrimSpace(v)) {
		case '{':
			keys, _ := topLevelKeys(v)
			if !top && !unique(keys) {
				return true
			}
			var m map[string]json.RawMessage
			json.Unmarshal(v, &m)
			for _, c := range m {
				if walk(c, false) {
					return true
				}
			}
		case '[':
			var items []json.RawMessage
			json.Unmarshal(v, &items)
			for _, c := range items {
				if walk(c, false) {
					return true
				}
			}
		}
		return false
	}
	return walk(data, true)
}
