package api_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/registry"
)

func TestAuthenticationRequired(t *testing.T) {
	b := setup(t)
	b.token = ""
	for _, ep := range []struct{ method, path string }{
		{"GET", "/v1/nodes/ping"}, {"POST", "/v1/nodes/list"}, {"POST", "/v1/nodes/create"},
		{"GET", "/v1/nodes/1"}, {"PUT", "/v1/nodes/1"}, {"PATCH", "/v1/nodes/1"}, {"DELETE", "/v1/nodes/1"},
		{"POST", "/v1/hardware/list"}, {"POST", "/v1/hardware/create"}, {"GET", "/v1/hardware/1"},
		{"PUT", "/v1/hardware/1"}, {"PATCH", "/v1/hardware/1"}, {"DELETE", "/v1/hardware/1"},
		{"POST", "/v1/audit/list"}, {"POST", "/v1/nodes/claim"}, {"POST", "/v1/nodes/release"},
		{"POST", "/v1/tokens/revoke"},
	} {
		r := b.must(http.StatusUnauthorized, b.do(ep.method, ep.path, nil))
		if got := r.header.Get("WWW-Authenticate"); got != `Bearer realm="registryd"` {
			t.Errorf("%s %s: WWW-Authenticate %q", ep.method, ep.path, got)
		}
	}
	// The probes and the contract stay open.
	for _, p := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
		b.must(http.StatusOK, b.do("GET", p, nil))
	}
	b.must(http.StatusUnauthorized, b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Basic YWRtaW46YWRtaW4="))
}

func TestInvalidTokens(t *testing.T) {
	logs := &apitest.Buffer{}
	b := setup(t, func(c *api.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	expired, _ := signAt(t, time.Now().Add(-2*time.Hour), time.Hour)
	for name, tok := range map[string]string{
		"garbage":      "abc.def.ghi",
		"expired":      expired,
		"wrong secret": handMadeToken([]byte("some-other-secret-some-other-secret!"), `{"alg":"HS256","typ":"JWT"}`, fmt.Sprintf(`{"sub":"x","role":"admin","exp":%d}`, time.Now().Add(time.Hour).Unix())),
		"alg none":     base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"x","role":"admin","exp":%d}`, time.Now().Add(time.Hour).Unix()))) + ".",
		"unknown role": handMadeToken(testSecret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"x","role":"root","exp":%d}`, time.Now().Add(time.Hour).Unix())),
		"no exp":       handMadeToken(testSecret, `{"alg":"HS256"}`, `{"sub":"x","role":"admin"}`),
	} {
		r := b.must(http.StatusUnauthorized, b.do("POST", "/v1/nodes/list", nil, "Authorization", "Bearer "+tok))
		ch := r.header.Get("WWW-Authenticate")
		if !strings.HasPrefix(ch, `Bearer realm="registryd", error="invalid_token"`) {
			t.Errorf("%s: WWW-Authenticate %q", name, ch)
		}
		if strings.Contains(string(r.body), tok) || strings.Contains(ch, tok) {
			t.Errorf("%s: the response echoes the token", name)
		}
		// Not even a piece of it (the signature part) reaches the log.
		parts := strings.Split(tok, ".")
		if sig := parts[len(parts)-1]; len(sig) > 8 && strings.Contains(logs.String(), sig) {
			t.Errorf("%s: the log contains the token", name)
		}
	}
	if !strings.Contains(logs.String(), `"status":401`) {
		t.Errorf("the refusals were not logged at all:\n%s", logs.String())
	}
}

// A token made by hand with the shared secret, not by registryd's code,
// is accepted: the format is plain RFC 7519 HS256.
func TestHandMadeToken(t *testing.T) {
	b := setup(t)
	tok := handMadeToken(testSecret, `{"alg":"HS256","typ":"JWT"}`,
		fmt.Sprintf(`{"sub":"ops-script","role":"reader","exp":%d}`, time.Now().Add(time.Hour).Unix()))
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+tok))
	// A reader may read but not write.
	b.must(http.StatusForbidden, b.do("POST", "/v1/hardware/create", map[string]any{"name": "X"}, "Authorization", "Bearer "+tok))
}

