package registryd_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/registryd/registryd"

// deps lists the non-test dependencies of pkg: import path → standard.
func deps(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	m := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, std, _ := strings.Cut(line, " ")
		m[path] = std == "true"
	}
	return m
}

// The layering the code relies on: the domain at the centre imports only
// the standard library; the HTTP layer never reaches storage or the driver
// except through its own interface; storage knows nothing of HTTP.
func TestLayering(t *testing.T) {
	t.Parallel()
	for path, std := range deps(t, module+"/internal/registry") {
		if !std && path != module+"/internal/registry" {
			t.Errorf("internal/registry imports %s; it may import only the standard library", path)
		}
	}
	for _, tc := range []struct {
		pkg       string
		forbidden []string
	}{
		{"/internal/api", []string{module + "/internal/store", "github.com/jackc/pgx", module + "/internal/pglocal"}},
		{"/internal/store", []string{module + "/internal/api", "github.com/go-chi/chi"}},
	} {
		for path := range deps(t, module+tc.pkg) {
			for _, f := range tc.forbidden {
				if strings.HasPrefix(path, f) {
					t.Errorf("%s imports %s", tc.pkg, path)
				}
			}
		}
	}
}
