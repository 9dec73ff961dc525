package api_test

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/registry"
)

func TestParseCORSOrigins(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"":                        nil,
		"  ":                      nil,
		"https://ops.example.com": {"https://ops.example.com"},
		" HTTPS://Ops.Example.com:443 , http://localhost:3000,https://ops.example.com": {"https://ops.example.com", "http://localhost:3000"},
		"http://[::1]:80,http://[::1]:8080":                                            {"http://[::1]", "http://[::1]:8080"},
		"http://10.0.0.7:443":                                                          {"http://10.0.0.7:443"}, // not the default port of http
		"*":                                                                            {"*"},
		" * ":                                                                          {"*"},
	} {
		got, err := api.ParseCORSOrigins(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseCORSOrigins(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"*,https://ops.example.com":                 "alone",
		"https://*.example.com":                     "wildcards",
		"ops.example.com":                           "scheme",
		"https://ops.example.com/":                  "no path",
		"https://ops.example.com/app":               "no path",
		"https://ops.example.com?x=1":               "no path",
		"https://ops.example.com?":                  "no path",
		"https://ops.example.com#":                  "no path",
		"https://ops.example.com#frag":              "no path",
		"ftp://ops.example.com":                     "scheme",
		"https://me:pw@ops.example.com":             "user",
		"https://":                                  "no host",
		"https:ops.example.com":                     "no host",
		"https://ops.example.com:0":                 "port",
		"https://ops.example.com:65536":             "port",
		"https://ops.example.com,,http://localhost": "empty",
		"https://ops.example.com,":                  "empty",
		"null":                                      "scheme",
		"https://ops.example.com:x":                 "want scheme://host",
	} {
		got, err := api.ParseCORSOrigins(in)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseCORSOrigins(%q) = %q, %v; want an error saying %q", in, got, err, why)
		}
	}
}

// auditEntries is the whole audit log.
func (b *bundle) auditEntries() []map[string]any {
	b.t.Helper()
	var entries []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", nil)).json(b.t, &entries)
	return entries
}

const (
	allowedOrigin = "https://ops.example.com"
	otherOrigin   = "https://evil.example.net"
)

// preflight sends what a browser sends before a cross-origin request that
// carries a token: no token, no body.
func (b *bundle) preflight(path, origin, method string) response {
	b.t.Helper()
	return plain(b.t, "OPTIONS", b.url+path, "Origin", origin, "Access-Control-Request-Method", method,
		"Access-Control-Request-Headers", "authorization,content-type,node-id,if-match")
}

// Without REGISTRY_CORS_ORIGINS nothing changes: no CORS header anywhere,
// a preflight is refused as any OPTIONS request is (401 under /v1, 405
// elsewhere), so browsers keep pages of other origins out.
func TestCORSOffByDefault(t *testing.T) {
	b := setup(t)
	for _, p := range []string{"/v1/nodes/list", "/openapi.yaml"} {
		r := b.preflight(p, allowedOrigin, "POST")
		if r.status < 400 || r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("preflight of %s: %d %v, want a refusal without CORS headers", p, r.status, r.header)
		}
	}
	got := b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Origin", allowedOrigin))
	for h := range got.header {
		if strings.HasPrefix(h, "Access-Control-") {
			t.Errorf("CORS is off, yet %s: %q", h, got.header.Get(h))
		}
	}
	if v := got.header.Values("Vary"); slices.Contains(v, "Origin") {
		t.Errorf("Vary %q with CORS off", v)
	}
}

