package main

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
)

func TestStatementTimeoutConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(envFunc(map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StatementTimeout != 30*time.Second {
		t.Errorf("default %v, want 30s", cfg.StatementTimeout)
	}
	for _, v := range []string{"0", "50ms", "2h", "soon"} {
		_, err := loadConfig(envFunc(map[string]string{"REGISTRY_DB_STATEMENT_TIMEOUT": v}))
		if err == nil || !strings.Contains(err.Error(), "REGISTRY_DB_STATEMENT_TIMEOUT") {
			t.Errorf("REGISTRY_DB_STATEMENT_TIMEOUT=%s: %v", v, err)
		}
	}
	if cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_DB_STATEMENT_TIMEOUT": "2s"})); err != nil || cfg.StatementTimeout != 2*time.Second {
		t.Errorf("2s: %v %v", cfg.StatementTimeout, err)
	}
}

// The database stops answering (its backends frozen, as a host that hangs
// or a partition that resets nothing would leave them): a request on a
// connection the pool already holds is answered within the statement
// bound, not held until its client gives up.
func TestServeFrozenDatabase(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	// The one pooled connection may be held by a background loop (the
	// watch hub, the revocation list) at the moment the backends freeze;
	// the request then waits for it, up to the acquire timeout (10s by
	// default, beyond this test's 3s), so that wait is bounded as tightly
	// as the statement. Without it the test failed now and then under
	// `make test` on a loaded machine.
	env := map[string]string{"REGISTRY_DATABASE_URL": dbURL, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_DB_MAX_CONNS": "1", "REGISTRY_DB_STATEMENT_TIMEOUT": "300ms", "REGISTRY_DB_ACQUIRE_TIMEOUT": "300ms"}
	srv := startServer(t, env)
	tok := adminToken(t, env)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	var local bool
	if err := conn.QueryRow(ctx, "SELECT inet_server_addr() IS NULL").Scan(&local); err != nil {
		t.Fatal(err)
	}
	if !local {
		t.Skip("the test database's server is not on this machine; cannot freeze its backends")
	}
	if code, body := call(t, "GET", srv.url+"/v1/nodes/1", "", tok); code != http.StatusNotFound {
		t.Fatalf("before: %d %s", code, body)
	}
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
		if strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Skipf("cannot stop backend %d: %v", pid, err)
		}
		t.Cleanup(func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) })
	}

	start := time.Now()
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", srv.url+"/v1/nodes/1", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		// 503 when the statement ran on the frozen connection; 404 when the
		// pool's health check replaced it with a fresh one first.
		t.Logf("answered %d in %v", code, time.Since(start).Round(time.Millisecond))
		if code != http.StatusServiceUnavailable && code != http.StatusNotFound {
			t.Errorf("status %d, want 503 (or 404 from a fresh connection)", code)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a request on a frozen database was not answered within 3s")
	}
}
