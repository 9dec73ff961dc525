package api

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/auth"
)

// headerValues turns fuzz input into a header's values: none, one or two.
func headerValues(first, second string, n uint8) []string {
	switch n % 3 {
	case 0:
		return nil
	case 1:
		return []string{first}
	}
	return []string{first, second}
}

var token68 = regexp.MustCompile(`^[A-Za-z0-9._~+/-]+=*$`)

// FuzzAuthorization drives the Authorization header through the bearer
// parsing and a real verifier (the strict JWS pre-check first). Seeds are
// in testdata/fuzz/FuzzAuthorization. It must never panic; what it
// accepts must be one header "Bearer" + spaces + a token68 that verifies;
// and a token accepted once is accepted again with the same principal.
func FuzzAuthorization(f *testing.F) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	v, err := auth.NewVerifier(auth.Config{Secret: []byte("fuzz-secret-0123456789abcdef0123456789"), Now: func() time.Time { return at }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, first, second string, n uint8) {
		values := headerValues(first, second, n)
		tok, err := parseBearer(values)
		if err != nil {
			if _, ok := err.(*unauthorized); !ok && len(values) < 2 {
				t.Fatalf("%q: error %T for one header", values, err)
			}
			return
		}
		if len(values) != 1 {
			t.Fatalf("accepted %d Authorization headers", len(values))
		}
		scheme, rest, _ := strings.Cut(values[0], " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimLeft(rest, " ") != tok || !token68.MatchString(tok) {
			t.Fatalf("accepted %q as token %q", values[0], tok)
		}
		p, err := v.Verify(tok)
		if err != nil {
			return
		}
		if _, err := auth.CheckCompact(tok); err != nil {
			t.Fatalf("verified a token the strict rules refuse: %v", err)
		}
		again, err := v.Verify(tok)
		if err != nil || !reflect.DeepEqual(p, again) {
			t.Fatalf("accepted once as %+v, then %+v, %v", p, again, err)
		}
	})
}

// FuzzNodeID feeds the Node-Id parser header values. Seeds are in
// testdata/fuzz/FuzzNodeID. It must never panic; a pk it accepts is
// positive and spelled exactly as its plain decimal; two headers are
// never accepted; no pk means no header or an empty one.
func FuzzNodeID(f *testing.F) {
	f.Fuzz(func(t *testing.T, first, second string, n uint8) {
		values := headerValues(first, second, n)
		pk, ok, err := parseNodeID(values)
		switch {
		case err != nil:
			if ok || pk != 0 {
				t.Fatalf("%q: an error with a pk", values)
			}
		case !ok:
			if len(values) > 1 || len(values) == 1 && values[0] != "" {
				t.Fatalf("%q: read as no Node-Id", values)
			}
		default:
			if len(values) != 1 || pk <= 0 || strconv.FormatInt(pk, 10) != values[0] {
				t.Fatalf("%q: accepted as %d", values, pk)
			}
		}
	})
}
