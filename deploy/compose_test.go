package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func checkComposeFile(t *testing.T, compose, dockerfile string) string {
	t.Helper()
	server, _ := settings(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "docker-compose.yml")
	if err := os.WriteFile(file, []byte(compose), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := LoadCompose(ctx, file)
	if err != nil {
		return err.Error()
	}
	return strings.Join(CheckCompose(p, server, dockerfile), "\n")
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docker-compose.yml loads as `docker compose` loads it (schema-validated)
// and starts PostgreSQL, the migrations once, then registryd with a token
// key and a health check its image can run.
func TestCompose(t *testing.T) {
	t.Parallel()
	if got := checkComposeFile(t, readFile(t, "../docker-compose.yml"), readFile(t, "Dockerfile")); got != "" {
		t.Error(got)
	}
}

func TestComposeBroken(t *testing.T) {
	t.Parallel()
	compose, dockerfile := readFile(t, "../docker-compose.yml"), readFile(t, "Dockerfile")
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown key", "    read_only: true\n", "    read_only: true\n    readonly: true\n", "services.registryd.readonly false schema"},
		{"registryd before the migration", "        condition: service_completed_successfully\n      keygen:", "        condition: service_started\n      keygen:", "does not depend on migrate with condition service_completed_successfully"},
		{"no migrate service", "  migrate:\n", "  migrations:\n", `undefined service "migrate"`},
		{"migrations at every start", "      REGISTRY_JWT_SECRET_FILE: /run/registryd/jwt-secret\n", "      REGISTRY_JWT_SECRET_FILE: /run/registryd/jwt-secret\n      REGISTRY_MIGRATE: \"true\"\n", "REGISTRY_MIGRATE=true"},
		{"curl health check", `test: ["CMD", "/registryd", "healthcheck", "--path", "/readyz"]`, `test: ["CMD", "curl", "-f", "http://localhost:8080/readyz"]`, "no shell or curl"},
		{"no token key", "      REGISTRY_JWT_SECRET_FILE: /run/registryd/jwt-secret\n", "", "needs a token key"},
		{"a variable registryd does not read", "      REGISTRY_LISTEN: 0.0.0.0:8080\n", "      REGISTRY_LISTEN: 0.0.0.0:8080\n      REGISTRY_PORT: \"8080\"\n", "sets REGISTRY_PORT"},
		{"wrong port", `"127.0.0.1:8080:8080"`, `"127.0.0.1:8080:9090"`, "not REGISTRY_LISTEN's port"},
		{"published to the world", `"127.0.0.1:8080:8080"`, `"8080:8080"`, "beyond this machine"},
		{"postgres not awaited", "    depends_on:\n      postgres:\n        condition: service_healthy\n    restart: \"no\"\n", "    restart: \"no\"\n", "migrate does not depend on postgres"},
		{"wrong database", "      REGISTRY_DATABASE_URL: postgres://registry:registry@postgres:5432/registry?sslmode=disable\n      REGISTRY_LOG_FORMAT", "      REGISTRY_DATABASE_URL: postgres://registry:registry@localhost:5432/registry?sslmode=disable\n      REGISTRY_LOG_FORMAT", "migrate's REGISTRY_DATABASE_URL is not the postgres service's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if !strings.Contains(compose, tc.old) {
				t.Fatalf("docker-compose.yml does not contain %q", tc.old)
			}
			if got := checkComposeFile(t, strings.Replace(compose, tc.old, tc.new, 1), dockerfile); !strings.Contains(got, tc.want) {
				t.Errorf("want a complaint containing %q, got:\n%s", tc.want, got)
			}
		})
	}
	// The image must hold what the health check runs.
	broken := strings.Replace(dockerfile, `CMD ["/registryd", "healthcheck"]`, `CMD ["curl", "-f", "http://localhost:8080/healthz"]`, 1)
	if got := checkComposeFile(t, compose, broken); !strings.Contains(got, "no HEALTHCHECK that runs /registryd healthcheck") {
		t.Errorf("a Dockerfile health check with curl: %s", got)
	}
}
