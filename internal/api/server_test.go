package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// The server always makes its own request id: it is what the response,
// the problem and the audit log carry. A client's sane X-Request-Id is kept
// apart (echoed, audited as client_request_id), never as the request id.
func TestRequestID(t *testing.T) {
	logs := &apitest.Buffer{}
	b := setup(t, func(c *api.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	r := b.do("GET", "/v1/nodes/424242", nil, "X-Request-Id", "trace-abc.1")
	id := r.header.Get("X-Request-Id")
	if id == "" || id == "trace-abc.1" {
		t.Errorf("X-Request-Id %q: want the server's own id", id)
	}
	if want := `"request_id":"` + id + `","client_request_id":"trace-abc.1"`; !strings.Contains(logs.String(), want) {
		t.Errorf("access log lacks %s:\n%s", want, logs.String())
	}
	if got := r.header.Get("X-Client-Request-Id"); got != "trace-abc.1" {
		t.Errorf("X-Client-Request-Id %q, want the client's id echoed", got)
	}
	if r.object(t)["request_id"] != id {
		t.Errorf("problem request_id is not the server's id %q: %s", id, r.body)
	}
	if again := b.do("GET", "/v1/nodes/424242", nil, "X-Request-Id", "trace-abc.1"); again.header.Get("X-Request-Id") == id {
		t.Error("two requests got the same server id")
	}

	// A write: the audit entry is filed under the server's id; the
	// client's id is a separate field.
	created := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", map[string]any{
		"ip": "10.9.0.1", "index": 0, "cpu_mem": 1, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil,
	}, "X-Request-Id", "forged-request-id"))
	var entries []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", nil)).json(t, &entries)
	if len(entries) != 1 {
		t.Fatalf("audit entries: %v", entries)
	}
	if got := entries[0]["request_id"]; got != created.header.Get("X-Request-Id") || got == "forged-request-id" {
		t.Errorf("audit request_id %v, want the server's %q", got, created.header.Get("X-Request-Id"))
	}
	if got := entries[0]["client_request_id"]; got != "forged-request-id" {
		t.Errorf("audit client_request_id %v", got)
	}

	// Ids that could pollute logs or headers are dropped, not stored; so
	// are two ids at once.
	path := created.header.Get("Location")
	lastID := entries[0]["id"]
	for i, bad := range [][]string{{`bad id"`}, {strings.Repeat("a", 65)}, {"x\ty"}, {"ünï"}, {"one", "two"}} {
		req, err := http.NewRequest("PATCH", b.url+path, strings.NewReader(fmt.Sprintf(`{"cpu_mem": %d}`, i+2)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+b.token)
		req.Header.Set("Content-Type", "application/json")
		for _, v := range bad {
			req.Header.Add("X-Request-Id", v)
		}
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%q: status %d", bad, resp.StatusCode)
		}
		if got := resp.Header.Get("X-Request-Id"); got == "" || got == bad[0] {
			t.Errorf("%q: X-Request-Id %q", bad, got)
		}
		if got, ok := resp.Header["X-Client-Request-Id"]; ok {
			t.Errorf("%q: echoed as %q", bad, got)
		}
		var last []map[string]any
		b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"after": lastID})).json(t, &last)
		if len(last) != 1 || last[0]["client_request_id"] != nil || last[0]["request_id"] != resp.Header.Get("X-Request-Id") {
			t.Fatalf("%q: audit entries %v", bad, last)
		}
		lastID = last[0]["id"]
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
	// The {pk} routes take any segment (a malformed pk is a 400), but an
	// action's path is never a pk: another method there is still a 405.
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/nodes/list", "POST"},
		{"PUT", "/v1/nodes/claim", "POST"},
		{"DELETE", "/v1/nodes/ping", "GET, HEAD"},
		{"PATCH", "/v1/nodes/watch", "GET, HEAD"},
		{"HEAD", "/v1/hardware/create", "POST"},
		{"GET", "/v1/hardware/list", "POST"},
		{"POST", "/v1/nodes/abc", "GET, HEAD, PUT, PATCH, DELETE"},
	} {
		r := b.must(http.StatusMethodNotAllowed, b.do(tc.method, tc.path, nil))
		if got := r.header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow = %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

// chiPattern matches a chi route parameter with a regexp, {pk:[0-9]+}.
var chiPattern = regexp.MustCompile(`\{(\w+):[^}]*\}`)

// notOperations are the routes that are not operations of openapi.yaml:
// the API browser, and the Prometheus exposition (docs/operating.md, Metrics).
var notOperations = []string{"GET /docs", "HEAD /docs", "GET /docs/*", "HEAD /docs/*", "GET /metrics"}

// The router and openapi.yaml describe the same operations, both ways.
func TestRoutesMatchSpec(t *testing.T) {
	doc, _ := apitest.Spec(t)
	srv := api.New(api.Config{Metrics: http.NotFoundHandler()})
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
	// The API browser (a page and the files it loads) is no operation of
	// the API, as the spec is none of its own operations' payloads: it is
	// routed but not in the contract.
	for _, r := range notOperations {
		if !slices.Contains(routed, r) {
			t.Errorf("%s is listed as routed but not an operation, yet it is not routed", r)
		}
	}
	routed = slices.DeleteFunc(routed, func(r string) bool { return slices.Contains(notOperations, r) })
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

// A successful ping is counted, not logged, unless LogHeartbeats asks for
// it; a failed ping and every other request are logged.
func TestHeartbeatAccessLog(t *testing.T) {
	for _, logBeats := range []bool{false, true} {
		t.Run(fmt.Sprint(logBeats), func(t *testing.T) { heartbeatAccessLog(t, logBeats) })
	}
}

func heartbeatAccessLog(t *testing.T, logBeats bool) {
	logs := &apitest.Buffer{}
	b := setup(t, func(c *api.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		c.LogHeartbeats = logBeats
	})
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil))
	b.must(http.StatusOK, b.do("GET", "/healthz", nil))
	b.must(http.StatusBadRequest, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", "x"))
	lines := map[string]int{}
	for line := range strings.Lines(logs.String()) {
		var l struct{ Msg, Path string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "request" {
			lines[l.Path]++
		}
	}
	if want := map[bool]int{false: 1, true: 2}[logBeats]; lines["/v1/nodes/ping"] != want || lines["/healthz"] != 1 {
		t.Errorf("LogHeartbeats %v: request lines by path %v, want %d for ping (the failed one%s) and 1 for /healthz",
			logBeats, lines, want, map[bool]string{false: "", true: " and the successful one"}[logBeats])
	}
}
