package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// boundToken mints an agent token bound to ips (the "ips" claim).
func boundToken(t testing.TB, sub string, ips ...string) string {
	t.Helper()
	m, err := auth.Signer{Secret: testSecret}.Mint(auth.TokenSpec{Sub: sub, Role: registry.RoleAgent, TTL: time.Hour, IPs: ips}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return m.Token
}

func nodeAt(ip string, index int) map[string]any {
	m := validNode()
	m["ip"], m["index"] = ip, index
	return m
}

// An agent token bound to its hosts registers nodes only at its addresses:
// single addresses, both edges of a CIDR prefix, IPv6, and IPv4-mapped
// spellings, which count as the IPv4 address they map.
func TestBoundAgentRegisters(t *testing.T) {
	b := setup(t)
	b.token = boundToken(t, "agent-bound", "10.0.0.7", "10.1.0.0/24", "2001:db8::/64", "::ffff:10.2.0.5")
	for _, tc := range []struct {
		ip     string
		status int
	}{
		{"10.0.0.7", 201},
		{"10.0.0.8", 403},
		{"10.0.0.6", 403},
		{"10.1.0.0", 201}, // first address of the prefix
		{"10.1.0.255", 201},
		{"10.1.1.0", 403}, // one past the last
		{"10.0.255.255", 403},
		{"2001:db8::1", 201},
		{"2001:DB8:0:0:ffff:ffff:ffff:ffff", 201},
		{"2001:db8:0:1::", 403},
		{"::ffff:10.0.0.7", 201}, // stored as 10.0.0.7; index 1 below keeps it apart
		{"::ffff:10.0.0.8", 403},
		{"10.2.0.5", 201}, // bound through its mapped form
		{"::a00:7", 403},  // IPv4-compatible is not IPv4-mapped: another address
	} {
		index := 0
		if strings.HasPrefix(tc.ip, "::ffff:10.0.0.7") {
			index = 1
		}
		before := b.countNodes()
		r := b.do("POST", "/v1/nodes/create", nodeAt(tc.ip, index))
		if r.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.ip, r.status, tc.status, r.body)
			continue
		}
		if tc.status == 403 {
			if !strings.Contains(string(r.body), "this token is bound to 10.0.0.7, 10.1.0.0/24, 2001:db8::/64, 10.2.0.5") {
				t.Errorf("%s: 403 does not name the token's addresses: %s", tc.ip, r.body)
			}
			if after := b.countNodes(); after != before {
				t.Errorf("%s: a refused registration stored a node", tc.ip)
			}
		}
	}
	// An unbound agent token is not limited.
	b.token = tokenFor(t, "agent-free", registry.RoleAgent)
	b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", nodeAt("192.0.2.1", 0)))
}

// problemDetail is a refusal's reason with the address taken out, so two
// refusals for different addresses can be compared.
func problemDetail(t *testing.T, r response, ip string) string {
	t.Helper()
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	r.json(t, &p)
	return fmt.Sprint(p.Status, " ", strings.ReplaceAll(p.Detail, ip, "<ip>"))
}

