package provider_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/registry"
)

func TestLabelValue(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 70)
	tests := []struct {
		in   string
		want string // "" means left out
	}{
		{"kr-west1", "kr-west1"},
		{"POOL001-krw1a", "POOL001-krw1a"},
		{"s1v8m32_metal", "s1v8m32_metal"},
		{"GDC3.8xH100-640GB", "GDC3.8xH100-640GB"},
		{"a", "a"},
		{"a--b", "a--b"},   // valid: kept as it is
		{"a - b", "a---b"}, // each space is a run of its own
		{"a  /  b", "a-b"}, // one run, one '-'
		{"cluster 001", "cluster-001"},
		{"fabric/rack 3", "fabric-rack-3"},
		{"  padded  ", "padded"},
		{"-_.lead", "lead"},
		{"trail._-", "trail"},
		{"(prod)", "prod"},
		{"클러스터 A/1 (prod)", "A-1-prod"},
		{"서울 리전", ""},
		{"Chennai 🚀", "Chennai"},
		{"Straße", "Stra-e"},
		{"a\xffb", "a-b"}, // invalid UTF-8
		{"a\x00b\nc", "a-b-c"},
		{"", ""},
		{"   ", ""},
		{"-._", ""},
		{"/", ""},
		{long[:63], long[:63]},
		{long, long[:63]},
		{strings.Repeat("ab ", 30), strings.Repeat("ab-", 20) + "ab"}, // cut at 63, the trailing '-' dropped
		{strings.Repeat("x", 62) + " y", strings.Repeat("x", 62)},     // the '-' is the 63rd, then dropped
		{strings.Repeat(" ", 100) + "late", "late"},                   // leading junk does not use up the length
		{strings.Repeat("-", 64) + "z", "z"},
	}
	for _, tt := range tests {
		got, ok := provider.LabelValue(tt.in)
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("LabelValue(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.want != "")
		}
	}
}

// FuzzLabelValue holds LabelValue to the registry's own check: whatever
// a provider sends, the value is valid or the label is left out; a valid
// value passes unchanged, and mapping is idempotent.
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"", "kr-west1", "클러스터 A/1", "a\xffb", " -x- ", strings.Repeat("é", 40), strings.Repeat("a b", 30)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := provider.LabelValue(s)
		if msg := registry.CheckLabelValue(v); msg != "" {
			t.Fatalf("LabelValue(%q) = %q, which %s", s, v, msg)
		}
		if ok != (v != "") {
			t.Fatalf("LabelValue(%q) = %q, %v", s, v, ok)
		}
		if registry.CheckLabelValue(s) == "" && s != "" && v != s {
			t.Fatalf("valid %q became %q", s, v)
		}
		if again, _ := provider.LabelValue(v); again != v {
			t.Fatalf("LabelValue(%q) = %q, but LabelValue(%q) = %q", s, v, v, again)
		}
		if !ok && strings.ContainsFunc(s, func(r rune) bool {
			return r < utf8.RuneSelf && ('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
		}) {
			t.Fatalf("LabelValue(%q) left out a string with a letter or digit", s)
		}
	})
}

func TestSetLabel(t *testing.T) {
	t.Parallel()
	var h provider.Host
	h.SetLabel("scp.registryd.io/region", "서울")
	if h.Labels != nil {
		t.Fatalf("a value with nothing left allocated labels: %v", h.Labels)
	}
	h.SetLabel("scp.registryd.io/region", "kr west 1")
	if h.Labels["scp.registryd.io/region"] != "kr-west-1" {
		t.Fatalf("labels %v", h.Labels)
	}
	h.SetLabel("scp.registryd.io/region", "")
	if _, ok := h.Labels["scp.registryd.io/region"]; ok {
		t.Fatalf("an empty value kept the old one: %v", h.Labels)
	}
}
