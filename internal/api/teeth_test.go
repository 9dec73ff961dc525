package api_test

// Tests with teeth: each guards a line that a careless one-line edit could
// break while every other test still passes. The comment on each names the
// fault it catches; each was applied by hand and seen to fail the test.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/registry"
)

// lockRows opens a transaction on a connection of its own that holds the
// row locks of the given nodes (SELECT … FOR UPDATE), as a concurrent
// claimer or writer would, until the test ends or release is called.
func (b *bundle) lockRows(pks ...int64) (tx pgx.Tx, release func()) {
	b.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		b.t.Fatal(err)
	}
	tx, err = conn.Begin(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = ANY($1) FOR UPDATE`, pks); err != nil {
		b.t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			conn.Close(ctx)
		}
	}
	b.t.Cleanup(release)
	return tx, release
}

// waitForLockWait waits (at most 10s) until a session of the test's
// database waits on a row lock.
func (b *bundle) waitForLockWait() {
	b.t.Helper()
	apitest.Eventually(b.t, 10*time.Second, "a request waits on the row lock", func() bool {
		var n int
		err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
}

// within sets a deadline on the bundle's requests: a request that waits
// on a lock it should have skipped fails the test quickly.
func (b *bundle) within(d time.Duration) {
	prev := b.client.Timeout
	b.client.Timeout = d
	b.t.Cleanup(func() { b.client.Timeout = prev })
}

// A claim skips rows that others are locking instead of waiting for them.
// Fault caught: FOR UPDATE without SKIP LOCKED in the claim's pick (the
// claim then waits for the other transaction and times out).
func TestClaimSkipsLockedNodes(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	hosts := b.hosts(hw, 2, 2)
	b.lockRows(hosts[0][0])
	b.within(3 * time.Second)

	var c claimResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1, "count": 1})).json(t, &c)
	if len(c.Nodes) != 1 || c.Nodes[0].PK == hosts[0][0] {
		t.Errorf("claim of 1 with node %d locked: %v, want another node", hosts[0][0], c.pks())
	}
	// The same-host path: host 0 has a locked node, so host 1 it is.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 2, "count": 2, "same_host": true})).json(t, &c)
	if len(c.Nodes) != 2 || c.Nodes[0].IP != "10.9.1.1" || c.Nodes[1].IP != "10.9.1.1" {
		t.Errorf("same-host claim of 2 with a node of host 0 locked: %+v, want host 10.9.1.1's two", c.Nodes)
	}
}

// A same-host claim gives exactly count nodes on one host, never fewer: a
// host whose matching nodes are partly being claimed by someone else is
// passed over. Fault caught: accepting a host with fewer nodes locked than
// asked (len(pks) > 0 instead of len(pks) == c.Count in pickOneHost).
func TestClaimSameHostNeverShort(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	hosts := b.hosts(hw, 4, 4)
	b.lockRows(hosts[0][3]) // another claimer is taking one node of host 0

	var c claimResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1, "count": 4, "same_host": true})).json(t, &c)
	if len(c.Nodes) != 4 {
		t.Fatalf("same-host claim of 4 gave %d nodes: %v", len(c.Nodes), c.pks())
	}
	for _, n := range c.Nodes {
		if n.IP != "10.9.1.1" {
			t.Errorf("same-host claim of 4 with one node of host 0 locked: node %d on %s, want all on 10.9.1.1", n.PK, n.IP)
		}
	}
	// Nothing else matches now: 409, and host 0's free nodes stay free.
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 2, "count": 4, "same_host": true}))
	if held := b.held(); len(held) != 4 {
		t.Errorf("%d nodes held, want the 4 of job 1: %v", len(held), held)
	}
}

// An agent may act only as a node it owns. A node without an owner (made
// by an admin, or imported by the sync worker and not adopted yet) is no
// agent's: Node-Id naming it is refused on ping and on writes. Fault
// caught: MayActAs treating a nil owner as a match
// (n.Owner == nil || *n.Owner == p.Sub).
func TestAgentCannotActAsOwnerlessNode(t *testing.T) {
	b := setup(t)
	adminMade := b.createNode(map[string]any{"ip": "10.3.0.1"})
	mem := int64(80) << 30
	if _, err := b.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.3.0.2", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil); err != nil {
		t.Fatal(err)
	}
	var imported []struct{ PK int64 }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"source": "scp"})).json(t, &imported)
	if len(imported) != 1 {
		t.Fatalf("imported: %v", imported)
	}
	agent := "Bearer " + tokenFor(t, "agent-x", registry.RoleAgent)
	for _, pk := range []int64{adminMade, imported[0].PK} {
		id := fmt.Sprint(pk)
		before := b.must(http.StatusOK, b.do("GET", "/v1/nodes/"+id, nil)).body
		b.must(http.StatusForbidden, b.do("GET", "/v1/nodes/ping", nil, "Authorization", agent, "Node-Id", id))
		b.must(http.StatusForbidden, b.do("PATCH", "/v1/nodes/"+id, map[string]any{"cpu_mem": 7}, "Authorization", agent, "Node-Id", id))
		b.must(http.StatusForbidden, b.do("DELETE", "/v1/nodes/"+id, nil, "Authorization", agent, "Node-Id", id))
		if after := b.must(http.StatusOK, b.do("GET", "/v1/nodes/"+id, nil)).body; string(after) != string(before) {
			t.Errorf("node %d changed by refused requests:\n%s\n%s", pk, before, after)
		}
	}
	b.beats.Flush(context.Background()) //nolint:errcheck // nothing should be pending
	var seen int
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM node_liveness`).Scan(&seen); err != nil || seen != 0 {
		t.Errorf("a refused Node-Id counted as a heartbeat: %d rows, %v", seen, err)
	}
}

