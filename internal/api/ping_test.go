package api

import (
	"encoding/json"
	"testing"
	"time"
)

// ping's hand-written answer is what json.Marshal writes for pingJSON,
// whatever the time's precision.
func TestAppendPing(t *testing.T) {
	for _, tt := range []time.Time{
		time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC),
		time.Date(2026, 12, 2, 3, 4, 5, 120_000_000, time.UTC),
		time.Date(2026, 12, 2, 3, 4, 5, 123_456_789, time.UTC),
		time.Date(1999, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Now().UTC(),
	} {
		want, err := json.Marshal(pingJSON{Status: "ok", Time: tt})
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendPing(nil, tt)); got != string(want)+"\n" {
			t.Errorf("%v: %q, want %q", tt, got, want)
		}
	}
}
