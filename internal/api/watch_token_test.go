package api_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// endsWithin waits, at most limit, for the stream to end.
func (s *stream) endsWithin(limit time.Duration) bool {
	s.t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

func watchRecheck(d time.Duration) option {
	return func(c *api.Config) { c.WatchRecheck = d }
}

// A watch stream is authorised once, when it opens, but may stay open for
// days: revoking its token (on any replica) must end it too, or a leaked
// token keeps reading every change of the fleet after its revocation.
func TestWatchEndsWhenTokenRevoked(t *testing.T) {
	b := setup(t)
	r := newReplica(b, watchRecheck(100*time.Millisecond))
	leaked := mint(t, "watcher-leaked", registry.RoleReader, time.Now().Add(-10*time.Second))
	other := mint(t, "watcher-other", registry.RoleReader, time.Now().Add(-10*time.Second))
	s := watchStream(t, r.url, "", leaked.Token)
	keeps := watchStream(t, r.url, "", other.Token)
	if s.status != http.StatusOK || keeps.status != http.StatusOK {
		t.Fatalf("watch: %d, %d", s.status, keeps.status)
	}
	b.createNode(map[string]any{"ip": "10.7.0.1"})
	if e := s.next(); e.Type != "created" {
		t.Fatalf("first event %+v", e)
	}
	keeps.next()

	b.must(http.StatusOK, b.do("POST", "/v1/tokens/revoke", map[string]any{"sub": "watcher-leaked"}))
	if !s.endsWithin(5 * time.Second) {
		t.Fatal("the stream of a revoked token was still open 5s after the revocation")
	}
	// Other principals' streams go on.
	b.createNode(map[string]any{"ip": "10.7.0.2"})
	if e := keeps.next(); e.Type != "created" {
		t.Errorf("the other stream: %+v", e)
	}
	if again := watchStream(t, r.url, "", leaked.Token); again.status != http.StatusUnauthorized {
		t.Errorf("reopening with the revoked token: %d, want 401", again.status)
	}
}

// The same for a token that expires while its stream is open.
func TestWatchEndsWhenTokenExpires(t *testing.T) {
	var now atomic.Pointer[time.Time] // nil: the real clock
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, Now: func() time.Time {
		if t := now.Load(); t != nil {
			return *t
		}
		return time.Now()
	}})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, watchRecheck(50*time.Millisecond), func(c *api.Config) { c.Auth = verifier })
	// After setup, which waits for the serial tests: the admin token b
	// sends is minted then, and must not look issued in the future.
	start := time.Now()
	now.Store(&start)
	tok, err := auth.Signer{Secret: testSecret}.Sign("watcher-brief", registry.RoleReader, time.Minute, start)
	if err != nil {
		t.Fatal(err)
	}
	s := watchStream(t, b.url, "", tok)
	if s.status != http.StatusOK {
		t.Fatalf("watch: %d", s.status)
	}
	b.createNode(map[string]any{"ip": "10.7.1.1"})
	s.next()
	s.quiet(300 * time.Millisecond) // rechecked a few times, still valid

	later := start.Add(time.Minute + auth.Leeway + time.Second)
	now.Store(&later)
	if !s.endsWithin(5 * time.Second) {
		t.Fatal("the stream was still open 5s after its token expired")
	}
}
