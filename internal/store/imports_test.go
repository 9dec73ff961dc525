package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

var syncSCP = registry.Actor{Principal: registry.Principal{Sub: "sync:scp", Role: registry.RoleSystem}}

func gpuHost(ext, ip string, gpus int, model string, memGiB int64, running bool) []registry.ImportedNode {
	var out []registry.ImportedNode
	for i := range gpus {
		mem := memGiB << 30
		state := "RUNNING"
		if !running {
			state = "STOPPED"
		}
		out = append(out, registry.ImportedNode{ExternalID: ext, IP: ip, Index: i, CPUMem: 1 << 40, GPUMem: &mem,
			GPUModel: model, State: state, Running: running})
	}
	return out
}

type nodeView struct {
	Index       int
	Source      string
	Schedulable bool
	State       string
	GPUMem      int64
	Driver      string
	Job         int64
	Owner       string
}

// nodesOf reads every node at ip, by index.
func nodesOf(t *testing.T, st *store.Store, ip string) []nodeView {
	t.Helper()
	nodes, err := st.ListNodes(context.Background(), registry.NodeFilter{IP: &ip})
	if err != nil {
		t.Fatal(err)
	}
	var out []nodeView
	for _, n := range nodes {
		v := nodeView{Index: n.Index, Source: n.Source, Schedulable: n.Schedulable, Driver: n.DriverVersion}
		if n.ProviderState != nil {
			v.State = *n.ProviderState
		}
		if n.GPUMem != nil {
			v.GPUMem = *n.GPUMem >> 30
		}
		if n.CurrentJob != nil {
			v.Job = *n.CurrentJob
		}
		if n.Owner != nil {
			v.Owner = *n.Owner
		}
		out = append(out, v)
	}
	return out
}

func countAudit(t *testing.T, st *store.Store, principal string) int {
	t.Helper()
	var n int
	if err := st.Pool().QueryRow(context.Background(), "SELECT count(*) FROM audit_log WHERE principal = $1", principal).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestApplyImportLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	apply := func(nodes ...[]registry.ImportedNode) registry.ImportResult {
		t.Helper()
		var all []registry.ImportedNode
		for _, n := range nodes {
			all = append(all, n...)
		}
		res, err := st.ApplyImport(ctx, syncSCP, "scp", all, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a := gpuHost("a", "10.1.0.1", 2, "H100", 80, true)
	b := gpuHost("b", "10.1.0.2", 2, "H100", 80, true)
	c := gpuHost("c", "10.1.0.3", 1, "B300", 268, false)

	res := apply(a, b, c)
	if res.Added != 5 || len(res.HardwareAdded) != 2 {
		t.Fatalf("first pass: %+v", res)
	}
	if got := nodesOf(t, st, "10.1.0.3"); got[0].Schedulable || got[0].State != "STOPPED" {
		t.Errorf("stopped host imported schedulable: %+v", got)
	}
	entries := countAudit(t, st, "sync:scp")

	// Idempotent: a second identical pass writes nothing.
	res = apply(a, b, c)
	if res.Unchanged != 5 || res.Added+res.Updated+res.Removed != 0 {
		t.Errorf("second pass: %+v", res)
	}
	if n := countAudit(t, st, "sync:scp"); n != entries {
		t.Errorf("an idempotent pass wrote %d audit entries", n-entries)
	}

	// What agents and schedulers own survives an update of what the provider knows.
	pk := firstPK(t, st, "10.1.0.1")
	if _, err := st.Pool().Exec(ctx, "UPDATE nodes SET driver_version = '550.1', current_job = 9 WHERE pk = $1", pk); err != nil {
		t.Fatal(err)
	}
	if err := st.TouchNodes(ctx, []int64{pk}, []time.Time{time.Now()}); err != nil {
		t.Fatal(err)
	}
	a2 := gpuHost("a", "10.1.0.1", 2, "H100", 94, true) // memory changed
	res = apply(a2, b, c)
	if res.Updated != 2 {
		t.Errorf("memory change: %+v", res)
	}
	want := []nodeView{
		{Index: 0, Source: "scp", Schedulable: true, State: "RUNNING", GPUMem: 94, Driver: "550.1", Job: 9},
		{Index: 1, Source: "scp", Schedulable: true, State: "RUNNING", GPUMem: 94},
	}
	if diff := cmp.Diff(want, nodesOf(t, st, "10.1.0.1")); diff != "" {
		t.Errorf("after update (-want +got):\n%s", diff)
	}
	n, _ := st.GetNode(ctx, pk)
	if n.LastSeen == nil {
		t.Error("the import cleared last_seen")
	}

	// Host a vanishes: its free node goes, its busy node stays, gone.
	res = apply(b, c)
	if res.Removed != 1 || res.KeptBusy != 1 {
		t.Errorf("vanished host: %+v", res)
	}
	want = []nodeView{{Index: 0, Source: "scp", Schedulable: false, State: registry.ProviderGone, GPUMem: 94, Driver: "550.1", Job: 9}}
	if diff := cmp.Diff(want, nodesOf(t, st, "10.1.0.1")); diff != "" {
		t.Errorf("vanished busy node (-want +got):\n%s", diff)
	}
	// A gone node is never claimed again.
	ip := "10.1.0.1"
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 10, Count: 1, Filter: registry.NodeFilter{IP: &ip}}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("claiming a gone node: %v", err)
	}
	// Still busy: the next pass keeps it and writes nothing.
	if res = apply(b, c); res.KeptBusy != 1 || res.Removed != 0 {
		t.Errorf("still busy: %+v", res)
	}
	// Released: the next pass removes it.
	if _, _, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 9}); err != nil {
		t.Fatal(err)
	}
	if res = apply(b, c); res.Removed != 1 || res.KeptBusy != 0 {
		t.Errorf("after release: %+v", res)
	}
	if got := nodesOf(t, st, "10.1.0.1"); len(got) != 0 {
		t.Errorf("released gone node kept: %+v", got)
	}
	// An empty inventory removes every free node of the provider.
	if res = apply(); res.Removed != 3 {
		t.Errorf("empty inventory: %+v", res)
	}
}

