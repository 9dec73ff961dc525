package syncer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/syncer"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const lockKey = 4242

// bundle is a store, two fake clouds and a syncer reading both.
type bundle struct {
	t      *testing.T
	store  *store.Store
	scp    *scptest.Server
	e2e    *e2etest.Server
	syncer *syncer.Syncer
	srcs   []syncer.Source // the two clients, SCP's first
}

var fastRetry = provider.Retry{Attempts: 3, Base: 10 * time.Millisecond, Max: 2 * time.Second, Timeout: time.Second}

func newSyncer(t testing.TB, st *store.Store, srcs ...syncer.Source) *syncer.Syncer {
	t.Helper()
	return newSyncerWith(t, st, syncer.Config{Sources: srcs})
}

// newSyncerWith is a syncer of cfg whose Locker takes st's lock.
func newSyncerWith(t testing.TB, st *store.Store, cfg syncer.Config) *syncer.Syncer {
	t.Helper()
	cfg.Locker = func(ctx context.Context) (syncer.Store, func(), bool, error) {
		l, ok, err := st.TryLock(ctx, lockKey)
		if err != nil || !ok {
			return nil, nil, ok, err
		}
		return l.Store(), func() { l.Release(context.WithoutCancel(ctx)) }, true, nil
	}
	s, err := syncer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	b := &bundle{t: t, store: st, scp: scptest.New(t), e2e: e2etest.New(t)}
	sc, err := scp.New(scp.Config{Endpoint: b.scp.URL, AccessKey: scptest.AccessKey, SecretKey: scptest.SecretKey,
		AccountID: scptest.AccountID, PageSize: 20, Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	ec, err := e2e.New(e2e.Config{Endpoint: b.e2e.URL, APIKey: e2etest.TestAPIKey, Token: e2etest.TestToken,
		ProjectID: e2etest.TestProjectID, Location: e2etest.TestLocation, PerPage: 3, Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	b.srcs = []syncer.Source{sc, ec}
	b.syncer = newSyncer(t, st, sc, ec)
	return b
}

// imported is setup with the fake clouds' inventory imported by one pass.
func imported(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	b.inventory()
	if _, err := b.run(); err != nil {
		t.Fatal(err)
	}
	return b
}

// inventory fills both fakes: SCP 45 GPU nodes over 3 pages (B300 with a
// full description, H100 from the built-in table, CPU-only), one without
// an address, one stopped; E2E 5 clusters over 2 pages.
func (b *bundle) inventory() {
	b.scp.Lock()
	b.scp.Products = []scptest.Product{
		{ID: "p-b300", Name: "s8b300_metal", Description: "CPU 128 | Memory 4096GB | B300(268GB)*8 | Disk 960GB", GPUModel: "B300", MemoryValue: "4096", CPUValue: "128"},
		{ID: "p-h100", Name: "s2v16m128_metal", Description: "vCPU 16 │ Memory 128G │ Disk 480G", GPUModel: "H100", MemoryValue: "2048", CPUValue: "96"},
		{ID: "p-cpu", Name: "s1v8m32_metal", Description: "vCPU 8 │ Memory 32G │ Disk 100G", GPUModel: "", MemoryValue: "32", CPUValue: "8"},
	}
	b.scp.Nodes = nil
	for i := range 45 {
		n := scptest.Node{ID: fmt.Sprintf("scp-%02d", i), Name: fmt.Sprintf("gpu-node-%02d", i),
			PolicyIP: fmt.Sprintf("10.10.0.%d", i+1), ServerType: "s2v16m128_metal", State: "RUNNING"}
		switch {
		case i < 5:
			n.ServerType = "s8b300_metal"
		case i == 40:
			n.ServerType = "s1v8m32_metal"
		case i == 41:
			n.PolicyIP = ""
		case i == 42:
			n.State = "STOPPED"
		}
		b.scp.Nodes = append(b.scp.Nodes, n)
	}
	b.scp.Unlock()

	b.e2e.Lock()
	b.e2e.Clusters = []e2etest.Cluster{
		{ID: 1, Name: "train-a", Status: "Running", CPU: 96, GPU: 8, MemoryGB: 1024, GPUMemoryGB: 640, GPUCardType: "H100",
			Workers: []e2etest.Worker{{ID: 11, Name: "w1", PrivateIP: "10.20.0.1", Status: "Running"}, {ID: 12, Name: "w2", PrivateIP: "10.20.0.2", Status: "Running"}}},
		{ID: 2, Name: "cpu", Status: "Running", CPU: 8, GPU: 0, MemoryGB: 32, GPUMemoryGB: 0,
			Workers: []e2etest.Worker{{ID: 21, Name: "c1", PrivateIP: "10.20.1.1", Status: "Running"}}},
		{ID: 3, Name: "no-address", Status: "Running", CPU: 8, GPU: 1, MemoryGB: 64, GPUMemoryGB: 24, GPUCardType: "L4",
			Workers: []e2etest.Worker{{ID: 31, Name: "lost", Status: "Running"}}},
		{ID: 4, Name: "paused", Status: "Stopped", CPU: 8, GPU: 1, MemoryGB: 64, GPUMemoryGB: 48, GPUCardType: "L40S",
			Workers: []e2etest.Worker{{ID: 41, Name: "p1", PrivateIP: "10.20.4.1", Status: "Stopped"}}},
		{ID: 5, Name: "train-b", Status: "Running", CPU: 96, GPU: 8, MemoryGB: 1024, GPUMemoryGB: 1128, GPUCardType: "H200",
			Workers: []e2etest.Worker{{ID: 51, Name: "w1", PrivateIP: "10.20.5.1", Status: "Running"}}},
	}
	b.e2e.Unlock()
}

// table summarizes the nodes table: per source, how many nodes, how many
// schedulable, GPU memory per hardware name.
type table struct {
	Nodes, Schedulable map[string]int
	GPUMemGiB          map[string]int64 // hardware name → GiB per GPU
	CPUOnly            int
}

func (b *bundle) table() table {
	b.t.Helper()
	ctx := context.Background()
	tb := table{Nodes: map[string]int{}, Schedulable: map[string]int{}, GPUMemGiB: map[string]int64{}}
	rows, err := b.store.Pool().Query(ctx, `
		SELECT n.source, n.schedulable, coalesce(h.name, ''), coalesce(n.gpu_mem, -1)
		FROM nodes n LEFT JOIN hardware_generations h ON h.pk = n.hardware_generation`)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var src, hw string
		var sched bool
		var mem int64
		if err := rows.Scan(&src, &sched, &hw, &mem); err != nil {
			b.t.Fatal(err)
		}
		tb.Nodes[src]++
		if sched {
			tb.Schedulable[src]++
		}
		if mem < 0 {
			tb.CPUOnly++
		} else {
			tb.GPUMemGiB[hw] = mem >> 30
		}
	}
	return tb
}

func (b *bundle) run() ([]syncer.Summary, error) {
	b.t.Helper()
	return b.syncer.RunOnce(context.Background())
}

func TestSyncBothProviders(t *testing.T) {
	b := setup(t)
	b.inventory()
	sums, err := b.run()
	if err != nil {
		t.Fatalf("pass: %v\n%v", err, sums)
	}
	// SCP: 5 B300 hosts × 8, 38 H100 hosts × 8 (one stopped), 1 CPU-only,
	// 1 without address. E2E: 2 workers × 8 H100, 1 CPU, 1 L40S stopped,
	// 1 × 8 H200; the worker without an address is skipped.
	want := table{
		Nodes:       map[string]int{"scp": 5*8 + 38*8 + 1, "e2e": 16 + 1 + 1 + 8},
		Schedulable: map[string]int{"scp": 5*8 + 37*8 + 1, "e2e": 16 + 1 + 8},
		GPUMemGiB:   map[string]int64{"B300": 268, "H100": 80, "L40S": 48, "H200": 141},
		CPUOnly:     2,
	}
	if diff := cmp.Diff(want, b.table()); diff != "" {
		t.Errorf("nodes table (-want +got):\n%s", diff)
	}
	if len(sums) != 2 || sums[0].Provider != "scp" || sums[1].Provider != "e2e" {
		t.Fatalf("summaries: %v", sums)
	}
	if len(sums[0].Skipped) != 1 || !strings.Contains(sums[0].String(), "gpu-node-41") {
		t.Errorf("scp summary does not report the host without an address:\n%s", sums[0])
	}
	if len(sums[1].Skipped) != 1 || !strings.Contains(sums[1].String(), "no address") {
		t.Errorf("e2e summary does not report the worker without an address:\n%s", sums[1])
	}
	t.Logf("\n%s\n%s", sums[0], sums[1])

	// The topology arrived: fabric, the provider's labels, the GPU model.
	nodes, err := b.store.ListNodes(context.Background(), registry.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	bySource := map[string][]registry.Node{}
	for _, n := range nodes {
		bySource[n.Source] = append(bySource[n.Source], n)
	}
	for _, n := range bySource["scp"] {
		region, _ := n.Labels.Get("scp.registryd.io/region")
		_, pool := n.Labels.Get("scp.registryd.io/node-pool")
		_, fabName := n.Labels.Get("scp.registryd.io/fabric-name")
		if n.Fabric == nil || *n.Fabric != *bySource["scp"][0].Fabric || region != "kr-west1" || !pool || !fabName {
			t.Fatalf("scp node %s/%d: fabric %v, labels %s; want the fleet's one fabric and its labels", n.IP, n.Index, n.Fabric, n.Labels)
		}
		if n.GPUMem != nil && (n.GPUModel == nil || *n.GPUModel != "H100" && *n.GPUModel != "B300") {
			t.Errorf("scp node %s/%d: gpu_model %v", n.IP, n.Index, n.GPUModel)
		}
	}
	for _, n := range bySource["e2e"] {
		cluster, _ := n.Labels.Get("e2e.registryd.io/cluster")
		if want := map[string]string{"10.20.0.1": "cluster-1", "10.20.0.2": "cluster-1", "10.20.5.1": "cluster-5"}[n.IP]; want != "" &&
			(n.Fabric == nil || *n.Fabric != want || cluster != map[string]string{"cluster-1": "train-a", "cluster-5": "train-b"}[want]) {
			t.Errorf("e2e node %s/%d: fabric %v, labels %s; want %s", n.IP, n.Index, n.Fabric, n.Labels, want)
		}
	}

	// The second pass changes nothing.
	sums, err = b.run()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if r := s.Result; r.Added+r.Updated+r.Removed != 0 || r.Unchanged != s.Nodes {
			t.Errorf("second pass %s: %+v", s.Provider, r)
		}
	}
}

// Every provider fault leaves that provider's nodes exactly as they were;
// the other provider is still applied; transient faults are retried.
func TestSyncFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(b *bundle)
		fails bool
	}{
		{"401 bad credentials", func(b *bundle) { b.scp.SecretKey = "rotated-elsewhere" }, true},
		{"429 with Retry-After, then fine", func(b *bundle) { b.scp.RetryAfter[1] = 1 }, false},
		{"500 once on the middle page, then fine", func(b *bundle) { b.scp.FailPage[1] = 500 }, false},
		{"500 on the middle page every time", func(b *bundle) { b.scp.FailPageAlways[1] = 503 }, true},
		{"timeout on the last page", func(b *bundle) { b.scp.DelayPage[1] = 1500 * time.Millisecond }, true},
		{"malformed JSON on the last page", func(b *bundle) { b.scp.MalformedPage[1] = true }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := imported(t)
			before := b.table()
			// The next inventory differs: 4 hosts gone (32 of 345 nodes,
			// within the mass-removal guard's 10 %), one more e2e worker.
			b.scp.Lock()
			b.scp.Nodes = b.scp.Nodes[4:]
			tc.fault(b)
			b.scp.Unlock()
			b.e2e.Lock()
			b.e2e.Clusters[0].Workers = append(b.e2e.Clusters[0].Workers, e2etest.Worker{ID: 13, Name: "w3", PrivateIP: "10.20.0.3", Status: "Running"})
			b.e2e.Unlock()

			sums, err := b.run()
			after := b.table()
			if after.Nodes["e2e"] != before.Nodes["e2e"]+8 {
				t.Errorf("e2e was not applied: %d → %d nodes", before.Nodes["e2e"], after.Nodes["e2e"])
			}
			if !tc.fails {
				if err != nil {
					t.Fatalf("transient fault was not retried: %v", err)
				}
				if after.Nodes["scp"] != before.Nodes["scp"]-32 {
					t.Errorf("scp: %d → %d nodes, want 32 fewer", before.Nodes["scp"], after.Nodes["scp"])
				}
				return
			}
			if err == nil || sums[0].Err == nil || sums[1].Err != nil {
				t.Fatalf("want scp to fail alone: %v %v", err, sums)
			}
			if after.Nodes["scp"] != before.Nodes["scp"] || after.Schedulable["scp"] != before.Schedulable["scp"] {
				t.Errorf("a failed pass changed scp nodes: %v → %v", before, after)
			}
			msg := sums[0].String()
			for _, secret := range []string{scptest.SecretKey, scptest.AccessKey} {
				if strings.Contains(msg, secret) || strings.Contains(err.Error(), secret) {
					t.Errorf("the failure report leaks a credential: %s", msg)
				}
			}
		})
	}
}

