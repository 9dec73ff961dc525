package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
)

func TestNodeTTLConfig(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		err  bool
	}{
		{"", 60 * time.Second, false},
		{"5s", 5 * time.Second, false},
		{"2m", 2 * time.Minute, false},
		{"24h", 24 * time.Hour, false},
		{"4s", 0, true},
		{"25h", 0, true},
		{"soon", 0, true},
		{"-1m", 0, true},
	} {
		c, err := loadConfig(envFunc(map[string]string{"REGISTRY_NODE_TTL": tc.v}))
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "REGISTRY_NODE_TTL")):
			t.Errorf("REGISTRY_NODE_TTL=%q: %v, want an error naming the variable", tc.v, err)
		case !tc.err && (err != nil || c.NodeTTL != tc.want):
			t.Errorf("REGISTRY_NODE_TTL=%q: %v, %v; want %v", tc.v, c.NodeTTL, err, tc.want)
		}
	}
}

// sse is one watch connection's events, read in the background.
type sse struct {
	events chan sseEvent
}

type sseEvent struct {
	id   int64
	kind string
	node struct {
		PK    int64  `json:"pk"`
		State string `json:"state"`
	}
}

func openWatch(t *testing.T, base, token string, lastEventID int64) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/nodes/watch", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastEventID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(lastEventID, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("watch: %d", resp.StatusCode)
	}
	s := &sse{events: make(chan sseEvent, 100)}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var e sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if e.kind != "" {
					s.events <- e
				}
				e = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				e.id, _ = strconv.ParseInt(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				e.kind = line[7:]
			case strings.HasPrefix(line, "data: "):
				var d struct {
					Node json.RawMessage `json:"node"`
				}
				_ = json.Unmarshal([]byte(line[6:]), &d)
				_ = json.Unmarshal(d.Node, &e.node)
			}
		}
	}()
	return s
}

// await returns the first event of kind for node pk within d, failing the
// test otherwise; the events before it are returned too.
func (s *sse) await(t *testing.T, d time.Duration, kind string, pk int64) (sseEvent, []sseEvent) {
	t.Helper()
	var seen []sseEvent
	deadline := time.After(d)
	for {
		select {
		case e := <-s.events:
			if e.kind == kind && e.node.PK == pk {
				return e, seen
			}
			seen = append(seen, e)
		case <-deadline:
			t.Fatalf("no %s event for node %d within %s; saw %+v", kind, pk, d, seen)
		}
	}
}