// A bound agent cannot adopt an imported node outside its addresses, and
// learns nothing about whether one is there: the refusal is the same for
// an address with and without a node. Inside its set it adopts as before.
func TestBoundAgentAdoption(t *testing.T) {
	b := setup(t)
	mem := int64(80) << 30
	_, err := b.store.ApplyImport(context.Background(),
		registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}, "scp",
		[]registry.ImportedNode{
			{ExternalID: "h1", IP: "10.9.0.1", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true},
			{ExternalID: "h2", IP: "10.8.0.1", Index: 0, CPUMem: 1 << 40, GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true},
		}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := b.store.ListNodes(context.Background(), registry.NodeFilter{IP: ptr("10.9.0.1")})
	if err != nil || len(nodes) != 1 {
		t.Fatalf("imported node: %v %v", nodes, err)
	}
	imported := nodes[0]
	f := fixture{own: imported.PK}
	before := b.snapshot(f, 0)

	b.token = boundToken(t, "agent-elsewhere", "10.8.0.0/16")
	withNode := b.must(http.StatusForbidden, b.do("POST", "/v1/nodes/create", nodeAt("10.9.0.1", 0)))
	withoutNode := b.must(http.StatusForbidden, b.do("POST", "/v1/nodes/create", nodeAt("10.9.0.2", 0)))
	if a, z := problemDetail(t, withNode, "10.9.0.1"), problemDetail(t, withoutNode, "10.9.0.2"); a != z {
		t.Errorf("the refusal differs with a node there:\n  %s\n  %s", a, z)
	}
	if diff := cmp.Diff(before, b.snapshot(f, 0)); diff != "" {
		t.Errorf("a refused adoption changed the database (-before +after):\n%s", diff)
	}
	// Inside its set the same token adopts.
	n := b.must(http.StatusOK, b.do("POST", "/v1/nodes/create", nodeAt("10.8.0.1", 0))).object(t)
	if n["owner"] != "agent-elsewhere" || n["source"] != "scp" {
		t.Errorf("adopted node: %v", n)
	}
}

func ptr[T any](v T) *T { return &v }

// A bound agent may not move its node outside its addresses with PUT or
// PATCH; other changes, and moves inside the set, go through.
func TestBoundAgentMoves(t *testing.T) {
	b := setup(t)
	b.token = boundToken(t, "agent-mover", "10.0.0.7", "10.1.0.0/24")
	r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", nodeAt("10.0.0.7", 0)))
	pk := fmt.Sprint(r.object(t)["pk"])
	path := "/v1/nodes/" + pk
	snap := func() registry.Node {
		n, err := b.store.GetNode(context.Background(), mustInt(t, pk))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	start := snap()
	b.must(http.StatusForbidden, b.do("PATCH", path, map[string]any{"ip": "10.0.0.9"}, "Node-Id", pk))
	b.must(http.StatusForbidden, b.do("PATCH", path, map[string]any{"ip": "::ffff:10.0.0.9"}, "Node-Id", pk))
	b.must(http.StatusForbidden, b.do("PUT", path, nodeAt("10.0.0.9", 0), "Node-Id", pk))
	if diff := cmp.Diff(start, snap()); diff != "" {
		t.Errorf("a refused move changed the node:\n%s", diff)
	}
	b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"ip": "not-an-ip"}, "Node-Id", pk)) // still a 400
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"driver_version": "560.1"}, "Node-Id", pk))
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"ip": "10.1.0.9"}, "Node-Id", pk))
	b.must(http.StatusOK, b.do("PUT", path, nodeAt("10.0.0.7", 0), "Node-Id", pk))
	// Admins carry no address set.
	b.token = tokenFor(t, "root", registry.RoleAdmin)
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"ip": "192.0.2.7"}))
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// REGISTRY_AGENT_REQUIRE_IP: agent tokens without "ips" are refused (401,
// saying why); bound agents and other roles are not affected. Off, an
// unbound agent token works.
func TestRequireAgentIP(t *testing.T) {
	require := func(on bool) option {
		return func(c *api.Config) {
			v, err := auth.NewVerifier(auth.Config{Secret: testSecret, RequireAgentIPs: on})
			if err != nil {
				t.Fatal(err)
			}
			c.Auth = v
		}
	}
	on := setup(t, require(true))
	off := another(t, require(false))
	unbound := tokenFor(t, "agent-1", registry.RoleAgent)
	r := on.must(http.StatusUnauthorized, on.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+unbound))
	if ch := r.header.Get("WWW-Authenticate"); !strings.Contains(ch, `error="invalid_token"`) || !strings.Contains(ch, "REGISTRY_AGENT_REQUIRE_IP") {
		t.Errorf("WWW-Authenticate %q", ch)
	}
	on.must(http.StatusOK, on.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+boundToken(t, "agent-1", "10.0.0.1")))
	on.must(http.StatusOK, on.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+tokenFor(t, "r", registry.RoleReader)))
	off.must(http.StatusOK, off.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+unbound))
}

