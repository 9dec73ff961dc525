package api_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/docs"
)

// plain sends one request with a client that does not hold the answer to
// openapi.yaml: the API browser is no operation of the API.
func plain(t *testing.T, method, url string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	client := &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: body}
}

// docsServer serves the API browser with nothing behind /v1: /docs needs
// no database and no token.
func docsServer(t *testing.T, fsys fs.FS) string {
	t.Helper()
	ts := httptest.NewServer(api.New(api.Config{OpenAPI: registryd.OpenAPI, Docs: fsys}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// checkDocsHeaders: every /docs answer, errors too, carries the browser
// protections.
func checkDocsHeaders(t *testing.T, what string, r response) {
	t.Helper()
	for h, want := range map[string]string{
		"Content-Security-Policy": api.DocsCSP,
		"X-Content-Type-Options":  "nosniff",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "no-referrer",
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s: %s %q, want %q", what, h, got, want)
		}
	}
}

// GET /docs is the page, open to anyone, under a strict CSP; it holds no
// inline script, style or event handler (the CSP would refuse them), and
// everything it loads is served from here with the right type.
func TestDocsPage(t *testing.T) {
	t.Parallel()
	base := docsServer(t, docs.FS())
	page := plain(t, "GET", base+"/docs")
	if page.status != http.StatusOK {
		t.Fatalf("GET /docs without a token: %d %s", page.status, page.body)
	}
	checkDocsHeaders(t, "/docs", page)
	if ct := page.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if page.header.Get("ETag") == "" || page.header.Get("Cache-Control") != "no-cache" {
		t.Errorf("ETag %q, Cache-Control %q: want an ETag and revalidation", page.header.Get("ETag"), page.header.Get("Cache-Control"))
	}
	html := string(page.body)
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<script(?:\s+[^>]*)?>`), // checked below: each needs a src
		regexp.MustCompile(`(?i)<style`),
		regexp.MustCompile(`(?i)\sstyle\s*=`),
		regexp.MustCompile(`(?i)\son[a-z]+\s*=`),
		regexp.MustCompile(`(?i)javascript:`),
		regexp.MustCompile(`(?i)https?://`),
	} {
		for _, m := range bad.FindAllString(html, -1) {
			if strings.HasPrefix(strings.ToLower(m), "<script") && strings.Contains(m, " src=") {
				continue
			}
			t.Errorf("the page has %q: the CSP refuses inline code, and nothing comes from elsewhere", m)
		}
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(html, -1)
	if len(refs) < 5 {
		t.Fatalf("the page loads only %v", refs)
	}
	pageURL, _ := url.Parse(base + "/docs")
	for _, ref := range refs {
		u, err := pageURL.Parse(ref[1])
		if err != nil {
			t.Fatal(err)
		}
		r := plain(t, "GET", u.String())
		if r.status != http.StatusOK || len(r.body) == 0 {
			t.Errorf("%s (from %q): %d", u.Path, ref[1], r.status)
			continue
		}
		want := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
			".png": "image/png", ".yaml": "application/yaml"}[path.Ext(u.Path)]
		if got := r.header.Get("Content-Type"); got != want {
			t.Errorf("%s: Content-Type %q, want %q", u.Path, got, want)
		}
		if strings.HasPrefix(u.Path, "/docs/") {
			checkDocsHeaders(t, u.Path, r)
		}
	}
}

// Every file of the UI is served at /docs/NAME, byte for byte, with an
// ETag that turns a revalidation into 304; HEAD answers as GET without the
// body; only GET and HEAD are allowed.
func TestDocsFiles(t *testing.T) {
	t.Parallel()
	base := docsServer(t, docs.FS())
	n := 0
	err := fs.WalkDir(docs.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || name == "index.html" {
			return err
		}
		n++
		want, err := fs.ReadFile(docs.FS(), name)
		if err != nil {
			return err
		}
		get := plain(t, "GET", base+"/docs/"+name)
		if get.status != http.StatusOK || string(get.body) != string(want) {
			t.Errorf("GET /docs/%s: %d, %d bytes (want %d)", name, get.status, len(get.body), len(want))
			return nil
		}
		checkDocsHeaders(t, name, get)
		etag := get.header.Get("ETag")
		if !regexp.MustCompile(`^"[0-9a-f]{32}"$`).MatchString(etag) || get.header.Get("Cache-Control") != "no-cache" {
			t.Errorf("%s: ETag %q, Cache-Control %q", name, etag, get.header.Get("Cache-Control"))
		}
		if r := plain(t, "GET", base+"/docs/"+name, "If-None-Match", etag); r.status != http.StatusNotModified || len(r.body) != 0 {
			t.Errorf("%s: revalidation gives %d with %d bytes, want 304", name, r.status, len(r.body))
		}
		if r := plain(t, "GET", base+"/docs/"+name, "If-None-Match", `"0123"`); r.status != http.StatusOK {
			t.Errorf("%s: a stale ETag gives %d, want 200", name, r.status)
		}
		head := plain(t, "HEAD", base+"/docs/"+name)
		for _, h := range []string{"Content-Type", "Content-Length", "ETag", "Content-Security-Policy"} {
			if head.header.Get(h) != get.header.Get(h) {
				t.Errorf("HEAD %s: %s %q, GET %q", name, h, head.header.Get(h), get.header.Get(h))
			}
		}
		if head.status != http.StatusOK || len(head.body) != 0 {
			t.Errorf("HEAD %s: %d with %d bytes", name, head.status, len(head.body))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 8 {
		t.Errorf("only %d files checked", n)
	}
	head, get := plain(t, "HEAD", base+"/docs"), plain(t, "GET", base+"/docs")
	if head.status != http.StatusOK || len(head.body) != 0 || head.header.Get("ETag") != get.header.Get("ETag") ||
		head.header.Get("Content-Length") != get.header.Get("Content-Length") {
		t.Errorf("HEAD /docs: %d, %v; GET %v", head.status, head.header, get.header)
	}
	if r := plain(t, "GET", base+"/docs", "If-None-Match", get.header.Get("ETag")); r.status != http.StatusNotModified {
		t.Errorf("GET /docs revalidated: %d", r.status)
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		r := plain(t, m, base+"/docs/init.js")
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /docs/init.js: %d, Allow %q", m, r.status, r.header.Get("Allow"))
		}
	}
}

// What is not a file of the UI is a 404 problem, under the same
// protections; /docs/ leads to /docs, relatively (a proxy's prefix stays).
func TestDocsNotFound(t *testing.T) {
	t.Parallel()
	base := docsServer(t, docs.FS())
	for _, p := range []string{"/docs/nope.js", "/docs/index.html", "/docs/swagger-ui", "/docs/swagger-ui/",
		"/docs/swagger-ui/swagger-ui-bundle.js.map", "/docs/..%2fopenapi.yaml", "/docs/%2e%2e/%2e%2e/go.mod", "/docs/swagger-ui//LICENSE"} {
		r := plain(t, "GET", base+p)
		if r.status != http.StatusNotFound || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("GET %s: %d %s %s", p, r.status, r.header.Get("Content-Type"), r.body)
		}
		checkDocsHeaders(t, p, r)
	}
	r := plain(t, "GET", base+"/docs/")
	if r.status != http.StatusMovedPermanently || r.header.Get("Location") != "../docs" {
		t.Errorf("GET /docs/: %d, Location %q", r.status, r.header.Get("Location"))
	}

	// A server built without the UI says so.
	bare := docsServer(t, nil)
	r = plain(t, "GET", bare+"/docs")
	if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "without the API browser") {
		t.Errorf("GET /docs without the UI: %d %s", r.status, r.body)
	}
}
