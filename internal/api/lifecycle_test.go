package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/registryd/registryd/internal/registry"
)

// lcNode is the part of a node document the lifecycle tests read.
type lcNode struct {
	PK             int64
	State          string
	CordonReason   *string    `json:"cordon_reason"`
	CurrentJob     *int64     `json:"current_job"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	Version        int64
}

type notDone struct {
	PK     int64
	Reason string
}

type cordonResult struct {
	Cordoned    []lcNode
	NotCordoned []notDone `json:"not_cordoned"`
}

type uncordonResult struct {
	Uncordoned    []lcNode
	NotUncordoned []notDone `json:"not_uncordoned"`
}

type renewResult struct {
	Job     int64
	Nodes   []lcNode
	Expired []int64
}

func lcPKs(nodes []lcNode) []int64 {
	out := []int64{}
	for _, n := range nodes {
		out = append(out, n.PK)
	}
	return out
}

// states maps pk → state of the given nodes.
func states(nodes []lcNode) map[int64]string {
	m := map[int64]string{}
	for _, n := range nodes {
		m[n.PK] = n.State
	}
	return m
}

// etagOf reads node pk's ETag.
func (b *bundle) etagOf(pk int64) string {
	b.t.Helper()
	return b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/nodes/%d", pk), nil)).header.Get("ETag")
}

// listed lists nodes with the filter body and answers their pks.
func (b *bundle) listed(filter any) []int64 {
	b.t.Helper()
	var nodes []lcNode
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", filter)).json(b.t, &nodes)
	return lcPKs(nodes)
}

// auditOf lists node pk's audit entries of action, oldest first.
func (b *bundle) auditOf(pk int64, action string) []map[string]any {
	b.t.Helper()
	var entries []map[string]any
	b.must(http.StatusOK, b.do("POST", "/v1/audit/list", map[string]any{"target_type": "node", "target_pk": pk, "action": action})).json(b.t, &entries)
	return entries
}

// dbNow is the database's clock.
func (b *bundle) dbNow() time.Time {
	b.t.Helper()
	var t time.Time
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&t); err != nil {
		b.t.Fatal(err)
	}
	return t
}

// Cordon and uncordon by pks: states, reasons, not_cordoned, versions,
// audit and watch events; a cordoned node is never claimed.
func TestCordonAndUncordon(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	pks := b.hosts(hw, 3)[0]
	n0, n1, n2 := pks[0], pks[1], pks[2]
	w := watchStream(t, b.url, "", b.token)
	etag := b.etagOf(n0)

	var c cordonResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{n0, 987654, n0}, "reason": "replacing a fan"})).json(t, &c)
	if diff := cmp.Diff([]int64{n0}, lcPKs(c.Cordoned)); diff != "" {
		t.Fatalf("cordoned (-want +got):\n%s", diff)
	}
	if n := c.Cordoned[0]; n.State != "cordoned" || n.CordonReason == nil || *n.CordonReason != "replacing a fan" || n.CurrentJob != nil {
		t.Errorf("cordoned node: %+v", n)
	}
	if diff := cmp.Diff([]notDone{{987654, "no such node"}}, c.NotCordoned); diff != "" {
		t.Errorf("not cordoned (-want +got):\n%s", diff)
	}
	cordonedETag := b.etagOf(n0)
	if cordonedETag == etag {
		t.Error("a cordon left the node's ETag")
	}

	// The same reason again changes nothing; another one replaces it.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{n0}, "reason": "replacing a fan"})).json(t, &c)
	if len(c.Cordoned) != 1 || c.Cordoned[0].State != "cordoned" || len(c.NotCordoned) != 0 {
		t.Errorf("cordon again: %+v", c)
	}
	if b.etagOf(n0) != cordonedETag {
		t.Error("cordoning for the same reason changed the ETag")
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{n0}, "reason": "replacing the PSU"})).json(t, &c)
	if *c.Cordoned[0].CordonReason != "replacing the PSU" || b.etagOf(n0) == cordonedETag {
		t.Errorf("another reason: %+v", c.Cordoned[0])
	}

	// Never claimed, listed by state, not free.
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 5, "count": 3}))
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 5, "ip": "10.9.0.1", "index": 0}))
	if got := b.listed(map[string]any{"state": "cordoned"}); !slices.Equal(got, []int64{n0}) {
		t.Errorf("state cordoned lists %v", got)
	}
	if got := b.listed(map[string]any{"free": true}); !slices.Equal(got, []int64{n1, n2}) {
		t.Errorf("free lists %v", got)
	}

	var u uncordonResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": []int64{n1, 987654, n0}})).json(t, &u)
	if len(u.Uncordoned) != 1 || u.Uncordoned[0].PK != n0 || u.Uncordoned[0].State != "free" || u.Uncordoned[0].CordonReason != nil {
		t.Errorf("uncordoned: %+v", u.Uncordoned)
	}
	if diff := cmp.Diff([]notDone{{n1, "not cordoned"}, {987654, "no such node"}}, u.NotUncordoned); diff != "" {
		t.Errorf("not uncordoned (-want +got):\n%s", diff)
	}
	if got := b.listed(map[string]any{"free": true}); !slices.Equal(got, []int64{n0, n1, n2}) {
		t.Errorf("free after uncordon lists %v", got)
	}

	// Audited: two cordons (the no-op is not a write) and an uncordon.
	cordons := b.auditOf(n0, "node.cordon")
	if len(cordons) != 2 || cordons[0]["before"].(map[string]any)["cordon_reason"] != nil ||
		cordons[0]["after"].(map[string]any)["cordon_reason"] != "replacing a fan" ||
		cordons[1]["after"].(map[string]any)["state"] != "cordoned" || cordons[0]["principal"] != "admin-test" {
		t.Errorf("cordon audit: %v", cordons)
	}
	if un := b.auditOf(n0, "node.uncordon"); len(un) != 1 || un[0]["after"].(map[string]any)["state"] != "free" {
		t.Errorf("uncordon audit: %v", un)
	}
	if un := b.auditOf(n1, "node.uncordon"); len(un) != 0 {
		t.Errorf("a node that was not cordoned has uncordon entries: %v", un)
	}

	// On the watch, in order, each with its node.
	var got []string
	for len(got) < 3 {
		e := w.next()
		if e.Type == "created" { // a creation sequenced after the stream opened
			continue
		}
		got = append(got, fmt.Sprintf("%s %d %v", e.Type, e.nodePK(), e.Data["node"].(map[string]any)["state"]))
	}
	want := []string{fmt.Sprintf("cordoned %d cordoned", n0), fmt.Sprintf("cordoned %d cordoned", n0), fmt.Sprintf("uncordoned %d free", n0)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	w.quiet(300 * time.Millisecond)
}

// Cordoning a busy node drains it: the job keeps it, and once released it
// is cordoned, never free, until uncordoned. Fault caught: a cordon that
// takes the node from its job, or a release that clears the cordon.
func TestCordonDrainsBusyNodes(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	pks := b.hosts(hw, 2)[0]
	n0, n1 := pks[0], pks[1]
	var claim claimResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 5, "lease_seconds": 600})).json(t, &claim)
	if claim.pks()[0] != n0 {
		t.Fatalf("claimed %v", claim.pks())
	}
	before, _ := b.store.GetNode(context.Background(), n0)

	var c cordonResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{n0}, "reason": "disk errors"})).json(t, &c)
	n := c.Cordoned[0]
	if n.State != "draining" || n.CurrentJob == nil || *n.CurrentJob != 5 || n.LeaseExpiresAt == nil || !n.LeaseExpiresAt.Equal(*before.LeaseExpiresAt) {
		t.Fatalf("cordoned busy node: %+v (lease before %v)", n, before.LeaseExpiresAt)
	}
	if got := b.listed(map[string]any{"state": []string{"draining"}}); !slices.Equal(got, []int64{n0}) {
		t.Errorf("draining lists %v", got)
	}
	if diff := cmp.Diff(map[int64]int64{n0: 5}, b.held()); diff != "" {
		t.Errorf("held after the cordon:\n%s", diff)
	}

	var rel struct{ Released []lcNode }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 5})).json(t, &rel)
	if len(rel.Released) != 1 || rel.Released[0].State != "cordoned" || rel.Released[0].LeaseExpiresAt != nil {
		t.Fatalf("released: %+v", rel.Released)
	}
	if got := b.listed(map[string]any{"free": true}); !slices.Equal(got, []int64{n1}) {
		t.Errorf("free after the release: %v", got)
	}
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 6, "count": 2}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 6})).json(t, &claim)
	if claim.pks()[0] != n1 {
		t.Errorf("the claim took %v, want the free node %d", claim.pks(), n1)
	}
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 7}))

	var u uncordonResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": []int64{n0, n1}})).json(t, &u)
	if len(u.Uncordoned) != 1 || u.Uncordoned[0].State != "free" {
		t.Fatalf("uncordoned: %+v", u)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 7})).json(t, &claim)
	if claim.pks()[0] != n0 {
		t.Errorf("after uncordon the claim took %v, want %d", claim.pks(), n0)
	}
	// Uncordoning a draining node leaves it with its job: busy.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{n0}, "reason": "x"}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": []int64{n0}})).json(t, &u)
	if n := u.Uncordoned[0]; n.State != "busy" || n.CurrentJob == nil || *n.CurrentJob != 7 {
		t.Errorf("uncordoned draining node: %+v", n)
	}
}

// A cordon by filters: every matching node, at most MaxCordon (more:
// 409, nothing cordoned); exactly MaxCordon is fine.
func TestCordonByFilter(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	hosts := b.hosts(hw, 2, 2)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 3, "ip": "10.9.1.1", "index": 1}))

	var c cordonResult
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.9.0.1", "reason": "kernel upgrade"})).json(t, &c)
	if diff := cmp.Diff(hosts[0], lcPKs(c.Cordoned)); diff != "" || len(c.NotCordoned) != 0 {
		t.Errorf("cordon by ip (-want +got):\n%s %v", diff, c.NotCordoned)
	}
	// By state: the free nodes left; the busy one is not taken.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"state": "free", "hardware_generation": hw, "reason": "rack move"})).json(t, &c)
	if diff := cmp.Diff(map[int64]string{hosts[1][0]: "cordoned"}, states(c.Cordoned)); diff != "" {
		t.Errorf("cordon of the free nodes (-want +got):\n%s", diff)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"current_job": 3, "reason": "rack move"})).json(t, &c)
	if diff := cmp.Diff(map[int64]string{hosts[1][1]: "draining"}, states(c.Cordoned)); diff != "" {
		t.Errorf("cordon of a job's nodes (-want +got):\n%s", diff)
	}
	// A filter that matches nothing cordons nothing.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.99.0.1", "reason": "x"})).json(t, &c)
	if len(c.Cordoned) != 0 {
		t.Errorf("an empty match cordoned %v", c.Cordoned)
	}
	// Every list filter works, seen_within (a subquery) too.
	b.seen("-10 seconds", hosts[0][0])
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"seen_within": 60, "min_gpu_mem": 1, "source": "api", "reason": "seen lately"})).json(t, &c)
	if len(c.Cordoned) != 1 || c.Cordoned[0].PK != hosts[0][0] || *c.Cordoned[0].CordonReason != "seen lately" {
		t.Errorf("cordon by seen_within: %+v", c.Cordoned)
	}

	// The bound: 1001 matching nodes is refused whole, 1000 is taken.
	b.exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) SELECT '10.20.0.1'::inet, g, 1, 'd' FROM generate_series(0, $1::int) g`, registry.MaxCordon)
	r := b.must(http.StatusConflict, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.20.0.1", "reason": "too many"}))
	if !strings.Contains(string(r.body), "more than 1000") {
		t.Errorf("409 does not say the bound: %s", r.body)
	}
	var cordoned int
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM nodes WHERE ip = '10.20.0.1' AND cordon_reason IS NOT NULL`).Scan(&cordoned); err != nil {
		t.Fatal(err)
	}
	if cordoned != 0 {
		t.Errorf("a refused cordon cordoned %d nodes", cordoned)
	}
	b.exec(`DELETE FROM nodes WHERE ip = '10.20.0.1' AND gpu_index = 0`)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.20.0.1", "reason": "exactly the bound"})).json(t, &c)
	if len(c.Cordoned) != registry.MaxCordon {
		t.Errorf("cordoned %d, want %d", len(c.Cordoned), registry.MaxCordon)
	}
}

func TestLifecycleInvalid(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	long := strings.Repeat("é", 201)
	many := make([]int64, registry.MaxCordon+1)
	for i := range many {
		many[i] = int64(i + 1)
	}
	for _, tc := range []struct {
		path   string
		body   any
		fields []string
	}{
		// cordon: the reason
		{"/v1/nodes/cordon", `{"nodes": [1]}`, []string{"reason"}},
		{"/v1/nodes/cordon", `{"nodes": [1], "reason": ""}`, []string{"reason"}},
		{"/v1/nodes/cordon", `{"nodes": [1], "reason": null}`, []string{"reason"}},
		{"/v1/nodes/cordon", `{"nodes": [1], "reason": 7}`, []string{"reason"}},
		{"/v1/nodes/cordon", `{"nodes": [1], "reason": "fan\u0007"}`, []string{"reason"}},
		{"/v1/nodes/cordon", `{"nodes": [1], "reason": " fan"}`, []string{"reason"}},
		{"/v1/nodes/cordon", map[string]any{"nodes": []int64{1}, "reason": long}, []string{"reason"}},
		// cordon: what to cordon
		{"/v1/nodes/cordon", `{"reason": "fan"}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": null}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": []}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": [0]}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": ["1"]}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": 1}`, []string{"nodes"}},
		{"/v1/nodes/cordon", map[string]any{"reason": "fan", "nodes": many}, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": [1], "ip": "10.0.0.1"}`, []string{"nodes"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "source": "aws"}`, []string{"source"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "state": "asleep"}`, []string{"state"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "ip": "10.0.0.1", "limit": 5}`, []string{"limit"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "ip": "10.0.0.1", "after": 5}`, []string{"after"}},
		{"/v1/nodes/cordon", `{"reason": "fan", "nodes": [1], "colour": "red"}`, []string{"colour"}},
		{"/v1/nodes/cordon", `{}`, []string{"reason", "nodes"}},
		// uncordon
		{"/v1/nodes/uncordon", `{}`, []string{"nodes"}},
		{"/v1/nodes/uncordon", `{"nodes": []}`, []string{"nodes"}},
		{"/v1/nodes/uncordon", `{"nodes": null}`, []string{"nodes"}},
		{"/v1/nodes/uncordon", `{"nodes": [-1]}`, []string{"nodes"}},
		{"/v1/nodes/uncordon", map[string]any{"nodes": many}, []string{"nodes"}},
		{"/v1/nodes/uncordon", `{"nodes": [1], "reason": "fan"}`, []string{"reason"}},
		{"/v1/nodes/uncordon", `{"nodes": [1], "ip": "10.0.0.1"}`, []string{"ip"}},
		// renew
		{"/v1/nodes/renew", `{}`, []string{"job", "lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 0, "lease_seconds": 60}`, []string{"job"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": 0}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": -60}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": 86401}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": 99999999999999999999}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": 1.5}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": "60"}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": null}`, []string{"lease_seconds"}},
		{"/v1/nodes/renew", `{"job": 1, "lease_seconds": 60, "count": 1}`, []string{"count"}},
		// claim's lease
		{"/v1/nodes/claim", `{"job": 1, "lease_seconds": 0}`, []string{"lease_seconds"}},
		{"/v1/nodes/claim", `{"job": 1, "lease_seconds": 86401}`, []string{"lease_seconds"}},
		{"/v1/nodes/claim", `{"job": 1, "lease_seconds": 9223372036854775807}`, []string{"lease_seconds"}},
		{"/v1/nodes/claim", `{"job": 1, "lease_seconds": null}`, []string{"lease_seconds"}},
		{"/v1/nodes/claim", `{"job": 1, "lease_seconds": "60"}`, []string{"lease_seconds"}},
		// the state filter of list and claim
		{"/v1/nodes/list", `{"state": "asleep"}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": ["free", "asleep"]}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": []}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": null}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": 1}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": [1]}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": ["free", "free", "free", "free", "free", "free", "free"]}`, []string{"state"}},
		{"/v1/nodes/list", `{"state": "FREE"}`, []string{"state"}},
		{"/v1/nodes/list", `{"free": true, "state": "busy"}`, []string{"state"}},
		{"/v1/nodes/list", `{"free": false, "state": ["free"]}`, []string{"state"}},
		{"/v1/nodes/claim", `{"job": 1, "state": "busy"}`, []string{"state"}},
	} {
		r := b.do("POST", tc.path, tc.body)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s %v: status %d, want 400; %s", tc.path, tc.body, r.status, r.body)
			continue
		}
		if got := r.problemFields(t); !slices.Equal(got, tc.fields) {
			t.Errorf("%s %v: fields %v, want %v", tc.path, tc.body, got, tc.fields)
		}
	}
	// Nothing above changed the node.
	if n, _ := b.store.GetNode(context.Background(), pk); n.State != registry.StateFree || n.Version != 1 {
		t.Errorf("node after refused requests: %s, version %d", n.State, n.Version)
	}
	// The bounds themselves are accepted: a 200-character reason, a lease
	// of one second and of a day.
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{pk}, "reason": strings.Repeat("é", 200)}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": []int64{pk}}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1, "lease_seconds": 86400}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/renew", map[string]any{"job": 1, "lease_seconds": 1}))
}

// Non-admins may not cordon or uncordon, whatever the body; schedulers
// may renew. (TestPermissionMatrix walks every role and Node-Id too.)
func TestCordonIsForAdmins(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	for _, role := range []registry.Role{registry.RoleReader, registry.RoleScheduler, registry.RoleAgent} {
		tok := "Bearer " + tokenFor(t, "someone", role)
		for _, path := range []string{"/v1/nodes/cordon", "/v1/nodes/uncordon"} {
			r := b.do("POST", path, map[string]any{"nodes": []int64{pk}, "reason": "mine now"}, "Authorization", tok)
			if r.status != http.StatusForbidden {
				t.Errorf("%s %s: status %d, want 403", role, path, r.status)
			}
		}
	}
	if n, _ := b.store.GetNode(context.Background(), pk); n.CordonReason != nil || n.Version != 1 {
		t.Errorf("a refused cordon changed the node: %v, version %d", n.CordonReason, n.Version)
	}
	sched := "Bearer " + tokenFor(t, "sched", registry.RoleScheduler)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 8, "lease_seconds": 60}, "Authorization", sched))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/renew", map[string]any{"job": 8, "lease_seconds": 120}, "Authorization", sched))
	for _, role := range []registry.Role{registry.RoleReader, registry.RoleAgent} {
		r := b.do("POST", "/v1/nodes/renew", map[string]any{"job": 8, "lease_seconds": 60}, "Authorization", "Bearer "+tokenFor(t, "x", role))
		if r.status != http.StatusForbidden {
			t.Errorf("%s renew: status %d, want 403", role, r.status)
		}
	}
}

// A leased claim's nodes show lease_expires_at, the database's clock at
// the claim plus the lease; without a lease they show null; a release
// clears it.
func TestLeasedClaim(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	b.hosts(hw, 4)
	type leased struct {
		Nodes []lcNode
	}
	var c leased
	t0 := b.dbNow()
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1, "count": 2, "lease_seconds": 120})).json(t, &c)
	t1 := b.dbNow()
	for _, n := range c.Nodes {
		if n.LeaseExpiresAt == nil || n.LeaseExpiresAt.Before(t0.Add(120*time.Second)) || n.LeaseExpiresAt.After(t1.Add(120*time.Second)) {
			t.Errorf("node %d: lease_expires_at %v, want within [%v, %v] + 120s", n.PK, n.LeaseExpiresAt, t0, t1)
		}
	}
	if claims := b.auditOf(c.Nodes[0].PK, "node.claim"); len(claims) != 1 ||
		claims[0]["after"].(map[string]any)["lease_expires_at"] == nil || claims[0]["before"].(map[string]any)["lease_expires_at"] != nil {
		t.Errorf("claim audit: %v", claims)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 2})).json(t, &c)
	if c.Nodes[0].LeaseExpiresAt != nil {
		t.Errorf("a claim without a lease has lease_expires_at %v", c.Nodes[0].LeaseExpiresAt)
	}
	var rel struct{ Released []lcNode }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", map[string]any{"job": 1})).json(t, &rel)
	if len(rel.Released) != 2 {
		t.Fatalf("released %v", rel.Released)
	}
	for _, n := range rel.Released {
		if n.LeaseExpiresAt != nil || n.State != "free" {
			t.Errorf("released node %d: %s, lease %v", n.PK, n.State, n.LeaseExpiresAt)
		}
	}
	var left int
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM nodes WHERE lease_expires_at IS NOT NULL`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d leases left after the release (%v)", left, err)
	}
}

