package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/registry"
)

const gib = int64(1) << 30

// asError is errors.As for *client.Error, failing the test without one.
func asError(t *testing.T, err error, status int) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a *client.Error with status %d", err, err, status)
	}
	if e.Status != status {
		t.Fatalf("status %d, want %d: %v", e.Status, status, e)
	}
	if e.RequestID == "" || e.Title == "" {
		t.Errorf("error without request id or title: %+v", e)
	}
	return e
}

// The agent's flow: register its GPUs (adopting an imported node),
// heartbeat each as its node, report a driver upgrade; and what it may
// not do, as typed errors.
func TestAgentFlow(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	hw, err := admin.CreateHardware(ctx, client.HardwareCreate{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	// The sync worker imported GPU 2 of the host; no agent owns it yet.
	if _, err := s.store.Pool().Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, gpu_mem, source, external_id)
		VALUES ('10.0.0.7', 2, $1, '', $1, 'scp', 'host-7')`, 512*gib); err != nil {
		t.Fatal(err)
	}

	agent := s.client(s.token("agent-gpu-7", registry.RoleAgent, "10.0.0.7"))
	var pks []int64
	for i := range int32(3) {
		n, adopted, err := agent.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.7", Index: i, CPUMem: 512 * gib,
			DriverVersion: "550.54.15", HardwareGeneration: &hw.PK, GPUMem: client.Ptr(80 * gib)})
		if err != nil {
			t.Fatal(err)
		}
		if adopted != (i == 2) || n.Owner == nil || *n.Owner != "agent-gpu-7" || n.Index != i {
			t.Errorf("GPU %d: adopted %v, node %+v", i, adopted, n)
		}
		if i == 2 && (n.Source != client.SourceSCP || n.DriverVersion != "550.54.15") {
			t.Errorf("adopted node %+v", n)
		}
		pks = append(pks, n.PK)
	}

	// Heartbeats: a ping acting as each node records its last_seen.
	for _, pk := range pks {
		p, err := agent.Ping(ctx, client.AsNode(pk))
		if err != nil || p.Status != "ok" || time.Since(p.Time) > time.Minute {
			t.Fatalf("ping as %d: %+v, %v", pk, p, err)
		}
	}
	if err := agent.HeadPing(ctx, client.AsNode(pks[0])); err != nil {
		t.Fatal(err)
	}
	if err := s.beats.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pk := range pks {
		if n, err := agent.GetNode(ctx, pk); err != nil || n.LastSeen == nil {
			t.Errorf("node %d after heartbeats: %+v, %v", pk, n, err)
		}
	}

	// A driver upgrade: PATCH driver_version, acting as the node.
	var meta client.Response
	n, err := agent.PatchNode(ctx, pks[0], client.NodePatch{DriverVersion: client.Ptr("560.28.03")}, client.AsNode(pks[0]), client.Into(&meta))
	if err != nil || n.DriverVersion != "560.28.03" || n.GPUMem == nil || *n.GPUMem != 80*gib {
		t.Fatalf("patch: %+v, %v", n, err)
	}
	if meta.Status != http.StatusOK || meta.ETag == "" || meta.RequestID == "" || meta.Attempts != 1 {
		t.Errorf("response %+v", meta)
	}
	// The GPU lost its memory report: null clears it.
	n, err = agent.PatchNode(ctx, pks[1], client.NodePatch{GPUMem: client.Null[int64]()}, client.AsNode(pks[1]))
	if err != nil || n.GPUMem != nil || n.HardwareGeneration == nil {
		t.Fatalf("patch gpu_mem null: %+v, %v", n, err)
	}
	n, err = agent.PatchNode(ctx, pks[1], client.NodePatch{GPUMem: client.Value(40 * gib)}, client.AsNode(pks[1]))
	if err != nil || n.GPUMem == nil || *n.GPUMem != 40*gib {
		t.Fatalf("patch gpu_mem: %+v, %v", n, err)
	}
	// A full update, read-only fields left out.
	n, err = agent.UpdateNode(ctx, pks[2], client.NodeUpdate{IP: "10.0.0.7", Index: 2, CPUMem: 256 * gib,
		DriverVersion: "560.28.03", HardwareGeneration: &hw.PK, GPUMem: client.Ptr(80 * gib)}, client.AsNode(pks[2]))
	if err != nil || n.CPUMem != 256*gib {
		t.Fatalf("update: %+v, %v", n, err)
	}

	// What the agent may not do comes back typed.
	_, err = agent.PatchNode(ctx, pks[0], client.NodePatch{DriverVersion: client.Ptr("x")})
	if e := asError(t, err, http.StatusForbidden); !errors.Is(err, client.ErrForbidden) || e.Detail == "" {
		t.Errorf("patch without Node-Id: %v", err)
	}
	other := s.client(s.token("agent-gpu-8", registry.RoleAgent))
	_, err = other.Ping(ctx, client.AsNode(pks[0]))
	asError(t, err, http.StatusForbidden)
	_, _, err = agent.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.8", Index: 0, CPUMem: 1, DriverVersion: "d"})
	asError(t, err, http.StatusForbidden)
	_, _, err = admin.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.7", Index: 0, CPUMem: 1, DriverVersion: "d"})
	if e := asError(t, err, http.StatusConflict); e.ExistingPK != pks[0] || !errors.Is(err, client.ErrConflict) {
		t.Errorf("conflict: %+v", e)
	}
	_, _, err = agent.CreateNode(ctx, client.NodeCreate{IP: "not-an-ip", Index: -1, CPUMem: 1, DriverVersion: "d"},
		client.RequestID("agent-7.boot-1"))
	e := asError(t, err, http.StatusBadRequest)
	var fields []string
	for _, f := range e.Fields {
		fields = append(fields, f.Field)
	}
	if !slices.Equal(fields, []string{"ip", "index"}) || e.ClientRequestID != "agent-7.boot-1" || !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("400: fields %v, %+v", fields, e)
	}

	// The agent removes a GPU's node; it is gone.
	if err := agent.DeleteNode(ctx, pks[1], client.AsNode(pks[1])); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.GetNode(ctx, pks[1]); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("deleted node: %v", err)
	}
	if _, err := agent.GetNode(ctx, 0); err == nil {
		t.Error("pk 0 was sent")
	}
}

// gate is a transport that records the Last-Event-Id of every watch
// request and holds reconnections until the test opens it.
type gate struct {
	next    http.RoundTripper
	mu      sync.Mutex
	resumes []string
	held    chan struct{} // closed: reconnections may go
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.mu.Lock()
	g.resumes = append(g.resumes, req.Header.Get("Last-Event-Id"))
	n := len(g.resumes)
	g.mu.Unlock()
	if n > 1 {
		select {
		case <-g.held:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return g.next.RoundTrip(req)
}

func (g *gate) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.resumes)
}

// The scheduler's flow: find free nodes with filters, claim a host's
// GPUs for a job, release them; a watch sees the claims and the releases,
// and resumes after a dropped connection with Last-Event-ID, missing and
// repeating nothing.
func TestSchedulerFlow(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	hw, err := admin.CreateHardware(ctx, client.HardwareCreate{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		ip   string
		gpus int32
		mem  int64
	}{{"10.0.0.1", 4, 80 * gib}, {"10.0.0.2", 2, 40 * gib}, {"10.0.0.3", 3, 80 * gib}} {
		for i := range h.gpus {
			if _, _, err := admin.CreateNode(ctx, client.NodeCreate{IP: h.ip, Index: i, CPUMem: gib, DriverVersion: "550",
				HardwareGeneration: &hw.PK, GPUMem: &h.mem}); err != nil {
				t.Fatal(err)
			}
		}
	}

	tok := s.token("sched-1", registry.RoleScheduler)
	sched := s.client(tok)
	g := &gate{next: &http.Transport{}, held: make(chan struct{})}
	watcher := s.watcher(tok, &http.Client{Transport: g})
	events := make(chan client.Event, 100)
	watchCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- watcher.Watch(watchCtx, client.WatchOptions{HardwareGeneration: &hw.PK, Reconnect: 10 * time.Millisecond},
			func(ev client.Event) error {
				if ev.Bookmark == nil { // bookmarks say where the stream stands, no change
					events <- ev
				}
				return nil
			})
	}()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("watch ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the watch did not stop within 10s of its context")
		}
	})
	// The stream is open once HEAD says a watch would be let in and the
	// first request went out; events after its start are delivered.
	apitest.Eventually(t, 10*time.Second, "the watch connects", func() bool { return len(g.seen()) == 1 })
	if err := sched.HeadWatch(ctx, client.WatchOptions{HardwareGeneration: &hw.PK}); err != nil {
		t.Fatal(err)
	}

	free, err := sched.ListNodes(ctx, client.NodeFilter{Free: client.Ptr(true), HardwareGeneration: &hw.PK, MinGPUMem: client.Ptr(80 * gib)})
	if err != nil || len(free) != 7 {
		t.Fatalf("free 80 GB H100 nodes: %d, %v", len(free), err)
	}
	page, err := sched.ListNodes(ctx, client.NodeFilter{After: &free[0].PK, Limit: client.Ptr(2)})
	if err != nil || len(page) != 2 || page[0].PK <= free[0].PK {
		t.Fatalf("page: %+v, %v", page, err)
	}

	// Wait for the watch to be live: claim, then see the claim.
	claim, err := sched.ClaimNodes(ctx, client.NodeClaim{Job: 7001, Count: client.Ptr(4), SameHost: client.Ptr(true),
		HardwareGeneration: &hw.PK, MinGPUMem: client.Ptr(80 * gib)})
	if err != nil {
		t.Fatal(err)
	}
	if len(claim.Nodes) != 4 || claim.Job != 7001 {
		t.Fatalf("claim: %+v", claim)
	}
	for _, n := range claim.Nodes {
		if n.IP != "10.0.0.1" || n.CurrentJob == nil || *n.CurrentJob != 7001 {
			t.Errorf("claimed %+v", n)
		}
	}
	// No host has 4 more free 80 GB GPUs: 409, nothing held.
	_, err = sched.ClaimNodes(ctx, client.NodeClaim{Job: 7002, Count: client.Ptr(4), SameHost: client.Ptr(true), MinGPUMem: client.Ptr(80 * gib)})
	if asError(t, err, http.StatusConflict); !errors.Is(err, client.ErrConflict) {
		t.Error(err)
	}
	var ids []int64
	next := func(kind client.NodeEventKind) client.Event {
		t.Helper()
		var ev client.Event
		for ev.Type == "" || ev.Type == string(client.EventCreated) {
			// The creates may have been sequenced after the stream opened.
			select {
			case ev = <-events:
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s event within 10s", kind)
			}
		}
		{
			if ev.Type != string(kind) || ev.Node == nil || ev.Node.Kind != kind || ev.Node.Node.HardwareGeneration == nil {
				t.Fatalf("event %+v, want %s", ev, kind)
			}
			if len(ids) > 0 && ev.ID <= ids[len(ids)-1] {
				t.Fatalf("event id %d after %d", ev.ID, ids[len(ids)-1])
			}
			ids = append(ids, ev.ID)
			return ev
		}
	}
	for _, n := range claim.Nodes {
		if ev := next(client.EventClaimed); ev.Node.Node.PK != n.PK || *ev.Node.Node.CurrentJob != 7001 {
			t.Errorf("claimed event %+v for %d", ev.Node, n.PK)
		}
	}

	// The connection drops; the release happens while the watch is away.
	s.ts.CloseClientConnections()
	apitest.Eventually(t, 10*time.Second, "the watch reconnects", func() bool { return len(g.seen()) == 2 })
	rel, err := sched.ReleaseNodes(ctx, client.NodeRelease{Job: 7001})
	if err != nil || len(rel.Released) != 4 || len(rel.NotReleased) != 0 {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	close(g.held)
	for _, n := range rel.Released {
		if ev := next(client.EventReleased); ev.Node.Node.PK != n.PK || ev.Node.Node.CurrentJob != nil {
			t.Errorf("released event %+v for %d", ev.Node, n.PK)
		}
	}
	// The resumption carries the last claim's id, or a bookmark's after
	// it (a position moves past events other watches see).
	got := g.seen()
	resumed, err := strconv.ParseInt(got[1], 10, 64)
	if got[0] != "" || err != nil || resumed < ids[3] || resumed >= ids[4] {
		t.Errorf("Last-Event-Id of the watch requests: %q, want none then one from %d to before %d", got, ids[3], ids[4])
	}
	select {
	case ev := <-events:
		t.Errorf("an extra event: %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
	if held, err := sched.ListNodes(ctx, client.NodeFilter{CurrentJob: client.Ptr(int64(7001))}); err != nil || len(held) != 0 {
		t.Errorf("job 7001 still holds %d nodes, %v", len(held), err)
	}
}

// The admin's flow: hardware CRUD with ETags, conditional writes that
// fail typed (412), the audit log, a forced delete, token revocation, and
// the open endpoints.
func TestAdminFlow(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))

	// Hardware CRUD.
	h, err := admin.CreateHardware(ctx, client.HardwareCreate{Name: "H100"})
	if err != nil || h.Name != "H100" || h.Nodes != 0 {
		t.Fatalf("create hardware: %+v, %v", h, err)
	}
	_, err = admin.CreateHardware(ctx, client.HardwareCreate{Name: "H100"})
	if e := asError(t, err, http.StatusConflict); e.ExistingPK != h.PK {
		t.Errorf("conflict names %d, want %d", e.ExistingPK, h.PK)
	}
	var meta client.Response
	if _, err := admin.GetHardware(ctx, h.PK, client.Into(&meta)); err != nil || meta.ETag == "" {
		t.Fatalf("get hardware: %v, %+v", err, meta)
	}
	if _, err := admin.GetHardware(ctx, h.PK, client.IfNoneMatch(meta.ETag)); !errors.Is(err, client.ErrNotModified) {
		t.Errorf("If-None-Match the current tag: %v", err)
	}
	if etag, err := admin.HeadHardware(ctx, h.PK); err != nil || etag != meta.ETag {
		t.Errorf("head hardware: %q, %v", etag, err)
	}
	h, err = admin.UpdateHardware(ctx, h.PK, client.HardwareUpdate{Name: "H100-SXM5"}, client.IfMatch(meta.ETag))
	if err != nil || h.Name != "H100-SXM5" {
		t.Fatalf("update hardware: %+v, %v", h, err)
	}
	// The tag read before the rename is stale now: 412, typed.
	_, err = admin.PatchHardware(ctx, h.PK, client.HardwarePatch{Name: client.Ptr("H100")}, client.IfMatch(meta.ETag))
	if asError(t, err, http.StatusPreconditionFailed); !errors.Is(err, client.ErrPreconditionFailed) {
		t.Error(err)
	}
	list, err := admin.ListHardware(ctx, client.HardwareFilter{Name: client.Ptr("H100-SXM5")})
	if err != nil || len(list) != 1 || list[0].PK != h.PK {
		t.Fatalf("list hardware: %+v, %v", list, err)
	}

	// A node with a job is deleted only by force; If-Match guards writes.
	n, _, err := admin.CreateNode(ctx, client.NodeCreate{IP: "2001:DB8::7", Index: 0, CPUMem: gib, DriverVersion: "550",
		HardwareGeneration: &h.PK, GPUMem: client.Ptr(80 * gib)}, client.Into(&meta))
	if err != nil || n.IP != "2001:db8::7" || meta.Status != http.StatusCreated {
		t.Fatalf("create node: %+v, %v", n, err)
	}
	stale := meta.ETag
	if _, err := admin.PatchNode(ctx, n.PK, client.NodePatch{DriverVersion: client.Ptr("560")}, client.IfMatch(stale)); err != nil {
		t.Fatal(err)
	}
	_, err = admin.UpdateNode(ctx, n.PK, client.NodeUpdate{IP: n.IP, Index: 0, CPUMem: gib, DriverVersion: "570",
		HardwareGeneration: &h.PK, GPUMem: n.GPUMem}, client.IfMatch(stale))
	asError(t, err, http.StatusPreconditionFailed)
	if err := admin.DeleteNode(ctx, n.PK, client.IfMatch(stale)); !errors.Is(err, client.ErrPreconditionFailed) {
		t.Errorf("delete with a stale tag: %v", err)
	}
	if _, err := admin.ClaimNodes(ctx, client.NodeClaim{Job: 9}); err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteHardware(ctx, h.PK); !errors.Is(err, client.ErrConflict) {
		t.Errorf("delete hardware in use: %v", err)
	}
	if err := admin.DeleteNode(ctx, n.PK); !errors.Is(err, client.ErrConflict) {
		t.Errorf("delete a node holding a job: %v", err)
	}
	if err := admin.ForceDeleteNode(ctx, n.PK); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.HeadNode(ctx, n.PK); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("head of a deleted node: %v", err)
	}
	if err := admin.DeleteHardware(ctx, h.PK); err != nil {
		t.Fatal(err)
	}

	// The audit log tells the node's story, with the documents.
	entries, err := admin.ListAudit(ctx, client.AuditFilter{TargetType: client.Ptr(client.AuditNode), TargetPK: &n.PK})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
	}
	if !slices.Equal(actions, []string{"node.create", "node.update", "node.claim", "node.delete"}) {
		t.Errorf("actions %v", actions)
	}
	if a := entries[1].After; a == nil || (*a)["driver_version"] != "560" || entries[0].Before != nil || entries[3].After != nil {
		t.Errorf("documents: %+v", entries)
	}
	// Filtered by action and role: the one forced delete, by an admin.
	dels, err := admin.ListAudit(ctx, client.AuditFilter{Action: client.Ptr(client.ActionNodeDelete), Role: client.Ptr(client.RoleAdmin),
		TargetPK: &n.PK})
	if err != nil || len(dels) != 1 || dels[0].Action != "node.delete" || dels[0].Role != "admin" {
		t.Errorf("audit by action and role: %+v, %v", dels, err)
	}
	var ce *client.Error
	if _, err := admin.ListAudit(ctx, client.AuditFilter{Role: client.Ptr(client.AuditRole("root"))}); !errors.As(err, &ce) ||
		ce.Status != http.StatusBadRequest || len(ce.Fields) != 1 || ce.Fields[0].Field != "role" {
		t.Errorf("audit by an unknown role: %v", err)
	}

	// Revoking an agent's tokens stops it (every replica within seconds).
	agent := s.client(s.token("agent-leaked", registry.RoleAgent))
	if _, err := agent.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	rev, err := admin.RevokeTokens(ctx, client.RevokeRequest{Sub: client.Ptr("agent-leaked")})
	if err != nil || rev.Sub == nil || rev.RevokedBefore == nil {
		t.Fatalf("revoke: %+v, %v", rev, err)
	}
	apitest.Eventually(t, 10*time.Second, "the revoked token is refused", func() bool {
		_, err := agent.Ping(ctx)
		return errors.Is(err, client.ErrUnauthorized)
	})
	if _, err := admin.RevokeTokens(ctx, client.RevokeRequest{}); !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("revoke nothing: %v", err)
	}

	// The open endpoints.
	open, err := client.New(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := open.Healthz(ctx); err != nil || h.Status != "ok" {
		t.Errorf("healthz: %+v, %v", h, err)
	}
	if r, err := open.Readyz(ctx); err != nil || r.Status != "ready" {
		t.Errorf("readyz: %+v, %v", r, err)
	}
	for _, head := range []func(context.Context, ...client.CallOption) error{open.HeadHealthz, open.HeadReadyz, open.HeadOpenAPI} {
		if err := head(ctx); err != nil {
			t.Error(err)
		}
	}
	if doc, err := open.OpenAPI(ctx); err != nil || string(doc) != string(registryd.OpenAPI) {
		t.Errorf("openapi.yaml: %d bytes, %v", len(doc), err)
	}
	if _, err := open.Ping(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("ping without a token: %v", err)
	}
}

// The topology through the Go client: labels and fabric written by patch,
// a fabric gang claim, a watch filtered by fabric and selector, and the
// codes of its conflicts.
func TestTopologyFlow(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	var pks []int64
	for h := range 3 {
		for i := range int32(2) {
			n, _, err := admin.CreateNode(ctx, client.NodeCreate{IP: fmt.Sprintf("10.0.1.%d", h), Index: i, CPUMem: gib,
				DriverVersion: "550", GPUMem: client.Ptr(80 * gib), Fabric: client.Ptr(fmt.Sprintf("ib-%d", h%2))})
			if err != nil {
				t.Fatal(err)
			}
			pks = append(pks, n.PK)
		}
	}
	team := "research"
	n, err := admin.PatchNode(ctx, pks[0], client.NodePatch{Labels: map[string]*string{"team": &team}})
	if err != nil || n.Labels["team"] != "research" || *n.Fabric != "ib-0" {
		t.Fatalf("patched: %+v %v", n, err)
	}
	tok := s.token("sched-1", registry.RoleScheduler)
	sched, watcher := s.client(tok), s.watcher(tok, nil)
	events := make(chan client.Event, 10)
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	opened := make(chan struct{}, 1)
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- watcher.Watch(watchCtx, client.WatchOptions{Fabric: client.Ptr("ib-0"), Selector: client.Ptr("team=research"),
			Opened: func(*int64) { opened <- struct{}{} }},
			func(ev client.Event) error {
				if ev.Node != nil {
					events <- ev
				}
				return nil
			})
	}()
	select {
	case <-opened:
	case err := <-watchErr:
		t.Fatalf("the watch ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not open within 10s")
	}
	// ib-0 has hosts 10.0.1.0 and 10.0.1.2: a gang of both, 2 per host.
	got, err := sched.ClaimNodes(ctx, client.NodeClaim{Job: 5, Count: client.Ptr(4), PerHost: client.Ptr(2), SameFabric: client.Ptr(true)})
	if err != nil || len(got.Nodes) != 4 || *got.Nodes[0].Fabric != *got.Nodes[3].Fabric {
		t.Fatalf("gang: %+v %v", got, err)
	}
	caps, err := sched.ListFabrics(ctx, client.FabricListFilter{})
	if err != nil || len(caps) != 2 || *caps[0].Fabric != "ib-0" || caps[0].Nodes.Busy != 4 || caps[1].Nodes.Free != 2 || caps[1].Hosts != 1 {
		t.Errorf("capacity by fabric: %+v %v", caps, err)
	}
	_, err = sched.ClaimNodes(ctx, client.NodeClaim{Job: 6, Count: client.Ptr(4), PerHost: client.Ptr(2), SameFabric: client.Ptr(true)})
	if ce, ok := errors.AsType[*client.Error](err); !ok || ce.Code != client.CodeNoFabricFit {
		t.Errorf("a second gang: %v; want no_fabric_fit", err)
	}
	_, err = sched.ListNodes(ctx, client.NodeFilter{Selector: client.Ptr("team in (")})
	if ce, ok := errors.AsType[*client.Error](err); !ok || ce.Code != client.CodeInvalidRequest || len(ce.Fields) != 1 || ce.Fields[0].Field != "selector" {
		t.Errorf("a bad selector: %v", err)
	}
	// The stream may still bring the label's update, made just before it
	// opened; then the claim, of that node alone.
	for claimed := false; !claimed; {
		select {
		case ev := <-events:
			if ev.Node.Node.PK != pks[0] {
				t.Fatalf("the filtered watch sent %s of node %d, not the labelled node %d", ev.Type, ev.Node.Node.PK, pks[0])
			}
			claimed = ev.Type == string(client.EventClaimed)
		case <-time.After(10 * time.Second):
			t.Fatal("no claim of the labelled node within 10s")
		}
	}
}
