package e2e_test

import (
	"net/http"
	"testing"

	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
	"github.com/registryd/registryd/internal/provider/providertest"
)

// E2E's apikey rides in the query string, which a redirect to another
// host would carry along: the redirect is refused and the other host
// hears nothing.
func TestFetchRefusesRedirectToAnotherHost(t *testing.T) {
	t.Parallel()
	providertest.CheckRedirectRefused(t, http.StatusTemporaryRedirect, e2etest.TestAPIKey, func(endpoint string) error {
		c, err := e2e.New(config(endpoint))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Fetch(t.Context())
		return err
	})
}
