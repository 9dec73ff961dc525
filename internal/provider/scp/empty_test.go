package scp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/scp"
)

// A 200 whose body lacks the node list (a maintenance page, a confused
// proxy) must fail the pass: read as an empty inventory it would remove
// every free node of the provider.
func TestAnswerWithoutListIsAnError(t *testing.T) {
	for _, body := range []string{`{}`, `null`, `{"count": 0}`, `{"gpu_nodes": null}`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/products") {
				w.Write([]byte(`{"products": []}`))
				return
			}
			w.Write([]byte(body))
		}))
		c, err := scp.New(scp.Config{Endpoint: srv.URL, AccessKey: "a", SecretKey: "s", Retry: provider.Retry{Attempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		inv, err := c.Fetch(context.Background())
		if err == nil {
			t.Errorf("body %s: no error, inventory %+v", body, inv)
		}
		srv.Close()
	}
}