// Hosts that vanish: free nodes go, busy ones stay unschedulable until
// released; an agent adopting an imported node keeps it through passes.
func TestSyncVanishedHostsAndAdoption(t *testing.T) {
	b := imported(t)
	ctx := context.Background()
	sched := registry.Actor{Principal: registry.Principal{Sub: "sched", Role: registry.RoleScheduler}}
	ip := "10.10.0.6" // an H100 host, 8 GPUs
	if _, err := b.store.ClaimNodes(ctx, sched, registry.Claim{Job: 77, Count: 2, Filter: registry.NodeFilter{IP: &ip}}); err != nil {
		t.Fatal(err)
	}
	agent := registry.Actor{Principal: registry.Principal{Sub: "agent-7", Role: registry.RoleAgent}}
	adopted, ok, err := b.store.CreateNode(ctx, agent, registry.NodeSpec{IP: "10.10.0.7", Index: 3, DriverVersion: "560.35.03"})
	if err != nil || !ok {
		t.Fatalf("adoption: %v %v", ok, err)
	}

	b.scp.Lock()
	var kept []scptest.Node
	for _, n := range b.scp.Nodes {
		if n.PolicyIP != ip {
			kept = append(kept, n)
		}
	}
	b.scp.Nodes = kept
	b.scp.Unlock()
	sums, err := b.run()
	if err != nil {
		t.Fatal(err)
	}
	if r := sums[0].Result; r.Removed != 6 || r.KeptBusy != 2 {
		t.Errorf("vanished host: %+v", r)
	}
	nodes, _ := b.store.ListNodes(ctx, registry.NodeFilter{IP: &ip})
	for _, n := range nodes {
		if n.Schedulable || *n.ProviderState != registry.ProviderGone || *n.CurrentJob != 77 {
			t.Errorf("busy node of a vanished host: %+v", n)
		}
	}
	// The adopted node keeps its owner and driver through passes.
	got, _ := b.store.GetNode(ctx, adopted.PK)
	if *got.Owner != "agent-7" || got.DriverVersion != "560.35.03" || got.Source != "scp" {
		t.Errorf("adopted node after a pass: %+v", got)
	}
	if _, _, err := b.store.ReleaseNodes(ctx, sched, registry.Release{Job: 77}); err != nil {
		t.Fatal(err)
	}
	sums, _ = b.run()
	if r := sums[0].Result; r.Removed != 2 || r.KeptBusy != 0 {
		t.Errorf("after release: %+v", r)
	}
}

