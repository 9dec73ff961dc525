package registryd_test

import (
	"os/exec"
	"slices"
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

// layers says, for every package under internal/, which packages of this
// module it may depend on (directly or not). Dependencies point inward: the
// domain (internal/registry) and the stdlib-only helpers (jsonscan,
// lifecycle) at the centre, adapters around them. Siblings never import
// each other: each declares the small interface it uses, and cmd/registryd
// wires them. A new package must be added here.
var layers = map[string][]string{
	"internal/registry":              nil,
	"internal/jsonscan":              nil,
	"internal/lifecycle":             nil,
	"internal/logbatch":              nil,
	"internal/connlimit":             nil,
	"internal/docs":                  nil, // the API browser's files; internal/api serves them
	"internal/heartbeat":             nil,
	"internal/pglocal":               nil,
	"internal/provider":              nil,
	"internal/provider/e2e":          {"internal/provider"},
	"internal/provider/scp":          {"internal/provider"},
	"internal/api":                   {"internal/registry", "internal/jsonscan"},
	"internal/auth":                  {"internal/registry", "internal/jsonscan"},
	"internal/revoke":                {"internal/registry", "internal/lifecycle"},
	"internal/watch":                 {"internal/registry", "internal/lifecycle"},
	"internal/nodecache":             {"internal/registry"},
	"internal/syncer":                {"internal/registry", "internal/provider"},
	"internal/sweeper":               {"internal/registry", "internal/lifecycle"},
	"internal/store":                 {"internal/registry", "migrations"},
	"internal/metrics":               {"internal/registry"}, // consumers reach it through interfaces they declare
	"internal/agent":                 {"internal/registry", "internal/lifecycle"},
	"internal/agent/agenttest":       {""},
	"internal/apitest":               {""}, // test helpers: anything
	"internal/pgtest":                {""},
	"internal/tlstest":               {""},
	"internal/provider/providertest": {""},
	"internal/provider/e2e/e2etest":  {""},
	"internal/provider/scp/scptest":  {""},
	// The benchmark harness (make bench-http): a tool around the server,
	// never part of it. It seeds through SQL (or has registryd sync --once
	// import from the SCP fake), mints tokens and finds pgbench next to
	// the PostgreSQL server binaries.
	"internal/bench": {"internal/auth", "internal/registry", "internal/jsonscan", "internal/pglocal", "internal/provider/scp/scptest"},
}

// stdlibOnly are the packages that import nothing but the standard
// library, so that anything may use them.
var stdlibOnly = []string{"internal/registry", "internal/jsonscan", "internal/lifecycle", "internal/docs"}

// owners says which packages alone may use a third-party library: only
// the store speaks SQL (pglocal and pgtest run PostgreSQL itself), only
// the HTTP layer routes, only auth handles JWTs (the benchmark harness
// seeds through SQL and mints tokens with auth, so it may use both), only metrics speaks
// Prometheus (apitest parses what it serves).
var owners = map[string][]string{
	"github.com/jackc/pgx":      {"internal/store", "internal/pglocal", "internal/pgtest", "internal/bench"},
	"github.com/pressly/goose":  {"internal/store", "internal/pgtest"},
	"github.com/go-chi/chi":     {"internal/api"},
	"github.com/golang-jwt/jwt": {"internal/auth", "internal/bench"},      // the harness mints tokens through internal/auth
	"github.com/prometheus":     {"internal/metrics", "internal/apitest"}, // apitest parses scrapes
}

// The layering the code relies on, from `go list -deps`.
func TestLayering(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "./internal/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, full := range strings.Fields(string(out)) {
		pkg := strings.TrimPrefix(full, module+"/")
		allowed, ok := layers[pkg]
		if !ok {
			t.Errorf("%s is not in arch_test.go's layers: say which packages of this module it may use", pkg)
			continue
		}
		for path, std := range deps(t, full) {
			rel, ours := strings.CutPrefix(path, module+"/")
			switch {
			case std || path == full:
			case slices.Contains(stdlibOnly, pkg):
				t.Errorf("%s imports %s; it may import only the standard library", pkg, path)
			case ours && !slices.Contains(allowed, rel) && !slices.Contains(allowed, ""):
				t.Errorf("%s imports %s; of this module it may use only %v (declare an interface, let cmd/registryd wire it)", pkg, rel, allowed)
			}
			for lib, who := range owners {
				if strings.HasPrefix(path, lib) && !slices.Contains(who, pkg) {
					t.Errorf("%s imports %s; only %v may", pkg, path, who)
				}
			}
		}
	}
}

// clientDeps is everything the public Go client may pull into its users'
// builds: the generated code's runtime (parameter encoding, which needs
// uuid and jsonmerge) and YAML for the openapi.yaml answer. Nothing of
// the server.
var clientDeps = []string{
	module + "/client", module + "/client/internal/oapi",
	"github.com/oapi-codegen/runtime", "github.com/apapsch/go-jsonmerge/v2", "github.com/google/uuid",
	"go.yaml.in/yaml/v3",
}

// The client is a package other modules import: it stands alone.
func TestClientStandsAlone(t *testing.T) {
	t.Parallel()
	for path, std := range deps(t, module+"/client") {
		ok := std || slices.ContainsFunc(clientDeps, func(d string) bool { return path == d || strings.HasPrefix(path, d+"/") })
		if !ok {
			t.Errorf("the client imports %s; it may use only the standard library and %v", path, clientDeps)
		}
	}
}
