package registry

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSelector(t *testing.T) {
	for _, c := range []struct {
		text string
		want Selector
	}{
		{"", Selector{}},
		{"  ", Selector{}},
		{"gpu=h100", Selector{{Key: "gpu", Op: OpEquals, Values: []string{"h100"}}}},
		{"gpu==h100", Selector{{Key: "gpu", Op: OpEquals, Values: []string{"h100"}}}},
		{"gpu = h100 ", Selector{{Key: "gpu", Op: OpEquals, Values: []string{"h100"}}}},
		{"gpu=", Selector{{Key: "gpu", Op: OpEquals, Values: []string{""}}}},
		{"tier!=spot", Selector{{Key: "tier", Op: OpNotEquals, Values: []string{"spot"}}}},
		{"scp.registryd.io/region in (kr-west1, kr-east1,kr-west1)",
			Selector{{Key: "scp.registryd.io/region", Op: OpIn, Values: []string{"kr-east1", "kr-west1"}}}},
		{"zone notin(a)", Selector{{Key: "zone", Op: OpNotIn, Values: []string{"a"}}}},
		{"ib", Selector{{Key: "ib", Op: OpExists}}},
		{"! maintenance", Selector{{Key: "maintenance", Op: OpNotExists}}},
		{"a=1,b, !c , d in (x),e!=2", Selector{
			{Key: "a", Op: OpEquals, Values: []string{"1"}},
			{Key: "b", Op: OpExists},
			{Key: "c", Op: OpNotExists},
			{Key: "d", Op: OpIn, Values: []string{"x"}},
			{Key: "e", Op: OpNotEquals, Values: []string{"2"}},
		}},
		{"in in (in)", Selector{{Key: "in", Op: OpIn, Values: []string{"in"}}}},
	} {
		got, err := ParseSelector(c.text)
		if err != nil {
			t.Errorf("%q: %v", c.text, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", c.text, diff)
		}
		again, err := ParseSelector(got.String())
		if err != nil || !cmp.Equal(got, again) {
			t.Errorf("%q printed as %q reads back as %v, %v", c.text, got.String(), again, err)
		}
	}
}

// Every refusal says where, 1-based, and why.
func TestParseSelectorErrors(t *testing.T) {
	for _, c := range []struct {
		text string
		pos  int
		says string
	}{
		{",", 1, "expected a label key"},
		{"a=1,", 5, "expected a requirement after ','"},
		{"a=1 b=2", 5, "expected ',' or the end"},
		{"a<1", 2, "expected '=', '==', '!=', 'in', 'notin'"},
		{"a in b", 6, "expected '(' to open"},
		{"a in (b", 8, "expected ')' to close"},
		{"a in (b;c)", 8, "expected ',' or ')'"},
		{"-a=1", 1, "must begin and end with a letter or digit"},
		{"Scp.io/a=1", 1, "prefix must be lower-case"},
		{"a/b/c=1", 1, "has '/'"},
		{"/a", 1, "prefix is empty"},
		{"a/=1", 1, "has no name"},
		{strings.Repeat("k", 64) + "=1", 1, "longer than 63"},
		{"a=" + strings.Repeat("v", 64), 3, "longer than 63"},
		{"a=b/c", 3, "has '/'"},
		{"a=-b", 3, "must begin and end"},
		{"!", 2, "expected a label key"},
		{"!a=1", 3, "expected ',' or the end"},
		{"a=é", 3, "expected ',' or the end"},
		{strings.Repeat("a", MaxSelector+1), MaxSelector + 1, "at most 4096"},
	} {
		_, err := ParseSelector(c.text)
		var se *SelectorError
		if !errors.As(err, &se) {
			t.Errorf("%q: %v, want a *SelectorError", c.text, err)
			continue
		}
		if se.Pos != c.pos || !strings.Contains(se.Error(), c.says) {
			t.Errorf("%q: %v; want position %d, saying %q", c.text, err, c.pos, c.says)
		}
	}
}

func TestSelectorMatches(t *testing.T) {
	labels := mustLabels(t, map[string]string{"gpu": "h100", "tier": "", "scp.registryd.io/region": "kr-west1"})
	for text, want := range map[string]bool{
		"":                      true,
		"gpu=h100":              true,
		"gpu=a100":              false,
		"gpu!=a100":             true,
		"zone!=a":               true, // absent: != holds
		"tier=":                 true,
		"tier":                  true,
		"!tier":                 false,
		"!zone":                 true,
		"zone":                  false,
		"gpu in (a100,h100)":    true,
		"gpu notin (a100,h100)": false,
		"zone notin (a)":        true, // absent: notin holds
		"zone in (a)":           false,
		"gpu=h100,scp.registryd.io/region in (kr-west1)": true,
		"gpu=h100,!tier": false,
	} {
		sel, err := ParseSelector(text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if got := sel.Matches(labels); got != want {
			t.Errorf("%q matches %v: %v, want %v", text, labels, got, want)
		}
	}
}

func TestLabelKeysAndValues(t *testing.T) {
	for k, ok := range map[string]bool{
		"gpu": true, "a.b-c_d": true, "e2e.registryd.io/plan": true, "x/y": true,
		"": false, "-a": false, "a-": false, "A.io/x": false, "a..b/x": false, "a/": false,
		strings.Repeat("a", 63): true, strings.Repeat("a", 64): false,
		strings.Repeat("a.", 126) + "a/x": true, strings.Repeat("a.", 127) + "a/x": false,
	} {
		if got := CheckLabelKey(k) == ""; got != ok {
			t.Errorf("key %q: valid %v, want %v (%s)", k, got, ok, CheckLabelKey(k))
		}
	}
	for v, ok := range map[string]bool{"": true, "h100": true, "8x_H100.sxm-5": true, "-a": false, "a b": false, strings.Repeat("v", 64): false} {
		if got := CheckLabelValue(v) == ""; got != ok {
			t.Errorf("value %q: valid %v, want %v (%s)", v, got, ok, CheckLabelValue(v))
		}
	}
}

// Whatever the text, parsing never panics; a selector it accepts prints
// as text that reads back to the same selector, and an error says a
// position within the text (or just past it).
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"", "a=1", "a in (b,c), !d", "x/y notin (z)", "a=1,", "a in (", "!", "==", "a!=b,c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		sel, err := ParseSelector(text)
		if err != nil {
			var se *SelectorError
			if !errors.As(err, &se) || se.Pos < 1 || se.Pos > len(text)+1 {
				t.Fatalf("%q: %v: want a *SelectorError within the text", text, err)
			}
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil || !cmp.Equal(sel, again) {
			t.Fatalf("%q printed as %q reads back as %v, %v", text, sel.String(), again, err)
		}
		m := map[string]string{}
		for _, r := range sel {
			if len(r.Values) > 0 {
				m[r.Key] = r.Values[0]
			}
		}
		labels, err := MakeLabels(m)
		if err != nil {
			return // more labels than a node may have
		}
		if got, want := sel.Matches(labels), matchesMap(sel, m); got != want {
			t.Fatalf("%q on %v: Matches %v, the map says %v", text, m, got, want)
		}
	})
}

