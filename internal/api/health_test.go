package api_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/api"
)

// A failing Health check makes /healthz a 503 that says why.
func TestHealthCheckFails(t *testing.T) {
	b := setup(t, func(c *api.Config) {
		c.Health = func(context.Context) error { return errors.New("embedded PostgreSQL down for 12s") }
	})
	r := b.must(http.StatusServiceUnavailable, b.do("GET", "/healthz", nil))
	if !strings.Contains(string(r.body), "unhealthy: embedded PostgreSQL down for 12s") {
		t.Errorf("healthz does not say why: %s", r.body)
	}
}