// A preflight from an allowed origin is answered without a token: 204 and
// everything the real request may carry. Another origin's is 403 without
// a single CORS header. A preflight is no authenticated request: it runs
// no handler and a token on it (browsers send none) changes nothing.
func TestCORSPreflight(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.CORS = []string{allowedOrigin, "http://localhost:3000"} })
	pk := b.createNode(nil)
	before := len(b.auditEntries())
	for _, p := range []struct{ path, method string }{
		{"/v1/nodes/list", "POST"}, {"/v1/nodes/create", "POST"}, {"/v1/nodes/" + strconv.FormatInt(pk, 10), "PATCH"},
		{"/v1/nodes/" + strconv.FormatInt(pk, 10), "DELETE"}, {"/v1/nodes/watch", "GET"}, {"/v1/tokens/revoke", "POST"},
		{"/v1/hardware/1", "PUT"}, {"/openapi.yaml", "GET"}, {"/v1/no/such/thing", "GET"},
	} {
		r := b.preflight(p.path, allowedOrigin, p.method)
		if r.status != http.StatusNoContent || len(r.body) != 0 {
			t.Errorf("preflight %s %s: %d %s", p.method, p.path, r.status, r.body)
			continue
		}
		h := r.header
		if h.Get("Access-Control-Allow-Origin") != allowedOrigin || h.Get("Access-Control-Max-Age") != "7200" ||
			!slices.Contains(h.Values("Vary"), "Origin") || h.Get("Access-Control-Allow-Credentials") != "" ||
			h.Get("X-Request-Id") == "" {
			t.Errorf("preflight %s %s: headers %v", p.method, p.path, h)
		}
		for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
			if !slices.Contains(strings.Split(h.Get("Access-Control-Allow-Methods"), ", "), m) {
				t.Errorf("Access-Control-Allow-Methods %q lacks %s", h.Get("Access-Control-Allow-Methods"), m)
			}
		}
		for _, name := range []string{"Authorization", "Content-Type", "Node-Id", "If-Match", "If-None-Match", "Last-Event-ID", "X-Request-Id"} {
			if !slices.Contains(strings.Split(h.Get("Access-Control-Allow-Headers"), ", "), name) {
				t.Errorf("Access-Control-Allow-Headers %q lacks %s", h.Get("Access-Control-Allow-Headers"), name)
			}
		}
	}
	// The second origin of the list too, and with a token that is garbage:
	// nobody looks at it.
	r := plain(t, "OPTIONS", b.url+"/v1/nodes/"+strconv.FormatInt(pk, 10), "Origin", "http://localhost:3000",
		"Access-Control-Request-Method", "DELETE", "Authorization", "Bearer not-a-token")
	if r.status != http.StatusNoContent || r.header.Get("Access-Control-Allow-Origin") != "http://localhost:3000" {
		t.Errorf("preflight from the second origin: %d %v", r.status, r.header)
	}

	// Not allowed: other origins, an origin that differs only in scheme,
	// port or case of what browsers send, "null", two Origin headers.
	for _, origin := range [][]string{{otherOrigin}, {"http://ops.example.com"}, {"https://ops.example.com:8443"},
		{"null"}, {"https://ops.example.com.evil.example.net"}, {allowedOrigin, otherOrigin}} {
		headers := []string{"Access-Control-Request-Method", "DELETE"}
		for _, o := range origin {
			headers = append(headers, "Origin", o)
		}
		r := plain(t, "OPTIONS", b.url+"/v1/nodes/"+strconv.FormatInt(pk, 10), headers...)
		if r.status != http.StatusForbidden || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("preflight from %q: %d %s", origin, r.status, r.body)
		}
		for h := range r.header {
			if strings.HasPrefix(h, "Access-Control-") {
				t.Errorf("preflight from %q: %s %q", origin, h, r.header.Get(h))
			}
		}
	}

	// OPTIONS that is no preflight (no Origin, or no requested method) is
	// what it always was.
	if r := plain(t, "OPTIONS", b.url+"/v1/nodes/list", "Access-Control-Request-Method", "POST"); r.status != http.StatusUnauthorized {
		t.Errorf("OPTIONS without Origin: %d, want the 401 of a /v1 request without a token", r.status)
	}
	if r := plain(t, "OPTIONS", b.url+"/openapi.yaml", "Origin", allowedOrigin); r.status != http.StatusMethodNotAllowed {
		t.Errorf("OPTIONS without Access-Control-Request-Method: %d, want 405", r.status)
	}
	// No preflight reached a handler: the node is there, nothing audited.
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/"+strconv.FormatInt(pk, 10), nil))
	if after := len(b.auditEntries()); after != before {
		t.Errorf("preflights wrote %d audit entries", after-before)
	}
}

