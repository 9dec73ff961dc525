package api_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// switchList is a revocation list revoking everything once told to.
type switchList struct{ revoked atomic.Bool }

func (l *switchList) Revoked(string, string, *time.Time) (bool, error) { return l.revoked.Load(), nil }

// Over HTTP, with the verified-token cache on: a token in use (so cached)
// is refused by the very next request once it is revoked, and once it
// has expired; a heartbeat through Node-Id is refused the same way.
func TestTokenCacheOverHTTP(t *testing.T) {
	list := &switchList{}
	var clock atomic.Pointer[time.Time] // nil: the real one
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, Revocations: list, CacheSize: 10,
		Now: func() time.Time {
			if t := clock.Load(); t != nil {
				return *t
			}
			return time.Now()
		}})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, func(c *api.Config) { c.Auth = verifier })
	pk := b.createNode(map[string]any{"index": 0})
	start := time.Now()
	tok := tokenFor(t, "admin-cache", registry.RoleAdmin) // an hour from now
	ping := func(nodeID bool) response {
		h := []string{"Authorization", "Bearer " + tok}
		if nodeID {
			h = append(h, "Node-Id", strconv.FormatInt(pk, 10))
		}
		return b.do("GET", "/v1/nodes/ping", nil, h...)
	}
	for range 3 {
		b.must(http.StatusOK, ping(false))
		b.must(http.StatusOK, ping(true))
	}
	list.revoked.Store(true)
	for _, nodeID := range []bool{false, true} {
		r := b.must(http.StatusUnauthorized, ping(nodeID))
		if !strings.Contains(r.header.Get("WWW-Authenticate"), "revoked") {
			t.Errorf("revoked: %q", r.header.Get("WWW-Authenticate"))
		}
	}
	list.revoked.Store(false)
	b.must(http.StatusOK, ping(true))
	later := start.Add(time.Hour + auth.Leeway + time.Second)
	clock.Store(&later)
	for _, nodeID := range []bool{false, true} {
		r := b.must(http.StatusUnauthorized, ping(nodeID))
		if !strings.Contains(r.header.Get("WWW-Authenticate"), "expired") {
			t.Errorf("expired: %q", r.header.Get("WWW-Authenticate"))
		}
	}
}
