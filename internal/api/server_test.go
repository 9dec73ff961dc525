package api_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func TestHealthAndReadiness(t *testing.T) {
	b := setup(t)
	b.must(http.StatusOK, b.do("GET", "/healthz", nil))
	b.must(http.StatusOK, b.do("GET", "/readyz", nil))

	notReady := another(t, func(c *api.Config) {
		c.Ready = func(context.Context) error { return errors.New("schema is at version 0, want 1") }
	})
	r := notReady.must(http.StatusServiceUnavailable, notReady.do("GET", "/readyz", nil))
	if !strings.Contains(string(r.body), "schema is at version 0") {
		t.Errorf("readyz does not say why: %s", r.body)
	}
}

func TestServesOpenAPI(t *testing.T) {
	b := setup(t)
	r := b.must(http.StatusOK, b.do("GET", "/openapi.yaml", nil))
	if string(r.body) != string(registryd.OpenAPI) {
		t.Error("served spec differs from the embedded one")
	}
}

func TestRequestID(t *testing.T) {
	b := setup(t)
	r := b.do("GET", "/v1/nodes/424242", nil, "X-Request-Id", "trace-abc.1")
	if r.header.Get("X-Request-Id") != "trace-abc.1" {
		t.Errorf("X-Request-Id %q", r.header.Get("X-Request-Id"))
	}
	if r.object(t)["request_id"] != "trace-abc.1" {
		t.Errorf("problem lacks request id: %s", r.body)
	}
	// Ids that could pollute logs are replaced.
	r = b.do("GET", "/v1/nodes/424242", nil, "X-Request-Id", "bad id\"")
	if got := r.header.Get("X-Request-Id"); got == "" || strings.Contains(got, " ") {
		t.Errorf("unsafe id kept: %q", got)
	}
}

func TestUnknownRoutes(t *testing.T) {
	b := setup(t)
	b.must(http.StatusNotFound, b.do("GET", "/v2/nodes", nil))
	r := b.must(http.StatusMethodNotAllowed, b.do("GET", "/v1/nodes/create", nil))
	if got := r.header.Get("Allow"); got != "POST" {
		t.Errorf("Allow = %q, want POST", got)
	}
	r = b.must(http.StatusMethodNotAllowed, b.do("POST", "/v1/nodes/7", nil))
	if got := r.header.Get("Allow"); got != "GET, HEAD, PUT, PATCH, DELETE" {
		t.Errorf("Allow = %q", got)
	}
	b.must(http.StatusMethodNotAllowed, b.do("POST", "/v1/nodes/ping", nil))
}

// chiPattern matches a chi route parameter with a regexp, {pk:[0-9]+}.
var chiPattern = regexp.MustCompile(`\{(\w+):[^}]*\}`)

// The router and openapi.yaml describe the same operations, both ways.
func TestRoutesMatchSpec(t *testing.T) {
	doc, _ := apitest.Spec(t)
	srv := api.New(api.Config{})
	var routed []string
	err := chi.Walk(srv.Router(), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		routed = append(routed, method+" "+chiPattern.ReplaceAllString(strings.TrimSuffix(route, "/"), "{$1}"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var specced []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			specced = append(specced, method+" "+path)
		}
	}
	slices.Sort(routed)
	slices.Sort(specced)
	for _, r := range routed {
		if !slices.Contains(specced, r) {
			t.Errorf("routed but not in openapi.yaml: %s", r)
		}
	}
	for _, s := range specced {
		if !slices.Contains(routed, s) {
			t.Errorf("in openapi.yaml but not routed: %s", s)
		}
	}
}

// With the database gone, requests answer 503 quickly with Retry-After,
// not 500, and the process keeps serving.
func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	st, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping}))
	defer ts.Close()
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping, Auth: verifier})
	b := &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, token: tokenFor(t, "admin", registry.RoleAdmin)}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/nodes/create", `{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`},
		{"GET", "/v1/nodes/1", ""},
		{"POST", "/v1/nodes/list", ""},
		{"PATCH", "/v1/nodes/1", `{"cpu_mem":2}`},
		{"DELETE", "/v1/nodes/1", ""},
		{"POST", "/v1/hardware/list", ""},
		{"GET", "/readyz", ""},
	} {
		var body any
		if tc.body != "" {
			body = tc.body
		}
		r := b.must(http.StatusServiceUnavailable, b.do(tc.method, tc.path, body))
		if tc.path != "/readyz" && r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", tc.method, tc.path)
		}
	}
	// Validation does not need the database: bad input is still a 400.
	b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/create", `{"ip":"x"}`))
}