// Renew extends every live lease of the job from now, leaves the job's
// unleased nodes as they are, skips leases that ran out, and is 404 for a
// job that holds nothing.
func TestRenew(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	pks := b.hosts(hw, 5)[0]
	w := watchStream(t, b.url, fmt.Sprintf("?ip=10.9.0.1&node=%d", pks[0]), b.token)
	all := watchStream(t, b.url, "", b.token)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 3, "count": 2, "lease_seconds": 60}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 3}))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 4, "lease_seconds": 60}))
	unleasedETag := b.etagOf(pks[2])
	leasedETag := b.etagOf(pks[0])

	var r renewResult
	t0 := b.dbNow()
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/renew", map[string]any{"job": 3, "lease_seconds": 3600})).json(t, &r)
	t1 := b.dbNow()
	if r.Job != 3 || !slices.Equal(lcPKs(r.Nodes), pks[:3]) {
		t.Fatalf("renew: %+v", r)
	}
	for _, n := range r.Nodes[:2] {
		if n.LeaseExpiresAt == nil || n.LeaseExpiresAt.Before(t0.Add(time.Hour)) || n.LeaseExpiresAt.After(t1.Add(time.Hour)) {
			t.Errorf("renewed node %d: lease %v, want within [%v, %v] + 1h", n.PK, n.LeaseExpiresAt, t0, t1)
		}
	}
	if r.Nodes[2].LeaseExpiresAt != nil || b.etagOf(pks[2]) != unleasedETag {
		t.Errorf("the unleased node was given a lease: %v", r.Nodes[2].LeaseExpiresAt)
	}
	if b.etagOf(pks[0]) == leasedETag {
		t.Error("a renewal left the ETag")
	}
	if n, _ := b.store.GetNode(context.Background(), pks[3]); n.LeaseExpiresAt == nil || n.LeaseExpiresAt.After(t1.Add(time.Minute)) {
		t.Errorf("another job's lease moved: %v", n.LeaseExpiresAt)
	}
	if e := b.auditOf(pks[0], "node.renew"); len(e) != 1 || e[0]["before"].(map[string]any)["lease_expires_at"] == e[0]["after"].(map[string]any)["lease_expires_at"] {
		t.Errorf("renew audit: %v", e)
	}
	if e := b.auditOf(pks[2], "node.renew"); len(e) != 0 {
		t.Errorf("the unleased node has renew entries: %v", e)
	}
	// On the watch: claimed, then one renewed event of the job, listing
	// the renewed nodes (a filtered watch only its own) with their new
	// versions and lease.
	var kinds []string
	var renewal sseEvent
	for len(kinds) < 2 {
		if e := w.next(); e.Type != "created" { // a creation sequenced after the stream opened
			kinds = append(kinds, e.Type)
			renewal = e
		}
	}
	if diff := cmp.Diff([]string{"claimed", "renewed"}, kinds); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	renewedOf := func(nodes ...lcNode) map[string]any {
		want := map[string]any{"kind": "renewed", "job": 3.0, "lease_expires_at": nodes[0].LeaseExpiresAt.UTC().Format(time.RFC3339Nano)}
		var vs []any
		for _, n := range nodes {
			vs = append(vs, map[string]any{"pk": float64(n.PK), "version": float64(n.Version)})
		}
		want["nodes"] = vs
		return want
	}
	ignoreAt := cmpopts.IgnoreMapEntries(func(k string, _ any) bool { return k == "at" })
	if diff := cmp.Diff(renewedOf(r.Nodes[0]), renewal.Data, ignoreAt); diff != "" {
		t.Errorf("the filtered watch's renewed event (-want +got):\n%s", diff)
	}
	var unfiltered []sseEvent
	for len(unfiltered) == 0 || unfiltered[len(unfiltered)-1].Type != "renewed" {
		if e := all.next(); e.Type != "created" {
			unfiltered = append(unfiltered, e)
		}
	}
	if len(unfiltered) != 5 { // claimed: 2 + 1 of job 3, 1 of job 4; then renewed
		t.Errorf("unfiltered events: %v; want 4 claims and one renewal", unfiltered)
	}
	if diff := cmp.Diff(renewedOf(r.Nodes[:2]...), unfiltered[len(unfiltered)-1].Data, ignoreAt); diff != "" {
		t.Errorf("the renewed event (-want +got):\n%s", diff)
	}
	// Replayed from the change log, the same: a filtered watch gets the
	// renewal listing its nodes alone, or nothing when none of them match.
	from := strconv.FormatInt(renewal.ID-1, 10)
	replay := watchStream(t, b.url, fmt.Sprintf("?node=%d", pks[1]), b.token, "Last-Event-ID", from)
	if e := replay.next(); e.ID != renewal.ID || cmp.Diff(renewedOf(r.Nodes[1]), e.Data, ignoreAt) != "" {
		t.Errorf("replayed for node %d: %+v; want the renewal of it alone", pks[1], e)
	}
	other := watchStream(t, b.url, fmt.Sprintf("?node=%d", pks[3]), b.token, "Last-Event-ID", from)
	other.quiet(300 * time.Millisecond)

	// A lease that ran out (not yet swept) is not renewed, and its node is
	// not the job's any more.
	b.exec(`UPDATE nodes SET lease_expires_at = now() - interval '1 second' WHERE pk = ANY($1)`, []int64{pks[0], pks[3]})
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/renew", map[string]any{"job": 3, "lease_seconds": 60})).json(t, &r)
	if !slices.Equal(lcPKs(r.Nodes), pks[1:3]) || !slices.Equal(r.Expired, pks[:1]) {
		t.Errorf("renew after a lease ran out: nodes %v, expired %v; want %v, %v", lcPKs(r.Nodes), r.Expired, pks[1:3], pks[:1])
	}
	if n, _ := b.store.GetNode(context.Background(), pks[0]); n.LeaseExpiresAt == nil || n.LeaseExpiresAt.After(time.Now()) {
		t.Errorf("an expired lease was renewed: %v", n.LeaseExpiresAt)
	}
	// 404: only a lease that ran out (lease_expired), or nothing held.
	for job, code := range map[int]string{4: registry.CodeLeaseExpired, 99: registry.CodeJobHoldsNothing} {
		resp := b.must(http.StatusNotFound, b.do("POST", "/v1/nodes/renew", map[string]any{"job": job, "lease_seconds": 60}))
		var p struct{ Code, Detail string }
		resp.json(t, &p)
		if p.Code != code || !strings.Contains(p.Detail, fmt.Sprintf("job %d holds no nodes", job)) {
			t.Errorf("404 for job %d: %s; want code %s", job, resp.body, code)
		}
	}
	// Swept by the registry, the node is still reported to the job as
	// expired, until it is claimed again.
	if _, err := b.store.SweepLifecycle(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/renew", map[string]any{"job": 3, "lease_seconds": 60})).json(t, &r)
	if !slices.Equal(lcPKs(r.Nodes), pks[1:3]) || !slices.Equal(r.Expired, pks[:1]) {
		t.Errorf("renew after the sweep: nodes %v, expired %v; want %v, %v", lcPKs(r.Nodes), r.Expired, pks[1:3], pks[:1])
	}
}