// matchesMap is Selector.Matches over a map: the lookups Labels.Get makes
// must agree with a map's.
func matchesMap(sel Selector, m map[string]string) bool {
	return sel.matchesWith(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
}

func mustLabels(t testing.TB, m map[string]string) Labels {
	t.Helper()
	l, err := MakeLabels(m)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A filter's selector built by hand is held to what ParseSelector makes;
// Unparsed is always refused, so a filter whose text failed stays an error.
func TestFilterChecksSelector(t *testing.T) {
	for _, sel := range []Selector{
		Unparsed,
		{{Key: "Bad Key", Op: OpExists}},
		{{Key: "a", Op: OpEquals}},
		{{Key: "a", Op: OpIn}},
		{{Key: "a", Op: OpExists, Values: []string{"x"}}},
		{{Key: "a", Op: "~", Values: []string{"x"}}},
		{{Key: "a", Op: OpEquals, Values: []string{"-x"}}},
	} {
		f := NodeFilter{Selector: sel}
		if fe := FieldsOf(f.Normalize()); len(fe) != 1 || fe[0].Field != "selector" {
			t.Errorf("%+v: %v; want a selector error", sel, fe)
		}
	}
	f := NodeFilter{Selector: Selector{{Key: "a", Op: OpIn, Values: []string{"1", "2"}}, {Key: "b", Op: OpNotExists}}}
	if err := f.Normalize(); err != nil {
		t.Errorf("a valid selector: %v", err)
	}
}
