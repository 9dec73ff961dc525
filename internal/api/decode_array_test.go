package api

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestParseIntArray(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int64
		msg  string
	}{
		{`[]`, []int64{}, ""},
		{`[ ]`, []int64{}, ""},
		{`[1, 2 ,3]`, []int64{1, 2, 3}, ""},
		{`[-9223372036854775808]`, []int64{-9223372036854775808}, ""},
		{`[1.5]`, nil, "must be an array of integers (an element must be an integer, not a fractional or exponent number)"},
		{`[1,"2"]`, nil, "must be an array of integers (an element must be an integer, not a string)"},
		{`[[1]]`, nil, "must be an array of integers (an element must be an integer)"},
		{`[null]`, nil, "must be an array of integers (an element must be an integer)"},
		{`[9223372036854775808]`, nil, "must be an array of integers (an element is out of range for a 64-bit integer)"},
		{`{"a":1}`, nil, "must be an array of integers"},
		{`5`, nil, "must be an array of integers"},
		// limit+1 elements are read, never more; the rest is not looked at.
		{`[1,2,3,4,5]`, []int64{1, 2, 3, 4}, ""},
		{`[1,2,3,4,"x"]`, []int64{1, 2, 3, 4}, ""},
		{`[1,2,3,"x",5]`, nil, "must be an array of integers (an element must be an integer, not a string)"},
	} {
		got, msg := parseIntArray(json.RawMessage(tc.in), 3)
		if msg != tc.msg || !slices.Equal(got, tc.want) || (tc.want != nil) != (got != nil) {
			t.Errorf("%s: %v %q, want %v %q", tc.in, got, msg, tc.want, tc.msg)
		}
	}
	// Half a million elements cost what limit+1 do.
	huge := json.RawMessage("[1" + strings.Repeat(",1", 500_000) + "]")
	allocs := testing.AllocsPerRun(5, func() {
		if got, _ := parseIntArray(huge, 1000); len(got) != 1001 {
			t.Fatalf("%d elements read", len(got))
		}
	})
	if allocs > 32 {
		t.Errorf("%v allocations for a capped array", allocs)
	}
}

func BenchmarkParseIntArray(b *testing.B) {
	huge := json.RawMessage("[1" + strings.Repeat(",1", 500_000) + "]")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = parseIntArray(huge, 1000)
	}
}
