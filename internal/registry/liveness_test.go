package registry

import (
	"testing"
	"time"
)

func TestLivenessRoundTrip(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	var pks []int64
	var seen []time.Time
	for i := range 1000 {
		pks = append(pks, int64(i*7+1))
		seen = append(seen, base.Add(time.Duration(i%13-6)*time.Millisecond+time.Duration(i)*time.Microsecond))
	}
	payloads := FormatLiveness(pks, seen, 500)
	if len(payloads) < 10 {
		t.Fatalf("%d payloads for 1000 heartbeats at 500 bytes each; want at least 10", len(payloads))
	}
	i := 0
	for _, p := range payloads {
		if len(p) > 500 {
			t.Fatalf("payload of %d bytes, max 500", len(p))
		}
		err := ParseLiveness(p, func(pk int64, at time.Time) {
			if i >= len(pks) || pk != pks[i] || !at.Equal(seen[i]) {
				t.Fatalf("heartbeat %d: got %d at %s", i, pk, at)
			}
			i++
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if i != len(pks) {
		t.Fatalf("parsed %d heartbeats, want %d", i, len(pks))
	}
	if err := ParseLiveness("zz 1;2", func(int64, time.Time) {}); err == nil {
		t.Fatal("a bad pair was accepted")
	}
}
