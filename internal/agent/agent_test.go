package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/registryd/registryd/internal/agent/agenttest"
	"github.com/registryd/registryd/internal/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	hostIP  = "10.0.0.7"
	hostMem = int64(512) << 30
)

var (
	h100a = agenttest.GPU{Index: 0, MiB: 81559, Driver: "550.54.15", Name: "NVIDIA H100 80GB HBM3"}
	h100b = agenttest.GPU{Index: 1, MiB: 81559, Driver: "550.54.15", Name: "NVIDIA H100 80GB HBM3"}
)

// syncBuffer is a log a test reads while the agent writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type bundle struct {
	api   *fakeAPI
	smi   *agenttest.NvidiaSMI
	cfg   Config
	agent *Agent
	logs  *syncBuffer
}

func setup(t *testing.T, opts ...func(*Config)) *bundle {
	t.Helper()
	b := &bundle{api: newFakeAPI(), smi: agenttest.NewNvidiaSMI(t), logs: &syncBuffer{}}
	b.cfg = Config{
		API:        b.api,
		IP:         hostIP,
		StatePath:  filepath.Join(t.TempDir(), "state", "state.json"),
		Path:       b.smi.Dir,
		MemInfo:    agenttest.MemInfo(t, hostMem),
		Interval:   10 * time.Second,
		BackoffMin: time.Second,
		BackoffMax: 8 * time.Second,
		Logger:     slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(&b.cfg)
	}
	b.restart(t)
	return b
}

// restart replaces the agent with a new one on the same state file, as a
// restarted process would be.
func (b *bundle) restart(t *testing.T) {
	t.Helper()
	a, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.agent = a
}

func (b *bundle) pass(t *testing.T) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.agent.RunOnce(ctx)
}

// passOK runs a pass that must succeed without problems and returns the
// calls it made to the API.
func (b *bundle) passOK(t *testing.T) (Report, []string) {
	t.Helper()
	b.api.takeCalls()
	rep := b.pass(t)
	if rep.Err != nil || len(rep.Problems) > 0 {
		t.Fatalf("pass: err %v, problems %v\nlog:\n%s", rep.Err, rep.Problems, b.logs.String())
	}
	return rep, b.api.takeCalls()
}

func ptr[T any](v T) *T { return &v }

func key(i int) Key { return Key{IP: hostIP, Index: i} }

func stateOf(t *testing.T, path string) map[Key]int64 {
	t.Helper()
	st, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Two GPUs: two nodes with the GPUs' memory in bytes, the host's memory,
// the driver and the hardware generation of the model; later passes only
// heartbeat them; the state file remembers both.
func TestTwoGPUs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hw := b.api.addHardware("H100")
	b.smi.GPUs(h100a, h100b)
	rep, calls := b.passOK(t)
	want := []string{"hardware NVIDIA H100 80GB HBM3", "hardware H100 80GB HBM3", "hardware H100",
		"create 10.0.0.7/0", "ping 1", "create 10.0.0.7/1", "ping 2"}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("first pass calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	for pk, idx := range map[int64]int{1: 0, 2: 1} {
		n, _ := b.api.get(pk)
		wantSpec := registry.NodeSpec{IP: hostIP, Index: idx, CPUMem: hostMem, DriverVersion: "550.54.15",
			HardwareGeneration: &hw, GPUMem: ptr(int64(80) << 30), GPUModel: ptr("NVIDIA H100 80GB HBM3")}
		if diff := cmp.Diff(wantSpec, n.Spec()); diff != "" {
			t.Errorf("node %d (-want +got):\n%s", pk, diff)
		}
		if n.LastSeen == nil {
			t.Errorf("node %d was registered but not heartbeated", pk)
		}
	}
	if got := b.smi.Args(); got != "--query-gpu=index,memory.total,driver_version,uuid,name --format=csv,noheader,nounits" {
		t.Errorf("nvidia-smi called with %q", got)
	}
	// Then only heartbeats: the generation is remembered, nothing changes.
	_, calls = b.passOK(t)
	if diff := cmp.Diff([]string{"ping 1", "ping 2"}, calls); diff != "" {
		t.Errorf("second pass calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 2}, stateOf(t, b.cfg.StatePath)); diff != "" {
		t.Errorf("state file (-want +got):\n%s", diff)
	}
	if rep.Wait != b.cfg.Interval {
		t.Errorf("wait after a good pass: %s", rep.Wait)
	}
}

// Without nvidia-smi, or with one that finds no device, the host is
// CPU-only: one node, index 0, gpu_mem and hardware_generation null.
func TestCPUOnly(t *testing.T) {
	t.Parallel()
	for name, prepare := range map[string]func(*agenttest.NvidiaSMI){
		"no nvidia-smi":                func(s *agenttest.NvidiaSMI) { s.Remove() },
		"no devices, status 6":         func(s *agenttest.NvidiaSMI) { s.Answer("No devices were found\n", "", 6) },
		"no devices, status 0":         func(s *agenttest.NvidiaSMI) { s.Answer("No devices were found\n", "", 0) },
		"empty answer":                 func(s *agenttest.NvidiaSMI) { s.Answer("", "", 0) },
		"no devices on stderr, status": func(s *agenttest.NvidiaSMI) { s.Answer("", "No devices were found\n", 6) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			prepare(b.smi)
			rep, _ := b.passOK(t)
			if diff := cmp.Diff(map[Key]int64{key(0): 1}, rep.Nodes); diff != "" {
				t.Fatalf("nodes (-want +got):\n%s", diff)
			}
			n, _ := b.api.get(1)
			if diff := cmp.Diff(registry.NodeSpec{IP: hostIP, Index: 0, CPUMem: hostMem}, n.Spec()); diff != "" {
				t.Errorf("CPU-only node (-want +got):\n%s", diff)
			}
		})
	}
}