func handMadeToken(key []byte, header, claims string) string {
	s := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(s))
	return s + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func signAt(t *testing.T, at time.Time, ttl time.Duration) (string, error) {
	t.Helper()
	return handMadeToken(testSecret, `{"alg":"HS256"}`,
		fmt.Sprintf(`{"sub":"old","role":"admin","iat":%d,"exp":%d}`, at.Unix(), at.Add(ttl).Unix())), nil
}

// fixture is what one matrix case works on: nodes of two agents and a
// hardware generation, made fresh so cases never see each other's writes.
type fixture struct {
	own, other, hw int64
}

var seq atomic.Int64

func (b *bundle) fixture() fixture {
	b.t.Helper()
	ctx := context.Background()
	// agent-a's node lies inside the bound agent's addresses (10.200/16),
	// which it may act as; agent-b's outside.
	mk := func(owner string, net int64) int64 {
		i := seq.Add(1)
		n, _, err := b.store.CreateNode(ctx, registry.Actor{Principal: registry.Principal{Sub: owner, Role: registry.RoleAgent}},
			registry.NodeSpec{IP: fmt.Sprintf("10.%d.%d.%d", net+i>>16&255, i>>8&255, i&255), DriverVersion: "550"})
		if err != nil {
			b.t.Fatal(err)
		}
		return n.PK
	}
	i := seq.Add(1)
	hw, err := b.store.CreateHardware(ctx, registry.Actor{Principal: registry.Principal{Sub: "admin", Role: registry.RoleAdmin}},
		registry.HardwareSpec{Name: fmt.Sprintf("GPU-%d", i)})
	if err != nil {
		b.t.Fatal(err)
	}
	return fixture{own: mk("agent-a", 200), other: mk("agent-b", 0), hw: hw.PK}
}

// snapshot is everything a refused request must leave alone.
type snapshot struct {
	Nodes    map[int64]registry.Node
	Hardware map[int64]registry.Hardware
	Audit    int
	Total    int
}

func (b *bundle) snapshot(f fixture, missing int64) snapshot {
	b.t.Helper()
	ctx := context.Background()
	s := snapshot{Nodes: map[int64]registry.Node{}, Hardware: map[int64]registry.Hardware{}}
	for _, pk := range []int64{f.own, f.other, missing} {
		if n, err := b.store.GetNode(ctx, pk); err == nil {
			s.Nodes[pk] = n
		}
	}
	if h, err := b.store.GetHardware(ctx, f.hw); err == nil {
		s.Hardware[f.hw] = h
	}
	for _, q := range []struct {
		dst *int
		sql string
	}{
		{&s.Audit, fmt.Sprintf("SELECT count(*) FROM audit_log WHERE target_pk IN (%d, %d, %d, %d)", f.own, f.other, f.hw, missing)},
		{&s.Total, "SELECT count(*) FROM audit_log"},
	} {
		if err := b.store.Pool().QueryRow(ctx, q.sql).Scan(q.dst); err != nil {
			b.t.Fatal(err)
		}
	}
	return s
}

