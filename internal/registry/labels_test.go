package registry

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
)

func TestLabelsDocument(t *testing.T) {
	// PostgreSQL prints jsonb with blanks and its own key order; a client
	// may escape; both read as the one canonical document.
	for in, want := range map[string]string{
		`{"tier": "", "gpu": "h100", "a/b": "x"}`: `{"a/b":"x","gpu":"h100","tier":""}`,
		`{"gp\u0075":"h100"}`:                     `{"gpu":"h100"}`,
		`{}`:                                      `{}`,
		` { } `:                                   `{}`,
		`null`:                                    `{}`,
	} {
		var l Labels
		if err := json.Unmarshal([]byte(in), &l); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		b, err := json.Marshal(l)
		if err != nil || string(b) != want || l.String() != want || string(l.AppendJSON(nil)) != want {
			t.Errorf("%s reads as %s (%v), want %s", in, b, err, want)
		}
		again, err := ParseLabels(b)
		if err != nil || again != l {
			t.Errorf("%s does not read back as itself: %v %v", b, again, err)
		}
	}
	for _, in := range []string{
		`{"a":1}`, `[]`, `"x"`, `{"a":"b"`, `{"a":"b",}`, `{"a":"b"}x`,
		`{"a b":"c"}`, `{"a":"b c"}`, `{"a":"b","a":"c"}`, `{"-a":"b"}`,
		`{"a":"` + strings.Repeat("v", 64) + `"}`,
	} {
		if l, err := ParseLabels([]byte(in)); err == nil {
			t.Errorf("%s reads as %v; want an error", in, l)
		}
	}
}

func TestLabelsLookups(t *testing.T) {
	m := map[string]string{"a": "1", "ab": "", "b/c": "x.y", "z": "last"}
	l := mustLabels(t, m)
	if l.Len() != 4 || !maps.Equal(l.Map(), m) {
		t.Fatalf("%v: len %d, map %v", l, l.Len(), l.Map())
	}
	for k, v := range m {
		if got, ok := l.Get(k); !ok || got != v {
			t.Errorf("Get(%q) = %q, %v", k, got, ok)
		}
	}
	for _, k := range []string{"", "0", "aa", "b", "y", "zz"} {
		if got, ok := l.Get(k); ok {
			t.Errorf("Get(%q) = %q, found", k, got)
		}
	}
	var keys []string
	for k := range l.All() {
		keys = append(keys, k)
	}
	if fmt.Sprint(keys) != "[a ab b/c z]" {
		t.Errorf("All yields %v, want key order", keys)
	}
	var none Labels
	if none.Len() != 0 || none.String() != "{}" || len(none.Map()) != 0 {
		t.Errorf("the zero Labels is %v", none)
	}
	if mustLabels(t, map[string]string{}) != none {
		t.Error("an empty map is not the zero Labels")
	}
}

func TestLabelPatch(t *testing.T) {
	cur := mustLabels(t, map[string]string{"team": "a", "old": "x", "scp.registryd.io/region": "kr-west1"})
	s := func(v string) *string { return &v }
	for _, c := range []struct {
		name  string
		patch LabelPatch
		want  string // the document, or the error's words
	}{
		{"absent", LabelPatch{}, `{"old":"x","scp.registryd.io/region":"kr-west1","team":"a"}`},
		{"merge", LabelPatch{Set: true, Values: map[string]*string{"team": s("b"), "old": nil, "new": s("")}},
			`{"new":"","scp.registryd.io/region":"kr-west1","team":"b"}`},
		{"replace keeps the import's", LabelPatch{Set: true, Replace: true, Values: map[string]*string{"k": s("v")}},
			`{"k":"v","scp.registryd.io/region":"kr-west1"}`},
		{"replace with an echo", LabelPatch{Set: true, Replace: true, Values: map[string]*string{"scp.registryd.io/region": s("kr-west1")}},
			`{"scp.registryd.io/region":"kr-west1"}`},
		{"reserved changed", LabelPatch{Set: true, Values: map[string]*string{"scp.registryd.io/region": s("x")}}, "is set by the import"},
		{"reserved removed", LabelPatch{Set: true, Values: map[string]*string{"scp.registryd.io/region": nil}}, "is set by the import"},
		{"reserved added", LabelPatch{Set: true, Values: map[string]*string{"e2e.registryd.io/plan": s("x")}}, "is set by the import"},
		{"bare domain", LabelPatch{Set: true, Values: map[string]*string{"registryd.io/x": s("x")}}, "is set by the import"},
		{"bad key", LabelPatch{Set: true, Values: map[string]*string{"Bad Key": s("x")}}, `label key "Bad Key"`},
		{"bad value", LabelPatch{Set: true, Values: map[string]*string{"k": s("a b")}}, `the value of label "k"`},
	} {
		got, err := c.patch.Apply(cur)
		switch {
		case err != nil && !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		case err == nil && got.String() != c.want:
			t.Errorf("%s: %s; want %s", c.name, got, c.want)
		}
	}
	// Own labels are capped at MaxLabels; the import's do not count.
	many := map[string]*string{}
	for i := range MaxLabels {
		many[fmt.Sprintf("k%d", i)] = s("v")
	}
	if got, err := (LabelPatch{Set: true, Replace: true, Values: many}).Apply(cur); err != nil || got.Len() != MaxLabels+1 {
		t.Errorf("%d own labels and one import's: %v, %v", MaxLabels, got.Len(), err)
	}
	many["one-more"] = s("v")
	if _, err := (LabelPatch{Set: true, Replace: true, Values: many}).Apply(cur); err == nil || !strings.Contains(err.Error(), "at most 32") {
		t.Errorf("%d own labels: %v; want refused", MaxLabels+1, err)
	}
}

func TestLabelsWithReserved(t *testing.T) {
	cur := mustLabels(t, map[string]string{"team": "a", "scp.registryd.io/region": "old", "scp.registryd.io/pool": "p"})
	imported := mustLabels(t, map[string]string{"scp.registryd.io/region": "new", "scp.registryd.io/fabric": "f", "ignored": "x"})
	want := `{"scp.registryd.io/fabric":"f","scp.registryd.io/region":"new","team":"a"}`
	if got := cur.WithReserved(imported); got.String() != want {
		t.Errorf("got %s, want %s", got, want)
	}
	for key, reserved := range map[string]bool{
		"scp.registryd.io/region": true, "registryd.io/x": true, "a.b.registryd.io/x": true,
		"registryd.io": false, "notregistryd.io/x": false, "x/registryd.io": false, "team": false,
	} {
		if ReservedLabel(key) != reserved {
			t.Errorf("ReservedLabel(%q) = %v", key, !reserved)
		}
	}
}