// If-Match is compared with the row as it is once locked, not as it was
// read before: a writer that commits while the request waits for the lock
// makes the old tag stale, so the request answers 412 and changes nothing.
// Fault caught: reading the current node without FOR UPDATE in
// UpdateNode / DeleteNode (the check then passes against the old version
// and the write lands on top of the other one).
func TestIfMatchComparedUnderTheLock(t *testing.T) {
	b := setup(t)
	for _, method := range []string{"PATCH", "DELETE"} {
		pk := b.createNode(map[string]any{"ip": "10.4.0.1", "index": len(method)})
		path := fmt.Sprint("/v1/nodes/", pk)
		tag := b.must(http.StatusOK, b.do("GET", path, nil)).header.Get("ETag")

		// The concurrent writer: an update in an open transaction.
		tx, _ := b.lockRows(pk)
		if _, err := tx.Exec(context.Background(), `UPDATE nodes SET cpu_mem = 99, version = version + 1 WHERE pk = $1`, pk); err != nil {
			t.Fatal(err)
		}
		answer := make(chan response, 1)
		go func() {
			var body any
			if method == "PATCH" {
				body = map[string]any{"cpu_mem": 5}
			}
			answer <- b.do(method, path, body, "If-Match", tag)
		}()
		b.waitForLockWait()
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-answer:
			if r.status != http.StatusPreconditionFailed {
				t.Errorf("%s with the tag from before a concurrent commit: %d %s, want 412", method, r.status, r.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer after the writer committed", method)
		}
		if got := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)["cpu_mem"]; got != float64(99) {
			t.Errorf("%s: cpu_mem %v, want the committed writer's 99", method, got)
		}
	}
}

// Adopting an imported node is a write like any other: it is audited, with
// the agent as principal and the node before and after. Fault caught: the
// adoption path not writing its audit entry.
func TestAdoptionIsAudited(t *testing.T) {
	b := setup(t)
	mem := int64(80) << 30
	if _, err := b.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.7.0.1", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil); err != nil {
		t.Fatal(err)
	}
	admin := b.token
	b.token = tokenFor(t, "agent-gpu-9", registry.RoleAgent)
	body := map[string]any{"ip": "10.7.0.1", "index": 0, "cpu_mem": 5, "driver_version": "560.35.03", "hardware_generation": nil, "gpu_mem": nil}
	n := b.must(http.StatusOK, b.do("POST", "/v1/nodes/create", body)).object(t)
	pk := int64(n["pk"].(float64))

	b.token = admin
	var entries []struct {
		Action, Principal, Role string
		Before, After           map[string]any
		RequestID               string `json:"request_id"`
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"target_type": "node", "target_pk": pk, "principal": "agent-gpu-9"})).json(t, &entries)
	if len(entries) != 1 {
		t.Fatalf("audit entries of the adopting agent: %+v, want one", entries)
	}
	e := entries[0]
	if e.Action != "node.adopt" || e.Role != "agent" || e.RequestID == "" {
		t.Errorf("adoption entry: %+v", e)
	}
	if e.Before["owner"] != nil || e.Before["source"] != "scp" {
		t.Errorf("before: %v, want the imported node without owner", e.Before)
	}
	if e.After["owner"] != "agent-gpu-9" || e.After["driver_version"] != "560.35.03" || e.After["external_id"] != "h1" {
		t.Errorf("after: %v, want the agent as owner and its driver version", e.After)
	}
}

