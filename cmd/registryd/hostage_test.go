package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
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

// A frozen replica holds nothing hostage. Two serve processes share a
// database; the sweeper's leader is caught mid-transaction (a cordon
// that has locked one node and waits for another) and SIGSTOPped. Within
// the leader TTL and a few seconds the other replica sweeps, and within
// the idle-in-transaction timeout and a few seconds a cordon of the
// frozen replica's locked node succeeds on the healthy one.
func TestFrozenLeaderIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_LISTEN": "127.0.0.1:0",
		"REGISTRY_LEADER_TTL": "2s", "REGISTRY_DB_IDLE_IN_TRANSACTION_TIMEOUT": "2s"}
	procs := []*process{startProcess(t, env, "serve"), startProcess(t, env, "serve")}
	urls := []string{procs[0].serving(t), procs[1].serving(t)}
	admin := adminToken(t, env)
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })

	// sweeperHolder is the pid of the process that holds the sweeper's
	// lease now, or 0.
	sweeperHolder := func() int {
		var holder string
		err := conn.QueryRow(ctx, `SELECT holder FROM leader_leases WHERE name = $1 AND expires_at > clock_timestamp()`, sweeperLease).Scan(&holder)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		fmt.Sscanf(holder[strings.LastIndex(holder, " ")+1:], "%d", &pid)
		return pid
	}
	apitest.Eventually(t, 10*time.Second, "a replica leads the sweeper", func() bool { return sweeperHolder() != 0 })
	leader, healthy := 0, 1
	if sweeperHolder() == procs[1].cmd.Process.Pid {
		leader, healthy = 1, 0
	}
	n := createNode(t, urls[healthy], admin, "10.6.0.1", 0)
	m := createNode(t, urls[healthy], admin, "10.6.0.1", 1)

	// The test holds m; the leader's cordon of n and m locks n, then waits.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = $1 FOR UPDATE`, m); err != nil {
		t.Fatal(err)
	}
	cordoned := make(chan struct{})
	go func() {
		defer close(cordoned)
		req, _ := http.NewRequest("POST", urls[leader]+"/v1/nodes/cordon", strings.NewReader(fmt.Sprintf(`{"nodes":[%d,%d],"reason":"frozen"}`, n, m)))
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := (&http.Client{Timeout: time.Minute}).Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waiting := func() bool {
		var waiters int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiters); err != nil {
			t.Fatal(err)
		}
		return waiters > 0
	}
	apitest.Eventually(t, 10*time.Second, "the leader's cordon waits for node m", waiting)

	frozen := procs[leader].cmd.Process
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() {
		frozen.Signal(syscall.SIGCONT)
		select {
		case <-cordoned:
		case <-time.After(time.Minute):
			t.Error("the frozen replica's cordon never answered after SIGCONT")
		}
	})
	// The leader's statement gets m now and its session sits idle in the
	// transaction, holding both rows, while its process is stopped.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	apitest.Eventually(t, 2*time.Second+5*time.Second, "the healthy replica takes the sweeper's lease",
		func() bool { return sweeperHolder() == procs[healthy].cmd.Process.Pid })
	t.Logf("the sweeper's lease moved %s after SIGSTOP (TTL 2s)", time.Since(stopped).Round(time.Millisecond))

	code, body := call(t, "POST", urls[healthy]+"/v1/nodes/cordon", fmt.Sprintf(`{"nodes":[%d],"reason":"healthy"}`, n), admin)
	if code != 200 {
		t.Fatalf("cordon on the healthy replica of the frozen one's locked node: %d %s", code, body)
	}
	if d := time.Since(stopped); d > 2*time.Second+5*time.Second {
		t.Errorf("the healthy replica's cordon succeeded %s after SIGSTOP; want within the 2s idle timeout and a few seconds", d)
	}
	t.Logf("the frozen replica's row lock went %s after SIGSTOP (idle-in-transaction timeout 2s)", time.Since(stopped).Round(time.Millisecond))
}