// A malformed "ips" claim, or one on a role it cannot bind, is a 401.
func TestMalformedIPsClaim(t *testing.T) {
	b := setup(t)
	exp := time.Now().Add(time.Hour).Unix()
	for name, tc := range map[string]struct{ role, ips string }{
		"host bits set":         {"agent", `["10.0.0.7/24"]`},
		"empty list":            {"agent", `[]`},
		"not an address":        {"agent", `["gpu-host-7"]`},
		"a number":              {"agent", `[167772167]`},
		"a string, not a list":  {"agent", `"10.0.0.7"`},
		"null":                  {"agent", `null`},
		"a zone":                {"agent", `["fe80::1%eth0"]`},
		"mapped, host bits set": {"agent", `["::ffff:10.0.0.7/120"]`},
		"on a reader":           {"reader", `["10.0.0.7"]`},
		"on an admin":           {"admin", `["10.0.0.7"]`},
	} {
		tok := handMadeToken(testSecret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"x","role":%q,"exp":%d,"ips":%s}`, tc.role, exp, tc.ips))
		r := b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+tok)
		if r.status != http.StatusUnauthorized || !strings.Contains(r.header.Get("WWW-Authenticate"), `'ips'`) {
			t.Errorf("%s: status %d, WWW-Authenticate %q", name, r.status, r.header.Get("WWW-Authenticate"))
		}
	}
	// The same claim, well formed, on an agent token made by hand.
	tok := handMadeToken(testSecret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"x","role":"agent","exp":%d,"ips":["10.0.0.0/24","2001:db8::7"]}`, exp))
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Authorization", "Bearer "+tok))
}

// Node ownership is by subject, and a fleet may give every agent the same
// subject, each token bound to its own host. A bound token then acts
// (Node-Id: ping, PATCH, DELETE) only as nodes at its own addresses: a
// leaked one cannot change or delete the nodes of the other hosts, and
// gets the same 403 as for a node that does not exist.
func TestBoundAgentActsOnlyAtItsAddresses(t *testing.T) {
	b := setup(t)
	here, there := boundToken(t, "agent-fleet", "10.3.0.1"), boundToken(t, "agent-fleet", "10.3.0.2")
	b.token = here
	mine := b.createNode(map[string]any{"ip": "10.3.0.1"})
	b.token = there
	theirs := b.createNode(map[string]any{"ip": "10.3.0.2"})

	b.token = here
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", fmt.Sprint(mine)))
	b.must(http.StatusOK, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", mine), map[string]any{"driver_version": "560.1"}, "Node-Id", fmt.Sprint(mine)))
	missing := b.do("GET", "/v1/nodes/ping", nil, "Node-Id", "424242")
	for _, r := range []response{
		b.do("GET", "/v1/nodes/ping", nil, "Node-Id", fmt.Sprint(theirs)),
		b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", theirs), map[string]any{"driver_version": "pwned"}, "Node-Id", fmt.Sprint(theirs)),
		b.do("DELETE", fmt.Sprintf("/v1/nodes/%d", theirs), nil, "Node-Id", fmt.Sprint(theirs)),
	} {
		if r.status != http.StatusForbidden {
			t.Errorf("acting as another host's node: %d, want 403: %s", r.status, r.body)
		}
	}
	if missing.status != http.StatusForbidden {
		t.Errorf("acting as a missing node: %d, want 403", missing.status)
	}
	b.token = tokenFor(t, "admin-test", registry.RoleAdmin)
	var n struct {
		DriverVersion string `json:"driver_version"`
	}
	b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/nodes/%d", theirs), nil)).json(t, &n)
	if n.DriverVersion == "pwned" {
		t.Error("the other host's node was changed")
	}
	// The token of the node's own host still acts as it.
	b.token = there
	b.must(http.StatusNoContent, b.do("DELETE", fmt.Sprintf("/v1/nodes/%d", theirs), nil, "Node-Id", fmt.Sprint(theirs)))
}