func firstPK(t *testing.T, st *store.Store, ip string) int64 {
	t.Helper()
	nodes, err := st.ListNodes(context.Background(), registry.NodeFilter{IP: &ip})
	if err != nil || len(nodes) == 0 {
		t.Fatalf("no node at %s: %v", ip, err)
	}
	return nodes[0].PK
}

func TestApplyImportMergesAcrossSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	agent := registry.Actor{Principal: registry.Principal{Sub: "agent-1", Role: registry.RoleAgent}}

	// An agent registered a GPU first; the provider then reports its host.
	mem := int64(40) << 30
	if _, _, err := st.CreateNode(ctx, agent, registry.NodeSpec{IP: "10.2.0.1", Index: 0, CPUMem: 1, DriverVersion: "560.1", GPUMem: &mem}); err != nil {
		t.Fatal(err)
	}
	res, err := st.ApplyImport(ctx, syncSCP, "scp", gpuHost("h", "10.2.0.1", 2, "A100", 80, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Added != 1 || res.Updated != 1 {
		t.Errorf("merge: %+v", res)
	}
	want := []nodeView{
		{Index: 0, Source: "scp", Schedulable: true, State: "RUNNING", GPUMem: 80, Driver: "560.1", Owner: "agent-1"},
		{Index: 1, Source: "scp", Schedulable: true, State: "RUNNING", GPUMem: 80},
	}
	if diff := cmp.Diff(want, nodesOf(t, st, "10.2.0.1")); diff != "" {
		t.Errorf("merged (-want +got):\n%s", diff)
	}

	// The agent registering the second GPU adopts the imported row.
	n, adopted, err := st.CreateNode(ctx, agent, registry.NodeSpec{IP: "10.2.0.1", Index: 1, CPUMem: 5, DriverVersion: "560.1"})
	if err != nil || !adopted || n.Owner == nil || *n.Owner != "agent-1" || n.DriverVersion != "560.1" || *n.GPUMem != 80<<30 {
		t.Fatalf("adoption: %+v %v %v", n, adopted, err)
	}
	// Adopted once: another agent gets the usual conflict.
	other := registry.Actor{Principal: registry.Principal{Sub: "agent-2", Role: registry.RoleAgent}}
	if _, _, err := st.CreateNode(ctx, other, registry.NodeSpec{IP: "10.2.0.1", Index: 1, DriverVersion: "x"}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("second adoption: %v", err)
	}

	// Another provider reporting the same pair does not take it over.
	e2e := registry.Actor{Principal: registry.Principal{Sub: "sync:e2e", Role: registry.RoleSystem}}
	res, err = st.ApplyImport(ctx, e2e, "e2e", gpuHost("x/1", "10.2.0.1", 1, "H100", 80, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 1 || res.Added+res.Updated != 0 {
		t.Errorf("cross-provider: %+v", res)
	}
	if got := nodesOf(t, st, "10.2.0.1"); got[0].Source != "scp" {
		t.Errorf("e2e took over an scp node: %+v", got)
	}
	if _, err := st.ApplyImport(ctx, e2e, "api", nil, nil); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("import as api: %v", err)
	}
}

// The pass reads its provider's nodes without locks and then locks the
// rows it will write. Changes that land in between — a release, a claim —
// are what it decides on: nothing stale is written or audited.
func TestApplyImportDecidesOnLockedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	apply := func(nodes ...[]registry.ImportedNode) {
		t.Helper()
		var all []registry.ImportedNode
		for _, n := range nodes {
			all = append(all, n...)
		}
		if _, err := st.ApplyImport(ctx, syncSCP, "scp", all, nil); err != nil {
			t.Fatal(err)
		}
	}
	busyHost := gpuHost("busy", "10.3.0.1", 1, "H100", 80, true) // vanishes; its node is released mid-pass
	freeHost := gpuHost("free", "10.3.0.2", 1, "H100", 80, true) // vanishes; its node is claimed mid-pass
	kept := gpuHost("kept", "10.3.0.3", 1, "H100", 80, true)     // changes memory; claimed mid-pass
	apply(busyHost, freeHost, kept)
	sched := registry.Actor{Principal: registry.Principal{Sub: "sched", Role: registry.RoleScheduler}}
	claim := func(job int64, ip string) {
		t.Helper()
		if _, err := st.ClaimNodes(ctx, sched, registry.Claim{Job: job, Count: 1, Filter: registry.NodeFilter{IP: &ip}}); err != nil {
			t.Fatal(err)
		}
	}
	claim(1, "10.3.0.1")

	// A blocker holds an uncommitted node at a pair the next inventory
	// adds: the pass stalls on it after its read, before it locks.
	blocker, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version) VALUES ('10.3.0.9', 0, 1, 'x')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan registry.ImportResult)
	go func() {
		res, err := st.ApplyImport(ctx, syncSCP, "scp",
			append(gpuHost("kept", "10.3.0.3", 1, "H100", 94, true), gpuHost("new", "10.3.0.9", 1, "H100", 80, true)...), nil)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitForLockWait(t, st)
	if _, _, err := st.ReleaseNodes(ctx, sched, registry.Release{Job: 1}); err != nil {
		t.Fatal(err)
	}
	claim(2, "10.3.0.2")
	claim(3, "10.3.0.3")
	blocker.Rollback(ctx)
	res := <-done

	if got := nodesOf(t, st, "10.3.0.1"); len(got) != 0 {
		t.Errorf("released mid-pass, the node of a vanished host stayed: %+v", got)
	}
	want := []nodeView{{Index: 0, Source: "scp", Schedulable: false, State: registry.ProviderGone, GPUMem: 80, Job: 2}}
	if diff := cmp.Diff(want, nodesOf(t, st, "10.3.0.2")); diff != "" {
		t.Errorf("claimed mid-pass, the node of a vanished host (-want +got):\n%s", diff)
	}
	if res.Removed != 1 || res.KeptBusy != 1 || res.Updated != 1 || res.Added != 1 {
		t.Errorf("result: %+v", res)
	}
	// The audit entry of the update shows the claim in its "before".
	var before []byte
	err = st.Pool().QueryRow(ctx, `SELECT before FROM audit_log WHERE principal = 'sync:scp' AND action = 'node.update'
		AND target_pk = (SELECT pk FROM nodes WHERE ip = '10.3.0.3') ORDER BY id DESC LIMIT 1`).Scan(&before)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		CurrentJob *int64 `json:"current_job"`
	}
	if err := json.Unmarshal(before, &doc); err != nil || doc.CurrentJob == nil || *doc.CurrentJob != 3 {
		t.Errorf("audit before image is stale: %s", before)
	}
}

// waitForLockWait waits until some session of the test database waits on
// a lock.
func waitForLockWait(t *testing.T, st *store.Store) {
	t.Helper()
	for range 200 {
		var n int
		if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the pass never waited on the blocker")
}
