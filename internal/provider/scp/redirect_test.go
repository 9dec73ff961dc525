package scp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/providertest"
	"github.com/registryd/registryd/internal/provider/scp"
)

// The finding: GET /v1/gpu-nodes/products answering 302 to another host
// handed that host Scp-Accesskey and a valid Scp-Signature. Now the
// redirect is refused and the other host hears nothing.
func TestFetchRefusesRedirectToAnotherHost(t *testing.T) {
	t.Parallel()
	providertest.CheckRedirectRefused(t, http.StatusFound, "KEY", func(endpoint string) error {
		c, err := scp.New(scp.Config{Endpoint: endpoint, AccessKey: "ACCESS-KEY", SecretKey: "SECRET-KEY",
			Retry: provider.Retry{Attempts: 3, Base: time.Millisecond, Timeout: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Fetch(t.Context())
		return err
	})
}