// The state filter of list and watch, and free with it.
func TestStateFilter(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	pks := b.hosts(hw, 5)[0]
	b.exec(`UPDATE nodes SET schedulable = false WHERE pk = $1`, pks[4])
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 1, "count": 2}))              // 0, 1 busy
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": pks[1:3], "reason": "x"})) // 1 draining, 2 cordoned
	for _, tc := range []struct {
		body any
		want []int64
	}{
		{map[string]any{"state": "busy"}, pks[:1]},
		{map[string]any{"state": []string{"cordoned", "draining"}}, pks[1:3]},
		{map[string]any{"state": "free"}, pks[3:4]},
		{map[string]any{"free": true}, pks[3:4]},
		{map[string]any{"state": "gone"}, pks[4:]},
		{map[string]any{"free": false}, []int64{pks[0], pks[1], pks[2], pks[4]}},
		{map[string]any{"free": false, "state": []string{"free", "busy"}}, pks[:1]},
		{map[string]any{"free": true, "state": []string{"free", "busy"}}, pks[3:4]},
		{map[string]any{"state": []string{"lost"}}, []int64{}},
	} {
		if got := b.listed(tc.body); !slices.Equal(got, tc.want) {
			t.Errorf("list %v: %v, want %v", tc.body, got, tc.want)
		}
	}

	// A claim may say state free (or include it); it takes free nodes only.
	b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 2, "count": 2, "state": []string{"free", "busy"}}))

	w := watchStream(t, b.url, "?state=cordoned,draining", b.token)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 2, "state": "free"}))           // 3 busy: not sent
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/uncordon", map[string]any{"nodes": pks[2:3]}))                // 2 free: not sent
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"nodes": pks[3:4], "reason": "fan"})) // 3 draining: sent
	e := w.next()
	for e.nodePK() == pks[1] || e.nodePK() == pks[2] { // the first cordon, sequenced after the stream opened
		e = w.next()
	}
	if e.Type != "cordoned" || e.nodePK() != pks[3] || e.Data["node"].(map[string]any)["state"] != "draining" {
		t.Errorf("state watch: %+v", e)
	}
	w.quiet(300 * time.Millisecond)
	for _, q := range []string{"?state=asleep", "?state=", "?state=free,", "?state=free&state=busy"} {
		if s := watchStream(t, b.url, q, b.token); s.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", q, s.status)
		}
	}
}