// A GPU that disappears: its node is deleted, the others stay, and the
// state forgets it.
func TestGPURemoved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.smi.GPUs(h100a)
	rep, calls := b.passOK(t)
	if diff := cmp.Diff([]string{"ping 1", "delete 2"}, calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if _, ok := b.api.get(2); ok {
		t.Error("the removed GPU's node still exists")
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1}, stateOf(t, b.cfg.StatePath)); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

// The node of a removed GPU that holds a job cannot be deleted by its
// agent: it is reported, gets no heartbeat, and is deleted once released.
func TestGPURemovedWhileHoldingAJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.api.setJob(2, ptr(int64(4711)))
	b.smi.GPUs(h100a)
	b.api.takeCalls()
	before, _ := b.api.get(2)
	rep := b.pass(t)
	if rep.Err != nil || !strings.Contains(rep.Problems[key(1)], "job 4711 holds node") {
		t.Fatalf("err %v, problems %v", rep.Err, rep.Problems)
	}
	if rep.Nodes[key(1)] != 2 {
		t.Errorf("the busy node was forgotten: %v", rep.Nodes)
	}
	calls := b.api.takeCalls()
	if slices.Contains(calls, "ping 2") || !slices.Contains(calls, "delete 2") {
		t.Errorf("calls %v: want a delete and no heartbeat for node 2", calls)
	}
	if after, _ := b.api.get(2); !after.LastSeen.Equal(*before.LastSeen) {
		t.Error("the busy node of a removed GPU was heartbeated")
	}
	// The problem is logged once, not on every pass.
	b.pass(t)
	if n := strings.Count(b.logs.String(), "job 4711 holds node"); n != 1 {
		t.Errorf("the problem was logged %d times, want once:\n%s", n, b.logs.String())
	}
	b.api.setJob(2, nil)
	rep, _ = b.passOK(t)
	if _, ok := b.api.get(2); ok || len(rep.Nodes) != 1 {
		t.Errorf("released node not deleted: %v", rep.Nodes)
	}
	if !strings.Contains(b.logs.String(), "resolved") {
		t.Errorf("the end of the problem was not logged:\n%s", b.logs.String())
	}
}

