package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
)

// A 200 whose body lacks the cluster list must fail the pass: read as an
// empty inventory it would remove every free node of the provider.
func TestAnswerWithoutListIsAnError(t *testing.T) {
	for _, body := range []string{`{}`, `null`, `{"code":200}`, `{"code":200,"data":null}`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) }))
		c, err := e2e.New(e2e.Config{Endpoint: srv.URL, APIKey: "k", Token: "t", ProjectID: "1", Location: "Delhi",
			Retry: provider.Retry{Attempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if inv, err := c.Fetch(context.Background()); err == nil {
			t.Errorf("body %s: no error, inventory %+v", body, inv)
		}
		srv.Close()
	}
	// An empty list is a legitimately empty account.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"code":200,"data":[],"errors":{},"message":"Success"}`))
	}))
	defer srv.Close()
	c, _ := e2e.New(e2e.Config{Endpoint: srv.URL, APIKey: "k", Token: "t", ProjectID: "1", Location: "Delhi"})
	if inv, err := c.Fetch(context.Background()); err != nil || len(inv.Hosts) != 0 {
		t.Errorf("empty list: %+v %v", inv, err)
	}
}
