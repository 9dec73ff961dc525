package provider

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestDecodeText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		json string
		want string
		long bool
	}{
		{`""`, "", false},
		{`" a b "`, " a b ", false},
		{`"caf\u00e9 \"x\""`, `café "x"`, false},
		{`"` + strings.Repeat("x", MaxText) + `"`, strings.Repeat("x", MaxText), false},
		{`"` + strings.Repeat("x", MaxText+1) + `"`, "", true},
		// Escapes count as what they decode to.
		{`"` + strings.Repeat(`\u0078`, MaxText) + `"`, strings.Repeat("x", MaxText), false},
		{`"` + strings.Repeat(`\u0078`, MaxText+1) + `"`, "", true},
	} {
		got, err := DecodeText([]byte(tc.json))
		if err != nil || got.String() != tc.want || got.long != tc.long || got.Empty() != (tc.want == "" && !tc.long) {
			t.Errorf("DecodeText(%.40s…) = %+v, %v; want %.40q…, long %v", tc.json, got, err, tc.want, tc.long)
		}
	}
	for _, bad := range []string{`7`, `null`, `"`, `"\x"`} {
		if got, err := DecodeText([]byte(bad)); err == nil {
			t.Errorf("DecodeText(%s) = %+v, want an error", bad, got)
		}
	}
	long := TextOf(strings.Repeat("y", MaxText+1))
	if long.Fits(MaxText) || long.Within(1<<30) != "" || long.Empty() || long.TrimSpace() != long {
		t.Errorf("a long text: %+v", long)
	}
	if s := TextOf(" ab ").TrimSpace(); !s.Fits(2) || s.Fits(1) || s.Within(2) != "ab" || s.Within(1) != "" {
		t.Errorf("TextOf(\" ab \").TrimSpace() = %+v", s)
	}
}

// A provider's megabytes never become a string: decoding one allocates
// next to nothing.
func TestDecodeTextDoesNotHoldLongStrings(t *testing.T) {
	b, err := json.Marshal(strings.Repeat("é", 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := DecodeText(b)
	runtime.ReadMemStats(&after)
	if err != nil || !got.long {
		t.Fatalf("DecodeText of 2 MiB = %+v, %v; want it long", got, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Errorf("decoding a string of 2 MiB allocated %d bytes", n)
	}
}
