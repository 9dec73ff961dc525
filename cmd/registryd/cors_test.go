package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
)

func TestCORSConfig(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"ops.example.com", "https://ops.example.com/", "*,https://ops.example.com",
		"https://*.example.com", "https://ops.example.com,,https://b.example.com", "null"} {
		_, err := loadConfig(envFunc(map[string]string{"REGISTRY_CORS_ORIGINS": bad}))
		if err == nil || !strings.Contains(err.Error(), "REGISTRY_CORS_ORIGINS") {
			t.Errorf("REGISTRY_CORS_ORIGINS=%q: error %v does not name the variable", bad, err)
		}
	}
	cfg, err := loadConfig(envFunc(map[string]string{}))
	if err != nil || cfg.CORSOrigins != nil {
		t.Errorf("default: %q, %v; want CORS off", cfg.CORSOrigins, err)
	}
	cfg, err = loadConfig(envFunc(map[string]string{"REGISTRY_CORS_ORIGINS": "https://OPS.example.com:443, http://localhost:3000"}))
	if want := []string{"https://ops.example.com", "http://localhost:3000"}; err != nil || !slices.Equal(cfg.CORSOrigins, want) {
		t.Errorf("parsed %q, %v; want %q", cfg.CORSOrigins, err, want)
	}
}

// REGISTRY_CORS_ORIGINS reaches the server; /docs is served without a
// token by the real binary, under its CSP.
func TestServeCORSAndDocs(t *testing.T) {
	t.Parallel()
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_CORS_ORIGINS": "https://ops.example.com"})
	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path string, headers ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	r := do("OPTIONS", "/v1/nodes/list", "Origin", "https://ops.example.com", "Access-Control-Request-Method", "POST")
	if r.StatusCode != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Origin") != "https://ops.example.com" {
		t.Errorf("preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := do("OPTIONS", "/v1/nodes/list", "Origin", "https://evil.example.net", "Access-Control-Request-Method", "POST"); r.StatusCode != http.StatusForbidden {
		t.Errorf("preflight from another origin: %d", r.StatusCode)
	}
	r = do("GET", "/docs")
	if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("GET /docs: %d %v", r.StatusCode, r.Header)
	}
	if r := do("GET", "/docs/swagger-ui/swagger-ui-bundle.js"); r.StatusCode != http.StatusOK || r.ContentLength < 1<<20 {
		t.Errorf("the bundle: %d, %d bytes", r.StatusCode, r.ContentLength)
	}
}