// The real requests of an allowed origin's page: answers it may read,
// errors included, with the headers it needs exposed. Permissions are the
// token's, as ever. Another origin's requests are served (CORS guards
// what a browser lets a page read, not the API) but carry no CORS header.
func TestCORSResponses(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.CORS = []string{allowedOrigin} })
	checkAllowed := func(what string, r response) {
		t.Helper()
		h := r.header
		if h.Get("Access-Control-Allow-Origin") != allowedOrigin || !slices.Contains(h.Values("Vary"), "Origin") ||
			h.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("%s: CORS headers %v", what, h)
		}
		exposed := strings.Split(h.Get("Access-Control-Expose-Headers"), ", ")
		for _, name := range []string{"ETag", "Location", "X-Request-Id", "X-Client-Request-Id", "Retry-After", "WWW-Authenticate"} {
			if !slices.Contains(exposed, name) {
				t.Errorf("%s: Access-Control-Expose-Headers %q lacks %s", what, h.Get("Access-Control-Expose-Headers"), name)
			}
		}
	}
	checkAllowed("ping", b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Origin", allowedOrigin)))
	created := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", map[string]any{
		"ip": "10.0.0.1", "index": 0, "cpu_mem": 1, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil,
	}, "Origin", allowedOrigin))
	checkAllowed("create", created)
	checkAllowed("retrieve", b.must(http.StatusOK, b.do("GET", created.header.Get("Location"), nil, "Origin", allowedOrigin)))
	checkAllowed("open endpoint", b.must(http.StatusOK, b.do("GET", "/openapi.yaml", nil, "Origin", allowedOrigin)))

	// Errors are readable too, and permissions are unchanged.
	checkAllowed("no token", b.must(http.StatusUnauthorized, b.do("GET", "/v1/nodes/ping", nil, "Origin", allowedOrigin, "Authorization", "")))
	reader := tokenFor(t, "reader-cors", registry.RoleReader)
	checkAllowed("reader creates", b.must(http.StatusForbidden, b.do("POST", "/v1/nodes/create", map[string]any{
		"ip": "10.0.0.2", "index": 0, "cpu_mem": 1, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil,
	}, "Origin", allowedOrigin, "Authorization", "Bearer "+reader)))
	checkAllowed("not found", b.must(http.StatusNotFound, b.do("GET", "/v1/nodes/424242", nil, "Origin", allowedOrigin)))

	// Other origins, and requests without Origin: served, no CORS header,
	// Vary: Origin all the same (a cache must not hand one to the other).
	for _, headers := range [][]string{{"Origin", otherOrigin}, {"Origin", "null"}, nil} {
		r := b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, headers...))
		for h := range r.header {
			if strings.HasPrefix(h, "Access-Control-") {
				t.Errorf("%v: %s %q", headers, h, r.header.Get(h))
			}
		}
		if !slices.Contains(r.header.Values("Vary"), "Origin") {
			t.Errorf("%v: Vary %q", headers, r.header.Values("Vary"))
		}
	}
}

// "*" allows every origin, without credentials.
func TestCORSAnyOrigin(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.CORS = []string{api.CORSAnyOrigin} })
	for _, origin := range []string{allowedOrigin, otherOrigin, "http://127.0.0.1:5173"} {
		r := b.preflight("/v1/nodes/list", origin, "POST")
		if r.status != http.StatusNoContent || r.header.Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("preflight from %s: %d %v", origin, r.status, r.header)
		}
		got := b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Origin", origin))
		if got.header.Get("Access-Control-Allow-Origin") != "*" || got.header.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("%s: %v", origin, got.header)
		}
	}
}