// Two `registryd serve` replicas on one database with REGISTRY_NODE_TTL=5s:
// a node whose agent stops heartbeating becomes lost (and is not claimed),
// a heartbeat through one replica finds it again, a node that never had an
// agent stays free, and a 3-second lease runs out by itself. Every
// transition reaches a watch on the other replica, once, resumable with
// Last-Event-ID.
func TestServeLifecycleAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := func() map[string]string {
		return map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_NODE_TTL": "5s"}
	}
	a, b := startServer(t, env()), startServer(t, env())
	admin := adminToken(t, env())
	out, stderr, err := runCmd(t, env(), "token", "--sub", "agent-life", "--role", "agent", "--ip", "10.3.0.1")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	agent := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])

	w := openWatch(t, b.url, admin, 0)
	create := func(token, ip string) int64 {
		t.Helper()
		code, body := call(t, "POST", a.url+"/v1/nodes/create",
			fmt.Sprintf(`{"ip":%q,"index":0,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, ip), token)
		if code != 201 && code != 200 {
			t.Fatalf("create %s: %d %s", ip, code, body)
		}
		var n struct{ PK int64 }
		_ = json.Unmarshal([]byte(body), &n)
		return n.PK
	}
	heartbeat := func(pk int64) {
		t.Helper()
		req, _ := http.NewRequest("GET", a.url+"/v1/nodes/ping", nil)
		req.Header.Set("Authorization", "Bearer "+agent)
		req.Header.Set("Node-Id", strconv.FormatInt(pk, 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("heartbeat: %d", resp.StatusCode)
		}
	}
	state := func(pk int64) string {
		t.Helper()
		code, body := call(t, "GET", fmt.Sprintf("%s/v1/nodes/%d", b.url, pk), "", admin)
		var n struct{ State string }
		if code != 200 || json.Unmarshal([]byte(body), &n) != nil {
			t.Fatalf("get %d: %d %s", pk, code, body)
		}
		return n.State
	}
	agentNode := create(agent, "10.3.0.1")
	heartbeat(agentNode)
	plain := create(admin, "10.3.0.2")  // no agent, never heartbeats
	leased := create(admin, "10.3.0.3") // claimed with a 3-second lease
	if code, body := call(t, "POST", a.url+"/v1/nodes/claim", `{"job":77,"count":1,"ip":"10.3.0.3","lease_seconds":3}`, admin); code != 200 || !strings.Contains(body, `"lease_expires_at":"`) {
		t.Fatalf("claim: %d %s", code, body)
	}
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	// The lease runs out by itself, well before the silent node is lost.
	exp, _ := w.await(t, 10*time.Second, "expired", leased)
	if exp.node.State != "free" {
		t.Errorf("expired event shows state %s", exp.node.State)
	}
	code, body := call(t, "POST", b.url+"/v1/nodes/release", fmt.Sprintf(`{"job":77,"nodes":[%d]}`, leased), admin)
	if code != 200 || !strings.Contains(body, `"released":[]`) || !strings.Contains(body, "the lease of job 77 expired") {
		t.Errorf("release after expiry: %d %s", code, body)
	}

	// The agent's node falls silent: lost within the TTL and a sweep or two.
	lost, before := w.await(t, 15*time.Second, "lost", agentNode)
	if lost.node.State != "lost" || state(agentNode) != "lost" {
		t.Errorf("lost event state %s, node state %s", lost.node.State, state(agentNode))
	}
	// A lost node is never claimed, whichever replica is asked.
	for _, srv := range []*server{a, b} {
		if code, body := call(t, "POST", srv.url+"/v1/nodes/claim", `{"job":78,"count":1,"ip":"10.3.0.1"}`, admin); code != 409 {
			t.Errorf("claim of a lost node: %d %s", code, body)
		}
	}
	// The node that never had an agent stays free.
	if s := state(plain); s != "free" {
		t.Errorf("a node without an agent that never heartbeated is %s, want free", s)
	}

	// A heartbeat through one replica finds it within about a second of
	// the next flush (0.5s) and sweep (1s).
	start := time.Now()
	heartbeat(agentNode)
	found, _ := w.await(t, 5*time.Second, "found", agentNode)
	if found.node.State != "free" {
		t.Errorf("found event state %s", found.node.State)
	}
	t.Logf("found %s after the heartbeat", time.Since(start).Round(time.Millisecond))

	// Resuming on the other replica from before the lost event replays
	// lost then found, each once.
	resumeAfter := exp.id
	if len(before) > 0 {
		resumeAfter = before[len(before)-1].id
	}
	r := openWatch(t, b.url, admin, resumeAfter)
	if e, _ := r.await(t, 5*time.Second, "lost", agentNode); e.id != lost.id {
		t.Errorf("resumed lost event id %d, want %d", e.id, lost.id)
	}
	if e, skipped := r.await(t, 5*time.Second, "found", agentNode); e.id != found.id || len(skipped) != 0 {
		t.Errorf("resumed found event id %d (want %d), events in between %+v", e.id, found.id, skipped)
	}

	// Each transition once in the change log and once in the audit log,
	// as the system principals; two sweepers ran on this database.
	for _, c := range []struct {
		kind, action, principal string
		pk                      int64
	}{
		{"expired", "node.expire", "system:lease", leased},
		{"lost", "node.lost", "system:lifecycle", agentNode},
		{"found", "node.found", "system:lifecycle", agentNode},
	} {
		var events, entries int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM node_change_events WHERE kind = $1 AND node_pk = $2`, c.kind, c.pk).Scan(&events); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = $1 AND target_pk = $2 AND principal = $3 AND role = 'system'`,
			c.action, c.pk, c.principal).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		if events != 1 || entries != 1 {
			t.Errorf("%s of node %d: %d events, %d audit entries; want one each", c.kind, c.pk, events, entries)
		}
	}
}