// TestPermissionMatrix walks every endpoint for every role and every node
// relation. Expectations are written from the permission table of the
// authentication issue, not derived from the code.
func TestPermissionMatrix(t *testing.T) {
	b := setup(t)
	const missing = int64(9_000_000)

	type principal struct {
		name string
		role registry.Role
		sub  string
		ips  []string // an agent token bound to these addresses
	}
	principals := []principal{
		{"reader", registry.RoleReader, "reader-1", nil},
		{"scheduler", registry.RoleScheduler, "sched-1", nil},
		{"agent", registry.RoleAgent, "agent-a", nil}, // owns fixture.own
		// The same agent with a token bound to the addresses its nodes are
		// created at (10.200/16), not those PUT moves them to (10.201/16).
		{"bound agent", registry.RoleAgent, "agent-a", []string{"10.200.0.0/16"}},
		{"admin", registry.RoleAdmin, "admin-1", nil},
	}
	// relation: which Node-Id is sent and which node the request targets.
	relations := []string{"own", "other", "none", "malformed", "missing"}

	type endpoint struct {
		name   string
		method string
		path   func(f fixture, target int64) string
		body   func(f fixture) any
		ok     int                 // status on success
		perm   registry.Permission // what the role needs
		node   bool                // a write to the target node: agents only on their own
		reads  bool                // reads the target node (404 when missing)
	}
	nodePath := func(f fixture, target int64) string { return fmt.Sprintf("/v1/nodes/%d", target) }
	hwPath := func(f fixture, _ int64) string { return fmt.Sprintf("/v1/hardware/%d", f.hw) }
	endpoints := []endpoint{
		{name: "ping", method: "GET", path: func(fixture, int64) string { return "/v1/nodes/ping" }, ok: 200, perm: registry.PermRead},
		{name: "list nodes", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/list" }, ok: 200, perm: registry.PermRead},
		{name: "retrieve node", method: "GET", path: nodePath, ok: 200, perm: registry.PermRead, reads: true},
		{name: "create node", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/create" },
			body: func(fixture) any {
				i := seq.Add(1)
				return map[string]any{"ip": fmt.Sprintf("10.200.%d.%d", i>>8&255, i&255), "index": 0, "cpu_mem": 1, "driver_version": "d", "hardware_generation": nil, "gpu_mem": nil}
			}, ok: 201, perm: registry.PermCreateNode},
		{name: "update node", method: "PUT", path: nodePath,
			body: func(fixture) any {
				i := seq.Add(1)
				return map[string]any{"ip": fmt.Sprintf("10.201.%d.%d", i>>8&255, i&255), "index": 0, "cpu_mem": 2, "driver_version": "d2", "hardware_generation": nil, "gpu_mem": nil}
			}, ok: 200, perm: registry.PermWriteNode, node: true, reads: true},
		{name: "patch node", method: "PATCH", path: nodePath, body: func(fixture) any { return map[string]any{"cpu_mem": 3} },
			ok: 200, perm: registry.PermWriteNode, node: true, reads: true},
		{name: "destroy node", method: "DELETE", path: nodePath, ok: 204, perm: registry.PermWriteNode, node: true, reads: true},
		{name: "claim", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/claim" },
			body: func(fixture) any { return map[string]any{"job": seq.Add(1)} }, ok: 200, perm: registry.PermClaim},
		{name: "release", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/release" },
			body: func(fixture) any { return map[string]any{"job": seq.Add(1)} }, ok: 200, perm: registry.PermClaim},
		// A job that holds nothing: the role may renew, and learns the job holds nothing.
		{name: "renew", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/renew" },
			body: func(fixture) any { return map[string]any{"job": seq.Add(1), "lease_seconds": 60} }, ok: 404, perm: registry.PermClaim},
		{name: "cordon", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/cordon" },
			body: func(f fixture) any { return map[string]any{"nodes": []int64{f.own, f.other}, "reason": "maintenance"} }, ok: 200, perm: registry.PermCordon},
		{name: "uncordon", method: "POST", path: func(fixture, int64) string { return "/v1/nodes/uncordon" },
			body: func(f fixture) any { return map[string]any{"nodes": []int64{f.own, f.other}} }, ok: 200, perm: registry.PermCordon},
		{name: "list hardware", method: "POST", path: func(fixture, int64) string { return "/v1/hardware/list" }, ok: 200, perm: registry.PermRead},
		{name: "retrieve hardware", method: "GET", path: hwPath, ok: 200, perm: registry.PermRead},
		{name: "create hardware", method: "POST", path: func(fixture, int64) string { return "/v1/hardware/create" },
			body: func(fixture) any { return map[string]any{"name": fmt.Sprintf("new-%d", seq.Add(1))} }, ok: 201, perm: registry.PermWriteHardware},
		{name: "update hardware", method: "PUT", path: hwPath, body: func(fixture) any { return map[string]any{"name": fmt.Sprintf("renamed-%d", seq.Add(1))} },
			ok: 200, perm: registry.PermWriteHardware},
		{name: "patch hardware", method: "PATCH", path: hwPath, body: func(fixture) any { return map[string]any{"name": fmt.Sprintf("patched-%d", seq.Add(1))} },
			ok: 200, perm: registry.PermWriteHardware},
		{name: "destroy hardware", method: "DELETE", path: hwPath, ok: 204, perm: registry.PermWriteHardware},
		{name: "read audit log", method: "POST", path: func(fixture, int64) string { return "/v1/audit/list" }, ok: 200, perm: registry.PermReadAudit},
		{name: "revoke tokens", method: "POST", path: func(fixture, int64) string { return "/v1/tokens/revoke" },
			body: func(fixture) any { return map[string]any{"sub": fmt.Sprintf("nobody-%d", seq.Add(1))} }, ok: 200, perm: registry.PermRevokeTokens},
	}
	// The table of the issue: who may do what at all.
	allowed := map[registry.Role]map[registry.Permission]bool{
		registry.RoleReader:    {registry.PermRead: true},
		registry.RoleScheduler: {registry.PermRead: true, registry.PermClaim: true},
		registry.RoleAgent:     {registry.PermRead: true, registry.PermCreateNode: true, registry.PermWriteNode: true},
		registry.RoleAdmin: {registry.PermRead: true, registry.PermCreateNode: true, registry.PermWriteNode: true, registry.PermClaim: true,
			registry.PermWriteHardware: true, registry.PermReadAudit: true, registry.PermRevokeTokens: true, registry.PermCordon: true},
	}

	expect := func(ep endpoint, p principal, rel string) int {
		// Node-Id comes first: malformed is 400 for anyone; only the owning
		// agent or an admin may act as a node; an admin naming a missing
		// node learns it is missing, anyone else gets the same 403.
		switch rel {
		case "malformed":
			return 400
		case "own":
			if p.role != registry.RoleAgent && p.role != registry.RoleAdmin {
				return 403
			}
		case "other":
			if p.role != registry.RoleAdmin {
				return 403
			}
		case "missing":
			if p.role == registry.RoleAdmin {
				return 404
			}
			return 403
		}
		if !allowed[p.role][ep.perm] {
			return 403
		}
		// An agent writes a node only acting as that very node.
		if ep.node && p.role == registry.RoleAgent && rel != "own" {
			return 403
		}
		// A bound agent may not move a node outside its addresses.
		if p.ips != nil && ep.name == "update node" {
			return 403
		}
		return ep.ok
	}

	for _, ep := range endpoints {
		for _, p := range principals {
			for _, rel := range relations {
				t.Run(ep.name+"/"+p.name+"/"+rel, func(t *testing.T) {
					f := b.fixture()
					var nodeID string
					target := f.own
					switch rel {
					case "own":
						nodeID = fmt.Sprint(f.own)
					case "other":
						nodeID, target = fmt.Sprint(f.other), f.other
					case "malformed":
						nodeID = "node-7"
					case "missing":
						nodeID, target = fmt.Sprint(missing), missing
					}
					var body any
					if ep.body != nil {
						body = ep.body(f)
					}
					// Heartbeats are written in batches: flush around the
					// request so one a refused request recorded would show.
					if err := b.beats.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
					before := b.snapshot(f, missing)
					tok := tokenFor(t, p.sub, p.role)
					if p.ips != nil {
						tok = boundToken(t, p.sub, p.ips...)
					}
					r := b.do(ep.method, ep.path(f, target), body,
						"Authorization", "Bearer "+tok, "Node-Id", nodeID)
					want := expect(ep, p, rel)
					if r.status != want {
						t.Fatalf("status %d, want %d; body %s", r.status, want, r.body)
					}
					// A refusal for the role names what it may not do.
					if r.status == 403 && rel == "none" && !allowed[p.role][ep.perm] {
						if detail, _ := r.object(t)["detail"].(string); !strings.HasPrefix(detail, "role ") ||
							strings.HasSuffix(strings.TrimSpace(detail), "may not") {
							t.Fatalf("403 without the permission's name: %q", detail)
						}
					}
					if err := b.beats.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
					if r.status >= 400 {
						if r.status == 403 && !strings.Contains(string(r.body), `"detail"`) {
							t.Errorf("403 without a reason: %s", r.body)
						}
						after := b.snapshot(f, missing)
						if diff := cmp.Diff(before, after); diff != "" {
							t.Errorf("a refused request changed the database (-before +after):\n%s", diff)
						}
					}
				})
			}
		}
	}
}

// A node's agent keeps it alive with ping + Node-Id; the heartbeat lands
// within a flush, is not audited, and a refused request records none.
func TestHeartbeat(t *testing.T) {
	b := setup(t)
	f := b.fixture()
	agent := tokenFor(t, "agent-a", registry.RoleAgent)
	before := b.snapshot(f, 0)

	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+agent, "Node-Id", fmt.Sprint(f.own)))
	// Refused: agent-a may not act as agent-b's node.
	b.must(http.StatusForbidden, b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+agent, "Node-Id", fmt.Sprint(f.other)))
	// Refused after Node-Id passed: an agent may not create hardware.
	b.must(http.StatusForbidden, b.do("POST", "/v1/hardware/create", map[string]any{"name": "Z"}, "Authorization", "Bearer "+agent, "Node-Id", fmt.Sprint(f.own)))
	if err := b.beats.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	own, _ := b.store.GetNode(context.Background(), f.own)
	other, _ := b.store.GetNode(context.Background(), f.other)
	if own.LastSeen == nil || time.Since(*own.LastSeen) > time.Minute {
		t.Errorf("own node last_seen = %v after a ping", own.LastSeen)
	}
	if other.LastSeen != nil {
		t.Errorf("a refused Node-Id recorded a heartbeat: %v", other.LastSeen)
	}
	if own.Version != before.Nodes[f.own].Version {
		t.Errorf("a heartbeat changed the version")
	}
	if after := b.snapshot(f, 0); after.Audit != before.Audit {
		t.Errorf("heartbeats were audited: %d → %d entries", before.Audit, after.Audit)
	}
	// last_seen never goes backwards, whatever order flushes land in.
	if err := b.store.TouchNodes(context.Background(), []int64{f.own}, []time.Time{own.LastSeen.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	again, _ := b.store.GetNode(context.Background(), f.own)
	if !again.LastSeen.Equal(*own.LastSeen) {
		t.Errorf("last_seen moved back from %v to %v", own.LastSeen, again.LastSeen)
	}
}

// Agents own what they register, and their refusals say why.
func TestAgentOwnership(t *testing.T) {
	b := setup(t)
	b.token = tokenFor(t, "agent-gpu-1", registry.RoleAgent)
	r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", validNode()))
	n := r.object(t)
	if n["owner"] != "agent-gpu-1" {
		t.Fatalf("owner = %v", n["owner"])
	}
	pk := fmt.Sprint(n["pk"])
	r = b.must(http.StatusForbidden, b.do("PATCH", "/v1/nodes/"+pk, map[string]any{"cpu_mem": 5}))
	if !strings.Contains(string(r.body), "Node-Id: "+pk) {
		t.Errorf("403 does not say how to act as the node: %s", r.body)
	}
	b.must(http.StatusOK, b.do("PATCH", "/v1/nodes/"+pk, map[string]any{"cpu_mem": 5}, "Node-Id", pk))
	// The owner is read-only: echoing it is fine, changing it is not.
	r = b.must(http.StatusBadRequest, b.do("PATCH", "/v1/nodes/"+pk, map[string]any{"owner": "someone-else"}, "Node-Id", pk))
	if diff := cmp.Diff([]string{"owner"}, r.problemFields(t)); diff != "" {
		t.Errorf("fields: %s", diff)
	}
	b.must(http.StatusOK, b.do("PATCH", "/v1/nodes/"+pk, map[string]any{"owner": "agent-gpu-1"}, "Node-Id", pk))
	// A second node of the same agent cannot be changed while acting as the first.
	other := b.do("POST", "/v1/nodes/create", with("index", 1)).object(t)["pk"]
	r = b.must(http.StatusForbidden, b.do("DELETE", fmt.Sprint("/v1/nodes/", other), nil, "Node-Id", pk))
	if !strings.Contains(string(r.body), "Node-Id names node "+pk) {
		t.Errorf("403 does not explain the mismatch: %s", r.body)
	}
	// Admins create ownerless nodes.
	b.token = tokenFor(t, "root", registry.RoleAdmin)
	if o := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", with("index", 5))).object(t)["owner"]; o != nil {
		t.Errorf("admin-created node owner = %v", o)
	}
}