// A cordon waits for a claim in flight on its nodes and sees what it
// did: the claimed node drains, it is not cordoned as free nor handed
// back. Fault caught: a cordon that reads its nodes without locking them
// (its update then overwrites the claim's job), or skips locked ones.
func TestCordonWaitsForClaimInFlight(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	tx, release := b.lockRows(pk)
	if _, err := tx.Exec(context.Background(), `UPDATE nodes SET current_job = 9, version = version + 1 WHERE pk = $1`, pk); err != nil {
		t.Fatal(err)
	}
	done := make(chan response, 1)
	go func() {
		done <- b.doAsync("POST", "/v1/nodes/cordon", map[string]any{"nodes": []int64{pk}, "reason": "maintenance"})
	}()
	b.waitForLockWait()
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	release()
	var r response
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the cordon did not finish within 10s")
	}
	var c cordonResult
	if r.status != http.StatusOK {
		t.Fatalf("cordon: %d %s", r.status, r.body)
	}
	r.json(t, &c)
	if len(c.Cordoned) != 1 || c.Cordoned[0].State != "draining" || c.Cordoned[0].CurrentJob == nil || *c.Cordoned[0].CurrentJob != 9 {
		t.Fatalf("cordoned: %+v", c.Cordoned)
	}
	if diff := cmp.Diff(map[int64]int64{pk: 9}, b.held()); diff != "" {
		t.Errorf("the claim in flight lost its node:\n%s", diff)
	}
}

