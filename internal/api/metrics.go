package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/registryd/registryd/internal/registry"
)

// Observer is told what the server does, for metrics. *metrics.Metrics
// implements it. Its methods run on request paths, so they must be quick.
type Observer interface {
	RequestStarted()
	// RequestDone gets the route pattern the router matched ("" for
	// none), never the raw path.
	RequestDone(route, method string, status int, d time.Duration)
	// Claimed gets "granted", "conflict" or "error".
	Claimed(outcome string, nodes int, d time.Duration)
	Released(released, notReleased int, d time.Duration)
	WatchOpened()
	WatchSent(events int)
	// WatchClosed gets one of the watchEnd reasons.
	WatchClosed(reason string)
	WatchRefused()
	// AgentTokenSeen gets every accepted agent token's subject and what
	// the token says of itself.
	AgentTokenSeen(sub string, t registry.TokenInfo)
}

// Why a watch stream ended, as WatchClosed is told.
const (
	watchEndClient   = "client"   // the client went away
	watchEndToken    = "token"    // its token was revoked or expired
	watchEndBehind   = "behind"   // it fell too far behind the feed, or the hub stopped
	watchEndWrite    = "write"    // a write failed or timed out
	watchEndBackfill = "backfill" // reading the change log failed
	watchEndReset    = "reset"    // the feed began a new epoch: it was sent a reset
)

type noObserver struct{}

func (noObserver) RequestStarted()                                {}
func (noObserver) AgentTokenSeen(string, registry.TokenInfo)      {}
func (noObserver) RequestDone(string, string, int, time.Duration) {}
func (noObserver) Claimed(string, int, time.Duration)             {}
func (noObserver) Released(int, int, time.Duration)               {}
func (noObserver) WatchOpened()                                   {}
func (noObserver) WatchSent(int)                                  {}
func (noObserver) WatchClosed(string)                             {}
func (noObserver) WatchRefused()                                  {}

// measure counts each request under the route pattern chi matched, read
// once routing is done: a path of the client's choosing never becomes a
// label, so the number of series is bounded by the routes.
func (s *Server) measure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.observer.RequestStarted()
		sw := watchStatus(w)
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK // what net/http sends for a handler that wrote nothing
			}
			route := ""
			if rc := chi.RouteContext(r.Context()); rc != nil {
				route = rc.RoutePattern()
			}
			// A request that middleware answered (401, 403, 400 for a bad
			// Node-Id) stopped at its group's pattern, "/v1/*": look up the
			// route it would have reached, still a pattern of ours.
			if strings.HasSuffix(route, "/*") {
				if full := s.router.Find(chi.NewRouteContext(), r.Method, r.URL.Path); full != "" {
					route = full
				}
			}
			s.observer.RequestDone(route, r.Method, status, time.Since(start))
		}()
		next.ServeHTTP(sw, r)
	})
}

// claimOutcome is how a claim's result is counted.
func claimOutcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, registry.ErrConflict):
		return "conflict"
	default:
		return "error"
	}
}

// serveMetrics is GET /metrics: open like the probes.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.metrics.ServeHTTP(w, r)
}