// A driver upgrade updates driver_version acting as the node; pks stay.
func TestDriverUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	up := func(g agenttest.GPU) agenttest.GPU { g.Driver = "560.35.03"; return g }
	b.smi.GPUs(up(h100a), up(h100b))
	rep, calls := b.passOK(t)
	// A patch acting as the node is its heartbeat: no ping besides.
	if diff := cmp.Diff([]string{"patch 1", "patch 2"}, calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	for _, pk := range []int64{1, 2} {
		if n, _ := b.api.get(pk); n.DriverVersion != "560.35.03" {
			t.Errorf("node %d driver %q", pk, n.DriverVersion)
		}
	}
	if len(b.api.all()) != 2 || rep.Nodes[key(0)] != 1 || rep.Nodes[key(1)] != 2 {
		t.Errorf("nodes after the upgrade: %v", rep.Nodes)
	}
	_, calls = b.passOK(t)
	if slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "patch") }) {
		t.Errorf("patched again with nothing changed: %v", calls)
	}
}

// A node an admin deleted is registered again in the same pass.
func TestAdminDeletedNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.api.remove(2)
	rep, calls := b.passOK(t)
	if diff := cmp.Diff([]string{"ping 1", "ping 2", "create 10.0.0.7/1", "ping 3"}, calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 3}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 3}, stateOf(t, b.cfg.StatePath)); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

// A restarted agent takes up its nodes from the state file: it checks
// each once (acting as it), then heartbeats; nothing is created.
func TestRestartKeepsPKs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.restart(t)
	rep, calls := b.passOK(t)
	if diff := cmp.Diff([]string{"get 1", "get 2"}, calls[3:]); diff != "" {
		t.Errorf("calls after restart (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if _, calls = b.passOK(t); !slices.Equal(calls[len(calls)-2:], []string{"ping 1", "ping 2"}) {
		t.Errorf("second pass after restart: %v", calls)
	}
}

// GPUs removed while the agent was down: the restarted agent deletes
// their nodes, which only its state file still knows.
func TestRestartDeletesNodesOfGPUsRemovedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.smi.GPUs(h100a)
	b.restart(t)
	_, calls := b.passOK(t)
	if diff := cmp.Diff([]string{"get 1", "get 2", "delete 2"}, calls[3:]); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if len(b.api.all()) != 1 {
		t.Errorf("nodes left: %v", b.api.all())
	}
}

