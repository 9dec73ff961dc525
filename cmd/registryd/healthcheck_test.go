package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
)

// `registryd healthcheck` against a real server: healthy and ready, then a
// newer schema (another replica migrated) makes /readyz, and so the
// readiness check, fail while /healthz stays healthy; a stopped server
// fails both.
func TestHealthcheckServe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret})
	listen := strings.TrimPrefix(srv.url, "http://")
	env := map[string]string{"REGISTRY_LISTEN": listen}
	for _, path := range []string{"/healthz", "/readyz"} {
		if out, stderr, err := runCmd(t, env, "healthcheck", "--path", path); err != nil || !strings.Contains(out, "200 OK") {
			t.Fatalf("healthcheck %s: %v %q %q", path, err, out, stderr)
		}
	}

	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(context.Background(), `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, true)`)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, env, "healthcheck", "--path", "/readyz"); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "newer than this registryd knows") {
		t.Errorf("readiness on a newer schema: %v", err)
	}
	if _, _, err := runCmd(t, env, "healthcheck"); err != nil {
		t.Errorf("liveness on a newer schema: %v", err)
	}

	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, env, "healthcheck"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("healthcheck of a stopped server: %v", err)
	}
}

func TestHealthcheckAnswers(t *testing.T) {
	t.Parallel()
	unhealthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unhealthy: embedded PostgreSQL is down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(unhealthy.Close)
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })

	if _, _, err := runCmd(t, nil, "healthcheck", "--url", unhealthy.URL+"/healthz"); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "embedded PostgreSQL is down") {
		t.Errorf("503: %v", err)
	}
	start := time.Now()
	if _, _, err := runCmd(t, nil, "healthcheck", "--url", slow.URL, "--timeout", "200ms"); err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Errorf("a server that does not answer: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("--timeout 200ms took %s", d)
	}
	for _, listen := range []string{"127.0.0.1:0", "nonsense"} {
		if _, _, err := runCmd(t, map[string]string{"REGISTRY_LISTEN": listen}, "healthcheck"); err == nil || !strings.Contains(err.Error(), "REGISTRY_LISTEN") {
			t.Errorf("REGISTRY_LISTEN=%s: %v", listen, err)
		}
	}
	if stdout, _, err := runCmd(t, nil, "healthcheck", "--help"); err != nil || !strings.Contains(stdout, "--path") {
		t.Errorf("--help: %v %q", err, stdout)
	}
	if _, _, err := runCmd(t, nil, "healthcheck", "extra"); err != errUsage {
		t.Errorf("an argument: %v", err)
	}
}

func TestListenURL(t *testing.T) {
	t.Parallel()
	for listen, want := range map[string]string{
		"0.0.0.0:8080":   "http://127.0.0.1:8080",
		":8080":          "http://127.0.0.1:8080",
		"[::]:9000":      "http://[::1]:9000",
		"10.1.2.3:80":    "http://10.1.2.3:80",
		"localhost:8080": "http://localhost:8080",
	} {
		if got, err := listenURL(listen); err != nil || got != want {
			t.Errorf("listenURL(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
}
