package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// createNode creates a node through url and returns its pk.
func createNode(t *testing.T, url, token, ip string, index int) int64 {
	t.Helper()
	code, body := call(t, "POST", url+"/v1/nodes/create",
		fmt.Sprintf(`{"ip":%q,"index":%d,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, ip, index), token)
	var n struct{ PK int64 }
	if code != 201 || json.Unmarshal([]byte(body), &n) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	return n.PK
}

// A request that waits on a row lock another session holds for longer
// than REGISTRY_DB_LOCK_TIMEOUT answers 503 with Retry-After: 1 and says
// it waited on a lock, not that the database is unavailable.
func TestServeLockWaitIsBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_DB_LOCK_TIMEOUT": "300ms"}
	srv := startServer(t, env)
	admin := adminToken(t, env)
	pk := createNode(t, srv.url, admin, "10.5.0.1", 0)

	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = $1 FOR UPDATE`, pk); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("POST", srv.url+"/v1/nodes/cordon", strings.NewReader(fmt.Sprintf(`{"nodes":[%d],"reason":"fan"}`, pk)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := apitest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the cordon answered after %s; want about the 300ms lock timeout", d)
	}
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), "lock held by another") {
		t.Fatalf("cordon of a locked node: %d Retry-After %q %s; want 503, Retry-After 1, a lock wait named",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if strings.Contains(string(body), "unavailable") {
		t.Errorf("a lock wait called the database unavailable: %s", body)
	}
	// Once the lock is gone the same request succeeds.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := call(t, "POST", srv.url+"/v1/nodes/cordon", fmt.Sprintf(`{"nodes":[%d],"reason":"fan"}`, pk), admin); code != 200 {
		t.Fatalf("cordon after the lock went: %d %s", code, body)
	}
}