// A corrupt (or lost) state file is no reason to crash or to duplicate:
// the agent starts afresh, and each registration answered 409 leads it
// back to its own node.
func TestCorruptStateFile(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{
		"garbage":     "{not json",
		"truncated":   `{"version":1,"nodes":[{"ip":"10.0.0.7","in`,
		"version":     `{"version":99,"nodes":[]}`,
		"bad entry":   `{"version":1,"nodes":[{"ip":"10.0.0.7","index":0,"pk":-4}]}`,
		"unknown key": `{"version":1,"nodes":[],"colour":"red"}`,
		"missing":     "",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.smi.GPUs(h100a, h100b)
			b.passOK(t)
			if content == "" {
				os.Remove(b.cfg.StatePath)
			} else if err := os.WriteFile(b.cfg.StatePath, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			b.restart(t)
			rep, calls := b.passOK(t)
			if diff := cmp.Diff([]string{"create 10.0.0.7/0", "get 1", "create 10.0.0.7/1", "get 2"}, calls[3:]); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 2}, rep.Nodes); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
			if len(b.api.all()) != 2 {
				t.Errorf("duplicates: %v", b.api.all())
			}
			if content != "" && !strings.Contains(b.logs.String(), "cannot read the state file") {
				t.Errorf("no warning about the state file:\n%s", b.logs.String())
			}
			// The file is good again.
			if diff := cmp.Diff(map[Key]int64{key(0): 1, key(1): 2}, stateOf(t, b.cfg.StatePath)); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

// A state file whose pk names a node elsewhere (another host's, of the
// same principal) is not trusted: the agent forgets the pk, neither
// heartbeats nor deletes that node, and registers its own.
func TestStateFileNamesAnotherNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := b.api.add(registry.Node{IP: "10.9.9.9", Index: 0, Owner: ptr("agent-1")})
	if err := saveState(b.cfg.StatePath, map[Key]int64{key(0): other, key(5): other}); err != nil {
		t.Fatal(err)
	}
	b.smi.GPUs(h100a)
	rep, calls := b.passOK(t)
	if slices.Contains(calls, "delete 1") || slices.Contains(calls, "ping 1") {
		t.Errorf("acted on another host's node: %v", calls)
	}
	if diff := cmp.Diff(map[Key]int64{key(0): 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if _, ok := b.api.get(other); !ok {
		t.Error("another host's node was deleted")
	}
}

// The pair is held by another principal's node (409 naming it, 403 when
// the agent tries to act as it): reported once, the other GPUs carry on,
// and the agent registers once an admin has removed the holder.
func TestPairHeldByAnotherPrincipal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := b.api.add(registry.Node{IP: hostIP, Index: 0, Owner: ptr("someone-else")})
	b.smi.GPUs(h100a, h100b)
	rep := b.pass(t)
	if rep.Err != nil || !strings.Contains(rep.Problems[key(0)], "held by node 1 of another principal") {
		t.Fatalf("err %v problems %v", rep.Err, rep.Problems)
	}
	if diff := cmp.Diff(map[Key]int64{key(1): 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	b.pass(t)
	if n := strings.Count(b.logs.String(), "held by node 1"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	b.api.remove(holder)
	rep, _ = b.passOK(t)
	if diff := cmp.Diff(map[Key]int64{key(0): 3, key(1): 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes after the holder left (-want +got):\n%s", diff)
	}
}

// An imported node at the agent's pair is adopted (the server hands it
// over). The agent then reports only its driver: memory and generation
// are the provider's.
func TestAdoptsImportedNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hw := b.api.addHardware("H100")
	imported := b.api.add(registry.Node{IP: hostIP, Index: 0, CPUMem: 1 << 40, GPUMem: ptr(int64(80) << 30),
		HardwareGeneration: &hw, Source: "scp"})
	b.smi.GPUs(h100a)
	rep, calls := b.passOK(t)
	if rep.Nodes[key(0)] != imported || len(b.api.all()) != 1 {
		t.Fatalf("nodes %v, server %v", rep.Nodes, b.api.all())
	}
	n, _ := b.api.get(imported)
	if n.Owner == nil || *n.Owner != "agent-1" || n.CPUMem != 1<<40 || *n.GPUMem != 80<<30 || n.DriverVersion != "550.54.15" {
		t.Errorf("adopted node: %+v", n)
	}
	if slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "patch") }) {
		t.Errorf("the agent overrode the provider's values: %v", calls)
	}
	if !strings.Contains(b.logs.String(), "adopted the imported node") {
		t.Errorf("adoption not logged:\n%s", b.logs.String())
	}
	// A driver upgrade is still the agent's to report.
	g := h100a
	g.Driver = "560.35.03"
	b.smi.GPUs(g)
	if _, calls = b.passOK(t); !slices.Contains(calls, "patch 1") {
		t.Errorf("driver upgrade of an adopted node not patched: %v", calls)
	}
}

// While the server cannot be used the agent backs off with jitter, forgets
// nothing, and recovers by itself, back to the interval.
func TestServerDownBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.api.setDown(true)
	var waits []time.Duration
	for range 6 {
		rep := b.pass(t)
		if !rep.ServerDown || rep.Err == nil {
			t.Fatalf("pass while down: %+v", rep)
		}
		if len(rep.Nodes) != 2 {
			t.Fatalf("nodes forgotten while the server was down: %v", rep.Nodes)
		}
		waits = append(waits, rep.Wait)
	}
	// 1s, 2s, 4s, 8s, 8s, 8s, each drawn from the upper half.
	for i, w := range waits {
		hi := min(time.Second<<i, 8*time.Second)
		if w < hi/2 || w > hi {
			t.Errorf("wait %d is %s, want within [%s, %s]", i, w, hi/2, hi)
		}
	}
	b.api.setDown(false)
	rep, calls := b.passOK(t)
	if rep.Wait != b.cfg.Interval || !slices.Equal(calls, []string{"ping 1", "ping 2"}) {
		t.Errorf("after recovery: wait %s, calls %v", rep.Wait, calls)
	}
	if len(b.api.all()) != 2 {
		t.Errorf("duplicates after recovery: %v", b.api.all())
	}
	if !strings.Contains(b.logs.String(), "pass succeeded again") {
		t.Errorf("recovery not logged:\n%s", b.logs.String())
	}
}

