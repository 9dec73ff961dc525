package docs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/docs"
)

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := fs.ReadFile(docs.FS(), name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The vendored Swagger UI is the version the Makefile pins, byte for byte
// what `make swagger-ui` copied out of the checked npm tarball: an edit by
// hand, a file left over or missing, or a pin changed without a fetch
// fails here.
func TestVendoredSwaggerUI(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^SWAGGER_UI_VERSION\s*:=\s*(\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile pins no SWAGGER_UI_VERSION")
	}
	pinned := string(m[1])
	if got := strings.TrimSpace(read(t, "swagger-ui/VERSION")); got != pinned {
		t.Errorf("vendored swagger-ui-dist %s, the Makefile pins %s: run make swagger-ui", got, pinned)
	}
	if !strings.Contains(read(t, "swagger-ui/swagger-ui-bundle.js"), `PACKAGE_VERSION:"`+pinned+`"`) {
		t.Errorf("swagger-ui-bundle.js is not version %s", pinned)
	}

	sums := read(t, "swagger-ui/SHA256SUMS")
	listed := []string{"VERSION", "SHA256SUMS"}
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		listed = append(listed, name)
		got := sha256.Sum256([]byte(read(t, "swagger-ui/"+name)))
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("swagger-ui/%s differs from what make swagger-ui fetched", name)
		}
	}
	entries, err := fs.ReadDir(docs.FS(), "swagger-ui")
	if err != nil {
		t.Fatal(err)
	}
	var present []string
	for _, e := range entries {
		present = append(present, e.Name())
	}
	slices.Sort(listed)
	if !slices.Equal(present, listed) {
		t.Errorf("swagger-ui holds %v, make swagger-ui made %v", present, listed)
	}
	for _, f := range []string{"LICENSE", "NOTICE", "swagger-ui-bundle.js.LICENSE.txt"} {
		if !slices.Contains(present, f) {
			t.Errorf("the licence file %s is not vendored", f)
		}
	}
}

// What the page loads stays within its CSP: Swagger UI's stylesheet
// draws with data: images only (img-src 'self' data:) and loads no fonts
// or other stylesheets; registryd's own files name nothing elsewhere, and
// the initializer keeps the token out of storage, sends the spec's URL to
// no validator and takes no configuration from the query string.
func TestUIStaysWithinItsCSP(t *testing.T) {
	css := read(t, "swagger-ui/swagger-ui.css")
	urls := regexp.MustCompile(`url\(\s*["']?([^"')]{0,16})`).FindAllStringSubmatch(css, -1)
	if len(urls) == 0 {
		t.Fatal("no url() in swagger-ui.css: is it the real one?")
	}
	for _, u := range urls {
		if !strings.HasPrefix(u[1], "data:") {
			t.Errorf("swagger-ui.css loads %q: the CSP allows data: images only", u[1])
		}
	}
	for _, at := range []string{"@import", "@font-face"} {
		if strings.Contains(css, at) {
			t.Errorf("swagger-ui.css has %s: the CSP allows no other stylesheet or font", at)
		}
	}
	for _, own := range []string{"index.html", "init.js", "docs.css"} {
		if m := regexp.MustCompile(`(?i)\b(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}`).FindString(read(t, own)); m != "" {
			t.Errorf("%s names %q: the page loads nothing from elsewhere", own, m)
		}
	}
	init := read(t, "init.js")
	for _, setting := range []string{"validatorUrl: null", "queryConfigEnabled: false", "persistAuthorization: false", `url: new URL("openapi.yaml", root).href`} {
		if !strings.Contains(init, setting) {
			t.Errorf("init.js lacks %q", setting)
		}
	}
}