// Two replicas on one database: an admin's cordon, drain and uncordon
// through one replica reach a watch on the other; agents and schedulers
// are refused; a lease renewed through the other replica holds past its
// first expiry and then runs out by itself.
func TestServeCordonAndRenewAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := func() map[string]string {
		return map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_NODE_TTL": "5s"}
	}
	a, b := startServer(t, env()), startServer(t, env())
	admin := adminToken(t, env())
	token := func(sub, role string) string {
		t.Helper()
		out, stderr, err := runCmd(t, env(), "token", "--sub", sub, "--role", role)
		if err != nil {
			t.Fatalf("token: %v\n%s", err, stderr)
		}
		return strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	}
	scheduler, agent := token("sched-1", "scheduler"), token("agent-1", "agent")

	w := openWatch(t, b.url, admin, 0)
	var pks []int64
	for i := range 2 {
		code, body := call(t, "POST", a.url+"/v1/nodes/create",
			fmt.Sprintf(`{"ip":"10.4.0.1","index":%d,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, i), admin)
		var n struct{ PK int64 }
		if code != 201 || json.Unmarshal([]byte(body), &n) != nil {
			t.Fatalf("create: %d %s", code, body)
		}
		pks = append(pks, n.PK)
	}
	n0, n1 := pks[0], pks[1]

	// Only admins cordon and uncordon, on either replica.
	for _, tok := range []string{scheduler, agent} {
		for _, path := range []string{"/v1/nodes/cordon", "/v1/nodes/uncordon"} {
			code, body := call(t, "POST", b.url+path, fmt.Sprintf(`{"nodes":[%d],"reason":"x"}`, n0), tok)
			if code != 403 {
				t.Errorf("%s by a non-admin: %d %s", path, code, body)
			}
		}
	}

	// Drain: the busy node keeps its job while cordoned, and its release
	// leaves it cordoned, never free.
	if code, body := call(t, "POST", a.url+"/v1/nodes/claim", fmt.Sprintf(`{"job":5,"ip":"10.4.0.1","index":0}`), scheduler); code != 200 {
		t.Fatalf("claim: %d %s", code, body)
	}
	if code, body := call(t, "POST", a.url+"/v1/nodes/cordon", fmt.Sprintf(`{"nodes":[%d,%d],"reason":"firmware update"}`, n0, n1), admin); code != 200 ||
		!strings.Contains(body, `"state":"draining"`) || !strings.Contains(body, `"state":"cordoned"`) {
		t.Fatalf("cordon: %d %s", code, body)
	}
	if e, _ := w.await(t, 5*time.Second, "cordoned", n0); e.node.State != "draining" {
		t.Errorf("cordoned event for the busy node shows %s", e.node.State)
	}
	if e, _ := w.await(t, 5*time.Second, "cordoned", n1); e.node.State != "cordoned" {
		t.Errorf("cordoned event for the free node shows %s", e.node.State)
	}
	if code, body := call(t, "POST", b.url+"/v1/nodes/claim", `{"job":6,"count":1,"ip":"10.4.0.1"}`, scheduler); code != 409 {
		t.Errorf("claim of cordoned nodes on the other replica: %d %s", code, body)
	}
	if code, body := call(t, "POST", b.url+"/v1/nodes/release", `{"job":5}`, scheduler); code != 200 || !strings.Contains(body, `"state":"cordoned"`) {
		t.Errorf("release of a draining node: %d %s", code, body)
	}
	if e, _ := w.await(t, 5*time.Second, "released", n0); e.node.State != "cordoned" {
		t.Errorf("released event for the drained node shows %s", e.node.State)
	}
	if code, body := call(t, "POST", a.url+"/v1/nodes/uncordon", fmt.Sprintf(`{"nodes":[%d,%d]}`, n0, n1), admin); code != 200 || strings.Count(body, `"state":"free"`) != 2 {
		t.Fatalf("uncordon: %d %s", code, body)
	}
	for _, pk := range pks {
		if e, _ := w.await(t, 5*time.Second, "uncordoned", pk); e.node.State != "free" {
			t.Errorf("uncordoned event for %d shows %s", pk, e.node.State)
		}
	}

	// A 3-second lease taken on one replica, renewed on the other after
	// two seconds for four more: it holds past its first expiry (3 s),
	// then runs out by itself (about 6 s).
	start := time.Now()
	if code, body := call(t, "POST", a.url+"/v1/nodes/claim", `{"job":9,"ip":"10.4.0.1","index":1,"lease_seconds":3}`, scheduler); code != 200 {
		t.Fatalf("leased claim: %d %s", code, body)
	}
	time.Sleep(2 * time.Second)
	if code, body := call(t, "POST", b.url+"/v1/nodes/renew", `{"job":9,"lease_seconds":4}`, scheduler); code != 200 || !strings.Contains(body, fmt.Sprintf(`"pk":%d`, n1)) {
		t.Fatalf("renew: %d %s", code, body)
	}
	if code, body := call(t, "POST", b.url+"/v1/nodes/renew", `{"job":10,"lease_seconds":4}`, scheduler); code != 404 {
		t.Errorf("renew of a job that holds nothing: %d %s", code, body)
	}
	time.Sleep(time.Until(start.Add(4500 * time.Millisecond)))
	code, body := call(t, "GET", fmt.Sprintf("%s/v1/nodes/%d", a.url, n1), "", admin)
	if code != 200 || !strings.Contains(body, `"current_job":9`) {
		t.Fatalf("4.5 s after a 3 s lease renewed at 2 s for 4: %d %s", code, body)
	}
	e, _ := w.await(t, 10*time.Second, "expired", n1)
	if took := time.Since(start); took < 5500*time.Millisecond {
		t.Errorf("the renewed lease expired after %s, before its renewal ran out", took)
	}
	if e.node.State != "free" {
		t.Errorf("expired event shows %s", e.node.State)
	}
	t.Logf("renewed lease expired %s after the claim", time.Since(start).Round(time.Millisecond))
}