// Jitter spreads waits over the upper half of the backoff, not onto one
// value.
func TestJitter(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for range 200 {
		w := jitter(8 * time.Second)
		if w < 4*time.Second || w > 8*time.Second {
			t.Fatalf("jitter(8s) = %s", w)
		}
		seen[w] = true
	}
	if len(seen) < 50 {
		t.Errorf("only %d distinct waits in 200", len(seen))
	}
}

// An nvidia-smi that exists but fails is an error of the pass: nothing is
// registered, deleted or heartbeated (the agent cannot vouch for GPUs it
// cannot see), the next pass comes after the interval, and the same
// failure is logged once.
func TestBrokenNvidiaSMI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.smi.Answer("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9)
	for range 3 {
		b.api.takeCalls()
		rep := b.pass(t)
		if rep.Err == nil || rep.ServerDown || !strings.Contains(rep.Err.Error(), "couldn't communicate with the NVIDIA driver") {
			t.Fatalf("pass with a broken driver: %+v", rep)
		}
		if calls := b.api.takeCalls(); len(calls) > 0 {
			t.Fatalf("the agent talked to the server on a failed discovery: %v", calls)
		}
		if rep.Wait != b.cfg.Interval || len(rep.Nodes) != 2 {
			t.Fatalf("wait %s nodes %v", rep.Wait, rep.Nodes)
		}
	}
	if n := strings.Count(b.logs.String(), "level=ERROR msg=\"pass failed"); n != 1 {
		t.Errorf("logged %d times at error level, want once:\n%s", n, b.logs.String())
	}
	if len(b.api.all()) != 2 {
		t.Error("nodes deleted on a failed discovery")
	}
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
}

// A hardware generation an admin creates later is picked up on the next
// lookup and set on the nodes the agent registered.
func TestHardwareGenerationCreatedLater(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.HardwareRecheck = time.Nanosecond })
	b.smi.GPUs(h100a)
	b.passOK(t)
	if n, _ := b.api.get(1); n.HardwareGeneration != nil {
		t.Fatalf("generation %v without any known", *n.HardwareGeneration)
	}
	if !strings.Contains(b.logs.String(), `hint="POST /v1/hardware/create {\"name\":\"H100\"}"`) {
		t.Errorf("no hint for the admin:\n%s", b.logs.String())
	}
	hw := b.api.addHardware("H100 80GB HBM3")
	_, calls := b.passOK(t)
	if n, _ := b.api.get(1); n.HardwareGeneration == nil || *n.HardwareGeneration != hw || !slices.Contains(calls, "patch 1") {
		t.Errorf("generation not set: %+v, calls %v", n, calls)
	}
}

// Without a recheck due, a model without a generation costs no lookups.
func TestHardwareLookupsAreSpaced(t *testing.T) {
	t.Parallel()
	b := setup(t) // HardwareRecheck: 5m
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	if _, calls := b.passOK(t); !slices.Equal(calls, []string{"ping 1", "ping 2"}) {
		t.Errorf("second pass: %v", calls)
	}
}

// An IP change: the nodes at the old address are deleted, new ones made.
func TestAddressChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a)
	b.passOK(t)
	b.cfg.IP = "10.0.0.8"
	b.restart(t)
	rep, _ := b.passOK(t)
	if diff := cmp.Diff(map[Key]int64{{IP: "10.0.0.8", Index: 0}: 2}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if _, ok := b.api.get(1); ok {
		t.Error("the node at the old address is left")
	}
}

// A new address the server refuses (a mistyped REGISTRY_AGENT_IP, or one
// the token is not bound to) does not cost the host its nodes: those at
// the old address are retired only once the new ones are registered.
func TestAddressChangeRefusedKeepsOldNodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.api.mu.Lock()
	b.api.refuseIP = map[string]bool{"10.0.0.99": true}
	b.api.mu.Unlock()
	b.cfg.IP = "10.0.0.99"
	b.restart(t)
	rep := b.pass(t)
	if len(rep.Problems) != 2 {
		t.Fatalf("problems %v, want the two refused registrations", rep.Problems)
	}
	for _, pk := range []int64{1, 2} {
		if _, ok := b.api.get(pk); !ok {
			t.Errorf("node %d at the old address was deleted although the new address was refused", pk)
		}
	}
	// Once the address is accepted, the old nodes go.
	b.api.mu.Lock()
	b.api.refuseIP = nil
	b.api.mu.Unlock()
	b.pass(t)
	rep, _ = b.passOK(t)
	if len(rep.Nodes) != 2 {
		t.Errorf("nodes %v", rep.Nodes)
	}
	for _, pk := range []int64{1, 2} {
		if _, ok := b.api.get(pk); ok {
			t.Errorf("node %d at the old address is left after the new ones registered", pk)
		}
	}
}