func TestAuditLog(t *testing.T) {
	b := setup(t)
	b.token = tokenFor(t, "agent-9", registry.RoleAgent)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	patched := b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"driver_version": "560.1"}, "Node-Id", fmt.Sprint(pk), "X-Request-Id", "req-patch-1"))
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{}, "Node-Id", fmt.Sprint(pk))) // no change: no entry
	b.token = tokenFor(t, "root", registry.RoleAdmin)
	hw := b.createHardware("H100")
	b.must(http.StatusNoContent, b.do("DELETE", path, nil))
	b.must(http.StatusNoContent, b.do("DELETE", fmt.Sprintf("/v1/hardware/%d", hw), nil))

	var entries []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", nil)).json(t, &entries)
	var actions []string
	for _, e := range entries {
		actions = append(actions, fmt.Sprint(e["action"], " by ", e["principal"]))
	}
	want := []string{"node.create by agent-9", "node.update by agent-9", "hardware.create by root", "node.delete by root", "hardware.delete by root"}
	if diff := cmp.Diff(want, actions); diff != "" {
		t.Fatalf("audit (-want +got):\n%s", diff)
	}
	upd := entries[1]
	if upd["acting_node"] != float64(pk) || upd["request_id"] != patched.header.Get("X-Request-Id") ||
		upd["client_request_id"] != "req-patch-1" || upd["role"] != "agent" {
		t.Errorf("update entry: %v", upd)
	}
	if upd["before"].(map[string]any)["driver_version"] != "550.54.15" || upd["after"].(map[string]any)["driver_version"] != "560.1" {
		t.Errorf("before/after: %v / %v", upd["before"], upd["after"])
	}
	if entries[0]["before"] != nil || entries[3]["after"] != nil {
		t.Errorf("create has a before or delete an after")
	}

	// Filters and keyset pages.
	var page []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"principal": "agent-9"})).json(t, &page)
	if len(page) != 2 {
		t.Errorf("by principal: %d entries", len(page))
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"target_type": "node", "target_pk": pk})).json(t, &page)
	if len(page) != 3 {
		t.Errorf("by target: %d entries", len(page))
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"after": entries[1]["id"], "limit": 2})).json(t, &page)
	if len(page) != 2 || page[0]["id"] != entries[2]["id"] {
		t.Errorf("page after %v: %v", entries[1]["id"], page)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"since": time.Now().Add(time.Hour).Format(time.RFC3339)})).json(t, &page)
	if len(page) != 0 {
		t.Errorf("since the future: %d entries", len(page))
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"role": "agent"})).json(t, &page)
	if len(page) != 2 || page[0]["role"] != "agent" || page[1]["role"] != "agent" {
		t.Errorf("by role: %v", page)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"action": "node.delete"})).json(t, &page)
	if len(page) != 1 || page[0]["id"] != entries[3]["id"] {
		t.Errorf("by action: %v", page)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"action": "node.create", "role": "admin"})).json(t, &page)
	if len(page) != 0 {
		t.Errorf("by action and role: %v", page)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"action": "hardware.delete", "role": "admin", "principal": "root"})).json(t, &page)
	if len(page) != 1 || page[0]["id"] != entries[4]["id"] {
		t.Errorf("by action, role and principal: %v", page)
	}
	for _, bad := range []string{`{"target_type":"job"}`, `{"limit":0}`, `{"since":"yesterday"}`, `{"who":"x"}`, `{"action":"node.nuke"}`, `{"role":"root"}`} {
		b.must(http.StatusBadRequest, b.do("POST", "/v1/audit/list", bad))
	}
	// The log is append-only, even for SQL that tries.
	if _, err := b.store.Pool().Exec(context.Background(), "DELETE FROM audit_log"); err == nil {
		t.Error("audit rows could be deleted")
	}
}
