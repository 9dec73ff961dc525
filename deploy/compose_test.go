package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// The keygen service's script makes a key long enough for registryd (at
// least 32 bytes; it makes 64 hex characters), readable by registryd's
// nonroot user only, and keeps it on the next `up`. Run here with sh on
// a folder of the test's instead of the volume.
func TestComposeKeygen(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the script chowns the key to uid 65532, which needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := LoadCompose(ctx, "../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	kg, err := p.GetService("keygen")
	if err != nil {
		t.Fatal(err)
	}
	if len(kg.Entrypoint) != 3 || kg.Entrypoint[0] != "sh" || len(kg.Volumes) != 1 {
		t.Fatalf("keygen: entrypoint %q, volumes %v", kg.Entrypoint, kg.Volumes)
	}
	dir := t.TempDir()
	script := strings.ReplaceAll(kg.Entrypoint[2], kg.Volumes[0].Target+"/", dir+"/")
	key := filepath.Join(dir, "jwt-secret")
	var first string
	for i := range 2 {
		out, err := exec.CommandContext(ctx, kg.Entrypoint[0], kg.Entrypoint[1], script).CombinedOutput()
		if err != nil {
			t.Fatalf("keygen: %v\n%s", err, out)
		}
		b, err := os.ReadFile(key)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(key)
		st := fi.Sys().(*syscall.Stat_t)
		if len(b) != 64 || strings.Trim(string(b), "0123456789abcdef") != "" || fi.Mode().Perm() != 0o400 || st.Uid != 65532 {
			t.Fatalf("key %q, mode %v, owner %d", b, fi.Mode(), st.Uid)
		}
		if i == 0 {
			first = string(b)
		} else if string(b) != first {
			t.Error("a second run replaced the key: every token minted before would be refused")
		}
	}
}