// Run ends with nil when its context does (SIGTERM), promptly, even in
// the middle of a backoff.
func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	passes := make(chan Report, 16)
	b := setup(t, func(c *Config) {
		c.BackoffMin, c.BackoffMax = time.Hour, time.Hour
		c.AfterPass = func(r Report) { passes <- r }
	})
	b.smi.GPUs(h100a)
	b.api.setDown(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.agent.Run(ctx) }()
	select {
	case r := <-passes:
		if !r.ServerDown {
			t.Fatalf("first pass: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no pass within 10s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v on cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its context ending")
	}
}

// A hung nvidia-smi is given up on after NvidiaSMITimeout.
func TestHungNvidiaSMI(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.NvidiaSMITimeout = 300 * time.Millisecond })
	b.smi.Hang()
	start := time.Now()
	rep := b.pass(t)
	if rep.Err == nil || !strings.Contains(rep.Err.Error(), "did not answer within 300ms") {
		t.Fatalf("pass: %+v", rep)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("pass took %s", d)
	}
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	api := newFakeAPI()
	for _, c := range []Config{
		{StatePath: "s", IP: hostIP},
		{API: api, IP: hostIP},
		{API: api, StatePath: "s"},
		{API: api, StatePath: "s", IP: "fe80::1%eth0"},
		{API: api, StatePath: "s", IP: "host.example"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// A host whose GPUs are all gone becomes CPU-only: node 0 stays (same
// pk), without GPU memory or hardware generation; the others go.
func TestGPUsGoneHostBecomesCPUOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.addHardware("H100")
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.smi.Answer("No devices were found\n", "", 6)
	rep, _ := b.passOK(t)
	if diff := cmp.Diff(map[Key]int64{key(0): 1}, rep.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	n, _ := b.api.get(1)
	if diff := cmp.Diff(registry.NodeSpec{IP: hostIP, Index: 0, CPUMem: hostMem}, n.Spec()); diff != "" {
		t.Errorf("node 0 (-want +got):\n%s", diff)
	}
}

// A GPU model the server knows no generation for leaves a generation an
// admin set by hand alone.
func TestUnknownModelKeepsAdminsGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a)
	b.passOK(t)
	hw := b.api.addHardware("Hopper")
	b.api.mu.Lock()
	b.api.nodes[1].HardwareGeneration = &hw
	b.api.mu.Unlock()
	b.restart(t) // reads the node afresh
	if _, calls := b.passOK(t); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "patch") }) {
		t.Errorf("patched: %v", calls)
	}
	if n, _ := b.api.get(1); n.HardwareGeneration == nil || *n.HardwareGeneration != hw {
		t.Errorf("the admin's generation was cleared: %+v", n)
	}
}

// What someone else changed in a node the agent reports (an admin's
// PATCH of driver_version) is set right when the agent reads its nodes
// again, which replaces that pass's ping.
func TestRefreshSetsRightOthersChanges(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Refresh = time.Hour })
	b.smi.GPUs(h100a)
	b.passOK(t)
	b.api.mu.Lock()
	b.api.nodes[1].DriverVersion = "edited"
	b.api.mu.Unlock()
	if _, calls := b.passOK(t); !slices.Equal(calls, []string{"ping 1"}) {
		t.Errorf("before a refresh is due: %v", calls)
	}
	b.agent.cfg.Refresh = time.Nanosecond
	if _, calls := b.passOK(t); !slices.Equal(calls, []string{"get 1", "patch 1"}) {
		t.Errorf("refresh: %v", calls)
	}
	if n, _ := b.api.get(1); n.DriverVersion != "550.54.15" {
		t.Errorf("driver %q", n.DriverVersion)
	}
}