// ?force=true is an admin's. An agent deleting its own node (Node-Id) that
// holds a job is refused with 403 when it asks to force it, 409 without,
// and the node stays. Fault caught: the admin check on force weakened
// (e.g. only refusing schedulers, who the role check stops earlier
// anyway).
func TestAgentCannotForceDelete(t *testing.T) {
	b := setup(t)
	admin := b.token
	b.token = tokenFor(t, "agent-gpu-3", registry.RoleAgent)
	pk := b.createNode(map[string]any{"ip": "10.5.0.1"})
	id := fmt.Sprint(pk)
	b.token = admin
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 3, "ip": "10.5.0.1"}))

	b.token = tokenFor(t, "agent-gpu-3", registry.RoleAgent)
	b.must(http.StatusConflict, b.do("DELETE", "/v1/nodes/"+id, nil, "Node-Id", id))
	r := b.must(http.StatusForbidden, b.do("DELETE", "/v1/nodes/"+id+"?force=true", nil, "Node-Id", id))
	if !strings.Contains(string(r.body), "admin") {
		t.Errorf("403 does not say who may force: %s", r.body)
	}
	if got := b.must(http.StatusOK, b.do("GET", "/v1/nodes/"+id, nil)).object(t)["current_job"]; got != float64(3) {
		t.Errorf("node after refused deletes: current_job %v, want 3", got)
	}
	// Its own node without a job it may delete.
	b.token = admin
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 3}))
	b.token = tokenFor(t, "agent-gpu-3", registry.RoleAgent)
	b.must(http.StatusNoContent, b.do("DELETE", "/v1/nodes/"+id, nil, "Node-Id", id))
}

// Every audit entry is written in the same transaction as its change: the
// audit row and the changed row carry the same xmin (the id of the
// transaction that wrote them). Fault caught: an audit written on the pool
// (its own transaction) instead of the change's transaction, which could
// leave a change without its entry or an entry without its change.
func TestAuditInTheSameTransaction(t *testing.T) {
	b := setup(t)
	xmins := func(table string, pk int64, action string) (row, audit string) {
		t.Helper()
		key := "pk"
		if err := b.store.Pool().QueryRow(context.Background(),
			`SELECT t.xmin::text, a.xmin::text FROM `+table+` t, audit_log a
			 WHERE t.`+key+` = $1 AND a.target_pk = $1 AND a.action = $2
			 ORDER BY a.id DESC LIMIT 1`, pk, action).Scan(&row, &audit); err != nil {
			t.Fatalf("%s %d %s: %v", table, pk, action, err)
		}
		return row, audit
	}
	check := func(table string, pk int64, action string) {
		t.Helper()
		if row, audit := xmins(table, pk, action); row != audit {
			t.Errorf("%s: the %s row was written by transaction %s, its audit entry by %s", action, table, row, audit)
		}
	}
	hw := b.createHardware("H100")
	check("hardware_generations", hw, "hardware.create")
	pk := b.createNode(map[string]any{"hardware_generation": hw})
	check("nodes", pk, "node.create")
	b.must(http.StatusOK, b.do("PATCH", fmt.Sprint("/v1/nodes/", pk), map[string]any{"cpu_mem": 5}))
	check("nodes", pk, "node.update")
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1}))
	check("nodes", pk, "node.claim")
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 1}))
	check("nodes", pk, "node.release")

	// Adoption too.
	mem := int64(80) << 30
	if _, err := b.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{{ExternalID: "h1", IP: "10.7.0.1", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true}}, nil); err != nil {
		t.Fatal(err)
	}
	b.token = tokenFor(t, "agent-gpu-9", registry.RoleAgent)
	r := b.must(http.StatusOK, b.do("POST", "/v1/nodes/create", map[string]any{"ip": "10.7.0.1", "index": 0, "cpu_mem": 5,
		"driver_version": "560.35.03", "hardware_generation": nil, "gpu_mem": nil}))
	var adopted struct{ PK int64 }
	if err := json.Unmarshal(r.body, &adopted); err != nil {
		t.Fatal(err)
	}
	check("nodes", adopted.PK, "node.adopt")
}
