package api

import (
	"net/http"
	"testing"
	"time"
)

// Cache-Control request directives as clients write them: several in one
// header or several headers, any case, spaces, quoted values; no-cache
// wins; max-stale is capped at MaxStale (any number of digits); a bad
// value asks for nothing.
func TestReadFreshness(t *testing.T) {
	for _, tc := range []struct {
		headers []string
		mode    freshness
		stale   time.Duration
	}{
		{nil, consistent, 0},
		{[]string{""}, consistent, 0},
		{[]string{"no-store"}, consistent, 0},
		{[]string{"no-cache"}, strong, 0},
		{[]string{" No-Cache "}, strong, 0},
		{[]string{"max-age=0, no-cache"}, strong, 0},
		{[]string{"max-stale=1", "no-cache"}, strong, 0},
		{[]string{"max-stale"}, bounded, MaxStale},
		{[]string{"MAX-STALE=1"}, bounded, time.Second},
		{[]string{"max-age=5 ,  max-stale = 1"}, bounded, time.Second},
		{[]string{`max-stale="1"`}, bounded, time.Second},
		{[]string{"max-stale=3600"}, bounded, MaxStale},
		{[]string{"max-stale=99999999999999999999"}, bounded, MaxStale},
		{[]string{"max-stale=99999999999999999999x"}, consistent, 0},
		{[]string{"max-stale=0"}, consistent, 0},
		{[]string{"max-stale=-1"}, consistent, 0},
		{[]string{"max-stale=1s"}, consistent, 0},
		{[]string{"max-stale=1", "max-stale=2"}, bounded, 2 * time.Second},
		{[]string{"no-cachex", "x-max-stale"}, consistent, 0},
	} {
		r, _ := http.NewRequest("GET", "/", nil)
		for _, h := range tc.headers {
			r.Header.Add("Cache-Control", h)
		}
		mode, stale := readFreshness(r)
		if mode != tc.mode || stale != tc.stale {
			t.Errorf("Cache-Control %q: mode %d stale %v, want %d %v", tc.headers, mode, stale, tc.mode, tc.stale)
		}
	}
}