// doAsync is do for goroutines other than the test's: failures come back
// as a status of 0 and the error in the body.
func (b *bundle) doAsync(method, path string, body any, headers ...string) response {
	j, err := json.Marshal(body)
	if raw, ok := body.(string); ok {
		j = []byte(raw)
	}
	if err != nil {
		return response{body: []byte(err.Error())}
	}
	req, err := http.NewRequest(method, b.url+path, bytes.NewReader(j))
	if err != nil {
		return response{body: []byte(err.Error())}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return response{body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{body: []byte(err.Error())}
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// Claims racing a cordon: no node the cordon found free is ever handed
// out, claims that start after the cordon answered get nothing, and no
// node goes to two jobs.
func TestClaimRacingCordon(t *testing.T) {
	b := setup(t)
	const nodes, claimers = 40, 4
	b.exec(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) SELECT '10.40.0.1'::inet, g, 1, 'd' FROM generate_series(0, $1::int - 1) g`, nodes)
	for round := range 3 {
		type claimed struct {
			pks          []int64
			startedAfter bool // the claim was sent after the cordon answered
		}
		var (
			mu       sync.Mutex
			results  []claimed
			answered = make(chan struct{})
			started  = make(chan struct{}, claimers)
			wg       sync.WaitGroup
		)
		for i := range claimers {
			wg.Go(func() {
				job := int64(round*100 + i + 1)
				first := true
				for {
					after := false
					select {
					case <-answered:
						after = true
					default:
					}
					r := b.doAsync("POST", "/v1/nodes/claim", map[string]any{"job": job, "ip": "10.40.0.1"})
					if first {
						started <- struct{}{}
						first = false
					}
					switch r.status {
					case http.StatusOK:
						var c claimResult
						if err := json.Unmarshal(r.body, &c); err != nil {
							t.Errorf("claim: %v", err)
							return
						}
						mu.Lock()
						results = append(results, claimed{c.pks(), after})
						mu.Unlock()
					case http.StatusConflict:
						if after {
							return
						}
					default:
						t.Errorf("claim: %d %s", r.status, r.body)
						return
					}
				}
			})
		}
		for range claimers {
			<-started
		}
		var c cordonResult
		b.must(http.StatusOK, b.do("POST", "/v1/nodes/cordon", map[string]any{"ip": "10.40.0.1", "reason": fmt.Sprintf("round %d", round)})).json(t, &c)
		close(answered)
		wg.Wait()

		cordonedFree := map[int64]bool{}
		for _, n := range c.Cordoned {
			if n.State == "cordoned" {
				cordonedFree[n.PK] = true
			} else if n.State != "draining" {
				t.Errorf("round %d: node %d cordoned as %s", round, n.PK, n.State)
			}
		}
		if len(c.Cordoned) != nodes {
			t.Errorf("round %d: cordoned %d of %d", round, len(c.Cordoned), nodes)
		}
		owner := map[int64]bool{}
		for _, res := range results {
			for _, pk := range res.pks {
				if res.startedAfter {
					t.Errorf("round %d: a claim sent after the cordon answered got node %d", round, pk)
				}
				if cordonedFree[pk] {
					t.Errorf("round %d: node %d was cordoned free and then claimed", round, pk)
				}
				if owner[pk] {
					t.Errorf("round %d: node %d claimed twice", round, pk)
				}
				owner[pk] = true
			}
		}
		if len(owner)+len(cordonedFree) != nodes {
			t.Errorf("round %d: %d claimed + %d cordoned free, want %d in all", round, len(owner), len(cordonedFree), nodes)
		}
		t.Logf("round %d: %d nodes claimed, %d cordoned free", round, len(owner), len(cordonedFree))
		// Reset for the next round.
		b.exec(`UPDATE nodes SET current_job = NULL, cordon_reason = NULL`)
	}
}