// One replica syncs at a time; one that loses its database session during
// a pass writes nothing.
func TestSyncLock(t *testing.T) {
	b := setup(t)
	b.inventory()
	ctx := context.Background()
	other, ok, err := b.store.TryLock(ctx, lockKey)
	if err != nil || !ok {
		t.Fatalf("take the lock: %v %v", ok, err)
	}
	if _, err := b.run(); !errors.Is(err, syncer.ErrLocked) {
		t.Fatalf("pass while another replica syncs: %v", err)
	}
	other.Release(ctx)

	// The pass's session is killed while it fetches: it must not write.
	b.scp.Lock()
	b.scp.DelayPage[2] = 600 * time.Millisecond
	b.scp.Unlock()
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = b.store.Pool().Exec(ctx, `
			SELECT pg_terminate_backend(pid) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objid = $1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, lockKey)
	}()
	sums, err := b.run()
	if err == nil {
		t.Fatalf("a pass whose session died reported success: %v", sums)
	}
	if got := b.table(); got.Nodes["scp"]+got.Nodes["e2e"] != 0 {
		t.Errorf("a pass whose session died wrote nodes: %+v", got)
	}
	// The lock is free again for the next pass.
	b.scp.Lock()
	delete(b.scp.DelayPage, 2)
	b.scp.Unlock()
	if _, err := b.run(); err != nil {
		t.Fatalf("next pass: %v", err)
	}
}

func TestNodesMapping(t *testing.T) {
	inv := provider.Inventory{Hosts: []provider.Host{
		{ExternalID: "a", Name: "a", IP: "2001:DB8::1", GPUs: 2, GPUModel: "H100", GPUMemBytes: 80 << 30, CPUMemBytes: 1 << 40, State: "RUNNING", Running: true},
		{ExternalID: "b", Name: "b", IP: "10.0.0.2", GPUs: 0, GPUModel: "ignored", CPUMemBytes: 1 << 30},
		{ExternalID: "c", Name: "c", IP: "gpu-host.example", GPUs: 1},
		{ExternalID: "d", Name: "d", IP: "10.0.0.4", GPUs: 1_000_000_000, GPUModel: "H100"},
		{ExternalID: "e", Name: "e", IP: "10.0.0.5", GPUs: 1, GPUMemBytes: -1},
		{ExternalID: "f", Name: "f", IP: "10.0.0.6", GPUs: 1, Fabric: "fab\x00"},
		{ExternalID: "g", Name: "g", IP: "10.0.0.7", GPUs: 1, Labels: map[string]string{"Not A Key": "x"}},
	}}
	inv.Hosts[0].Fabric, inv.Hosts[0].Labels = "fab-1", map[string]string{"scp.registryd.io/region": "kr-west1"}
	nodes, skipped := syncer.Nodes(inv)
	if len(nodes) != 3 || nodes[0].IP != "2001:db8::1" || nodes[1].Index != 1 || *nodes[1].GPUMem != 80<<30 {
		t.Fatalf("nodes: %+v", nodes)
	}
	if cpu := nodes[2]; cpu.GPUMem != nil || cpu.GPUModel != "" || cpu.Index != 0 {
		t.Errorf("CPU-only host: %+v", cpu)
	}
	for _, n := range nodes[:2] {
		if n.Fabric != "fab-1" || n.Labels.String() != `{"scp.registryd.io/region":"kr-west1"}` {
			t.Errorf("GPU %d of host a: fabric %q, labels %s", n.Index, n.Fabric, n.Labels)
		}
	}
	var reasons []string
	for _, s := range skipped {
		reasons = append(reasons, s.ExternalID)
	}
	if diff := cmp.Diff([]string{"c", "d", "e", "f", "g"}, reasons); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
}

// A host the provider still reports but this pass cannot map (its address
// went missing, its cluster lost its worker details) keeps its nodes as
// they are: only hosts that vanish lose theirs.
func TestSyncKeepsSkippedHosts(t *testing.T) {
	b := imported(t)
	before := b.table()
	b.scp.Lock()
	b.scp.Nodes[10].PolicyIP = "" // briefly without an address
	b.scp.Unlock()
	b.e2e.Lock()
	b.e2e.Clusters[0].NoOfNodes = 2
	b.e2e.Clusters[0].Workers = nil // worker details missing this time
	b.e2e.Unlock()
	sums, err := b.run()
	if err != nil {
		t.Fatalf("%v: %v", err, sums)
	}
	if r := sums[0].Result; r.KeptSkipped != 8 || r.Removed != 0 {
		t.Errorf("scp: %+v", r)
	}
	if r := sums[1].Result; r.KeptSkipped != 16 || r.Removed != 0 {
		t.Errorf("e2e: %+v", r)
	}
	if diff := cmp.Diff(before, b.table()); diff != "" {
		t.Errorf("skipped hosts lost nodes:\n%s", diff)
	}
	if !strings.Contains(sums[1].String(), "kept as they were because their host was skipped") {
		t.Errorf("summary does not say so:\n%s", sums[1])
	}
}