// Nodes an older agent registered with the driver's figure (81,559 MiB
// for an H100 80GB) get the figure the GPU is sold with, which the
// imports store, from the agent after its upgrade (its restart takes up
// its nodes): a filter on gpu_mem then finds them with imported ones.
// Fault caught (tried once): the agent reported what nvidia-smi said.
func TestUpgradedAgentSetsNominalMemory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.smi.GPUs(h100a, h100b)
	b.passOK(t)
	b.api.mu.Lock()
	for _, pk := range []int64{1, 2} {
		b.api.nodes[pk].GPUMem = ptr(int64(81559) << 20)
	}
	b.api.mu.Unlock()
	b.restart(t)
	if _, calls := b.passOK(t); !slices.Equal(calls[len(calls)-4:], []string{"get 1", "patch 1", "get 2", "patch 2"}) &&
		!slices.Equal(calls[len(calls)-4:], []string{"get 1", "get 2", "patch 1", "patch 2"}) {
		t.Errorf("calls after the upgrade: %v", calls)
	}
	for _, pk := range []int64{1, 2} {
		if n, _ := b.api.get(pk); n.GPUMem == nil || *n.GPUMem != 80<<30 {
			t.Errorf("node %d gpu_mem %v MiB, want 80 GiB", pk, ptrMiB(n.GPUMem))
		}
	}
}

func ptrMiB(b *int64) any {
	if b == nil {
		return nil
	}
	return *b >> 20
}

// The agent's share of the topology: what nvidia-smi names, on every node
// it owns; its labels set (never others removed); its fabric only where no
// cloud import names one.
func TestPatchForTopology(t *testing.T) {
	labels := func(m map[string]string) registry.Labels {
		l, err := registry.MakeLabels(m)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	str := func(s string) *string { return &s }
	want := desired{NodeSpec: registry.NodeSpec{GPUModel: str("NVIDIA H100 80GB HBM3"), GPUUUID: str("GPU-1"),
		Fabric: str("ib-local"), Labels: labels(map[string]string{"rack": "r12", "team": "ml"})}}
	for _, tc := range []struct {
		name string
		n    registry.Node
		want []string
	}{
		{"a new api node", registry.Node{Source: "api"}, []string{"gpu_model", "gpu_uuid", "fabric", "labels"}},
		{"all in place, an admin's label beside", registry.Node{Source: "api", GPUModel: str("NVIDIA H100 80GB HBM3"), GPUUUID: str("GPU-1"),
			Fabric: str("ib-local"), Labels: labels(map[string]string{"rack": "r12", "team": "ml", "x": "y"})}, nil},
		{"an imported host's fabric stays", registry.Node{Source: "scp", GPUModel: str("H100"), GPUUUID: str("GPU-1"),
			Fabric: str("fab-7"), Labels: labels(map[string]string{"rack": "r12", "team": "ml"})}, []string{"gpu_model"}},
		{"an imported host without one takes the agent's", registry.Node{Source: "scp", GPUModel: str("NVIDIA H100 80GB HBM3"),
			GPUUUID: str("GPU-1"), Labels: labels(map[string]string{"rack": "r12", "team": "ml"})}, []string{"fabric"}},
		{"one label changed", registry.Node{Source: "api", GPUModel: str("NVIDIA H100 80GB HBM3"), GPUUUID: str("GPU-1"),
			Fabric: str("ib-local"), Labels: labels(map[string]string{"rack": "moved", "team": "ml"})}, []string{"labels"}},
	} {
		p, fields := patchFor(tc.n, want)
		if !slices.Equal(fields, tc.want) {
			t.Errorf("%s: patches %v, want %v", tc.name, fields, tc.want)
		}
		if slices.Contains(fields, "labels") {
			got, err := p.Labels.Apply(tc.n.Labels)
			if err != nil || got.Map()["rack"] != "r12" || got.Map()["team"] != "ml" {
				t.Errorf("%s: labels become %v (%v)", tc.name, got, err)
			}
			if tc.name == "one label changed" && len(p.Labels.Values) != 1 {
				t.Errorf("%s: the patch sets %v, want only the changed label", tc.name, p.Labels.Values)
			}
		}
	}
}
