package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/agent"
	"github.com/registryd/registryd/internal/agent/agenttest"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/tlstest"
)

// agentRig is a real registryd (in-process `serve` on its own database,
// at an address kept across restarts), a fake nvidia-smi, and the agent's
// settings.
type agentRig struct {
	t        *testing.T
	db       string
	addr     string
	srvEnv   map[string]string
	srv      *server
	admin    string
	agentTok string
	smi      *agenttest.NvidiaSMI
	agentEnv map[string]string
	memInfo  string
	refresh  time.Duration // how often the agent reads its nodes again; its default when 0
	// tokenCheck is the agent's longest wait between looks at its token's
	// age; its default when 0.
	tokenCheck time.Duration
}

const agentHostMem = int64(256) << 30

var (
	gpu0 = agenttest.GPU{Index: 0, MiB: 81559, Driver: "550.54.15", Name: "NVIDIA H100 80GB HBM3"}
	gpu1 = agenttest.GPU{Index: 1, MiB: 81559, Driver: "550.54.15", Name: "NVIDIA H100 80GB HBM3"}
)

func newAgentRig(t *testing.T) *agentRig {
	t.Helper()
	return newAgentRigEnv(t, nil)
}

// newAgentRigEnv is newAgentRig with more of the server's settings; with
// REGISTRY_TLS_CERT_FILE among them the agent's REGISTRY_SERVER is https.
func newAgentRigEnv(t *testing.T, serverEnv map[string]string) *agentRig {
	t.Helper()
	r := &agentRig{t: t, db: pgtest.New(t), smi: agenttest.NewNvidiaSMI(t), memInfo: agenttest.MemInfo(t, agentHostMem)}
	// An address of our own, so a restarted server can take it again.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	ln.Close()
	r.srvEnv = map[string]string{"REGISTRY_DATABASE_URL": r.db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_LISTEN": r.addr,
		"REGISTRY_SHUTDOWN_TIMEOUT": "2s"}
	maps.Copy(r.srvEnv, serverEnv)
	scheme := "http://"
	if serverEnv["REGISTRY_TLS_CERT_FILE"] != "" {
		scheme = "https://"
	}
	r.startServer()
	r.admin = adminToken(t, r.srvEnv)
	r.agentTok = r.mint("agent-host-1")
	r.agentEnv = map[string]string{
		"REGISTRY_SERVER":      scheme + r.addr,
		"REGISTRY_TOKEN":       r.agentTok,
		"REGISTRY_AGENT_STATE": filepath.Join(t.TempDir(), "agent", "state.json"),
		"PATH":                 r.smi.Dir,
		"REGISTRY_LOG_FORMAT":  "text",
		"REGISTRY_LOG_LEVEL":   "debug",
	}
	return r
}

// mint is an agent token for sub, bound to the loopback address the
// agent registers from, through the real `registryd token`.
func (r *agentRig) mint(sub string) string {
	r.t.Helper()
	out, stderr, err := runCmd(r.t, r.srvEnv, "token", "--sub", sub, "--role", "agent", "--ip", "127.0.0.1")
	if err != nil {
		r.t.Fatalf("token: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func (r *agentRig) startServer() {
	r.t.Helper()
	// The port was free a moment ago, or was the stopped server's; a
	// restart may find it briefly held, so it is tried for a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", r.addr)
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("address %s stays taken: %v", r.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.srv = startServing(r.t, func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, []string{"serve"}, envFunc(r.srvEnv), stdout, stderr)
	})
}

// runningAgent is `registryd agent` running in-process.
type runningAgent struct {
	passes chan agent.Report
	logs   *apitest.Buffer
	stop   func() error
}

// startAgent runs the agent with the rig's settings, passing every 100ms
// and backing off between 50ms and 400ms, so that the tests run in
// seconds; every pass's report comes through passes.
func (r *agentRig) startAgent() *runningAgent {
	r.t.Helper()
	cfg, err := loadAgentConfig(envFunc(r.agentEnv))
	if err != nil {
		r.t.Fatal(err)
	}
	ra := &runningAgent{passes: make(chan agent.Report, 1000), logs: &apitest.Buffer{}}
	cfg.Interval, cfg.backoffMin, cfg.backoffMax = 100*time.Millisecond, 50*time.Millisecond, 400*time.Millisecond
	cfg.refresh = r.refresh
	cfg.tokenCheck = r.tokenCheck
	cfg.memInfo = r.memInfo
	cfg.afterPass = func(rep agent.Report) {
		select {
		case ra.passes <- rep:
		default: // nobody is waiting for so many passes
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runAgent(ctx, cfg, false, io.Discard, ra.logs) }()
	ra.stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("the agent did not stop within 10s of its context ending")
		}
	})
	r.t.Cleanup(func() {
		if err := ra.stop(); err != nil {
			r.t.Error(err)
		}
	})
	return ra
}

// await waits, at most 30s, for a pass after which cond holds, and
// returns that pass's report.
func (ra *runningAgent) await(t *testing.T, what string, cond func(agent.Report) bool) agent.Report {
	t.Helper()
	deadline := time.After(30 * time.Second)
	var last agent.Report
	for {
		select {
		case rep := <-ra.passes:
			if cond(rep) {
				return rep
			}
			last = rep
		case <-deadline:
			t.Fatalf("no pass within 30s with %s; last report: %+v\nagent log:\n%s", what, last, ra.logs.String())
		}
	}
}

// node is a node as the API answers it.
type node struct {
	PK                 int64             `json:"pk"`
	IP                 string            `json:"ip"`
	Index              int               `json:"index"`
	CPUMem             int64             `json:"cpu_mem"`
	DriverVersion      string            `json:"driver_version"`
	HardwareGeneration *int64            `json:"hardware_generation"`
	GPUMem             *int64            `json:"gpu_mem"`
	LastSeen           *string           `json:"last_seen"`
	Owner              *string           `json:"owner"`
	Source             string            `json:"source"`
	GPUModel           *string           `json:"gpu_model"`
	GPUUUID            *string           `json:"gpu_uuid"`
	Fabric             *string           `json:"fabric"`
	Labels             map[string]string `json:"labels"`
}

// insertNode runs an INSERT of a node (RETURNING pk) straight on the
// database, as an import would leave one, and answers the pk.
func (r *agentRig) insertNode(sql string) int64 {
	r.t.Helper()
	conn, err := pgx.Connect(context.Background(), r.db)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pk int64
	if err := conn.QueryRow(context.Background(), sql).Scan(&pk); err != nil {
		r.t.Fatal(err)
	}
	return pk
}

// nodes lists every node, as an admin.
func (r *agentRig) nodes() []node {
	r.t.Helper()
	code, body := call(r.t, "POST", "http://"+r.addr+"/v1/nodes/list", "", r.admin)
	if code != 200 {
		r.t.Fatalf("list: %d %s", code, body)
	}
	var ns []node
	if err := json.Unmarshal([]byte(body), &ns); err != nil {
		r.t.Fatal(err)
	}
	return ns
}

// awaitNodes waits for the registry to hold what cond wants, checking
// after each of the agent's passes, at most 30s.
func (r *agentRig) awaitNodes(ra *runningAgent, what string, cond func([]node) bool) []node {
	r.t.Helper()
	var ns []node
	ra.await(r.t, what, func(agent.Report) bool {
		ns = r.nodes()
		return cond(ns)
	})
	return ns
}

func pksOf(ns []node) map[int]int64 {
	m := map[int]int64{}
	for _, n := range ns {
		m[n.Index] = n.PK
	}
	return m
}

func ok(rep agent.Report) bool { return rep.Err == nil && len(rep.Problems) == 0 }

// The agent end to end against a real registryd: two GPUs registered with
// their memory, driver, hardware generation, owner and heartbeat; a
// driver upgrade; a GPU removed; the server restarted under it (the agent
// backs off and recovers, no duplicates); a node an admin deleted comes
// back; a host that loses its GPUs becomes CPU-only; a restarted agent
// keeps its pks; and SIGTERM (its context ending) is a clean stop.
func TestAgentEndToEnd(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	code, body := call(t, "POST", "http://"+r.addr+"/v1/hardware/create", `{"name":"H100"}`, r.admin)
	if code != 201 {
		t.Fatalf("hardware: %d %s", code, body)
	}
	var hw struct{ PK int64 }
	json.Unmarshal([]byte(body), &hw)

	// Two GPUs.
	r.smi.GPUs(gpu0, gpu1)
	ra := r.startAgent()
	ns := r.awaitNodes(ra, "two heartbeating nodes", func(ns []node) bool {
		return len(ns) == 2 && ns[0].LastSeen != nil && ns[1].LastSeen != nil
	})
	for i, n := range ns {
		if n.IP != "127.0.0.1" || n.Index != i || n.CPUMem != agentHostMem || n.GPUMem == nil || *n.GPUMem != 80<<30 ||
			n.DriverVersion != "550.54.15" || n.HardwareGeneration == nil || *n.HardwareGeneration != hw.PK ||
			n.Owner == nil || *n.Owner != "agent-host-1" || n.Source != "api" {
			t.Errorf("node %d: %+v", i, n)
		}
	}
	first := pksOf(ns)

	// A driver upgrade: the same nodes, the new driver.
	up0, up1 := gpu0, gpu1
	up0.Driver, up1.Driver = "560.35.03", "560.35.03"
	r.smi.GPUs(up0, up1)
	ns = r.awaitNodes(ra, "the new driver", func(ns []node) bool {
		return len(ns) == 2 && ns[0].DriverVersion == "560.35.03" && ns[1].DriverVersion == "560.35.03"
	})
	if !maps.Equal(pksOf(ns), first) {
		t.Errorf("pks changed with the driver: %v, were %v", pksOf(ns), first)
	}

	// GPU 1 removed: its node is deleted.
	r.smi.GPUs(up0)
	ns = r.awaitNodes(ra, "GPU 1's node deleted", func(ns []node) bool { return len(ns) == 1 })
	if ns[0].PK != first[0] {
		t.Errorf("the remaining node is %d, was %d", ns[0].PK, first[0])
	}

	// The server stops: the agent backs off, and recovers by itself once
	// a new server runs on the same database and address.
	if err := r.srv.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	ra.await(t, "the server found down", func(rep agent.Report) bool {
		return rep.ServerDown && rep.Wait >= 25*time.Millisecond && rep.Wait <= 400*time.Millisecond
	})
	ra.await(t, "a second failed pass", func(rep agent.Report) bool { return rep.ServerDown })
	r.smi.GPUs(up0, up1) // GPU 1 is back meanwhile
	r.startServer()
	ra.await(t, "recovery", ok)
	ns = r.awaitNodes(ra, "both nodes again", func(ns []node) bool { return len(ns) == 2 })
	if ns[0].PK != first[0] || ns[1].PK == first[1] {
		t.Errorf("after the restart: %v (first %v): node 0 must be the same, GPU 1 new", pksOf(ns), first)
	}
	if !strings.Contains(ra.logs.String(), "the registry cannot be used; retrying") || !strings.Contains(ra.logs.String(), "pass succeeded again") {
		t.Errorf("the outage and the recovery are not in the log:\n%s", ra.logs.String())
	}
	second := pksOf(ns)

	// An admin deletes node 0: the agent registers it again.
	if code, body := call(t, "DELETE", fmt.Sprintf("http://%s/v1/nodes/%d", r.addr, second[0]), "", r.admin); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	ns = r.awaitNodes(ra, "node 0 back", func(ns []node) bool {
		return len(ns) == 2 && pksOf(ns)[0] != second[0] && ns[0].LastSeen != nil && ns[1].LastSeen != nil
	})
	third := pksOf(ns)

	// No GPU left: one CPU-only node, index 0, the same pk.
	r.smi.Answer("No devices were found\n", "", 6)
	ns = r.awaitNodes(ra, "a CPU-only node", func(ns []node) bool {
		return len(ns) == 1 && ns[0].GPUMem == nil && ns[0].HardwareGeneration == nil
	})
	if ns[0].PK != third[0] || ns[0].Index != 0 {
		t.Errorf("CPU-only node: %+v, want pk %d index 0", ns[0], third[0])
	}

	// SIGTERM: a clean stop. The restarted agent takes up the same node.
	if err := ra.stop(); err != nil {
		t.Fatalf("the agent's stop: %v", err)
	}
	ra = r.startAgent()
	rep := ra.await(t, "a pass after the restart", ok)
	if rep.Nodes[agent.Key{IP: "127.0.0.1", Index: 0}] != third[0] || len(rep.Nodes) != 1 {
		t.Errorf("after the agent's restart: %v, want node %d", rep.Nodes, third[0])
	}
	ra.await(t, "another pass", ok)
	if ns := r.nodes(); len(ns) != 1 || ns[0].PK != third[0] {
		t.Errorf("nodes after the agent's restart: %+v", ns)
	}
	if strings.Contains(ra.logs.String(), "registered node") {
		t.Errorf("the restarted agent registered a node:\n%s", ra.logs.String())
	}
	// Every write the agent made is in the audit log as the agent's; no
	// create after its restart.
	code, body = call(t, "POST", "http://"+r.addr+"/v1/audit/list", `{"principal":"agent-host-1","limit":1000}`, r.admin)
	if code != 200 || strings.Count(body, `"action":"node.create"`) != 4 {
		t.Errorf("audit: %d, %d creates (want 4: two GPUs, GPU 1 back, node 0 back)\n%s", code, strings.Count(body, `"action":"node.create"`), body)
	}
}

// A node a cloud import made at the agent's pair is adopted, and keeps
// the provider's memory; a pair held by another principal's node is
// reported until an admin removes it.
func TestAgentAdoptsAndReportsConflicts(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	imported := r.insertNode(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, gpu_mem, source, external_id, provider_state)
		VALUES ('127.0.0.1', 0, 1099511627776, '', 85899345920, 'scp', 'host-1', 'running') RETURNING pk`)
	// Another agent holds GPU 1's pair.
	other := r.mint("agent-someone-else")
	code, body := call(t, "POST", "http://"+r.addr+"/v1/nodes/create",
		`{"ip":"127.0.0.1","index":1,"cpu_mem":1,"driver_version":"1","hardware_generation":null,"gpu_mem":null}`, other)
	if code != 201 {
		t.Fatalf("other agent's node: %d %s", code, body)
	}
	var held struct{ PK int64 }
	json.Unmarshal([]byte(body), &held)

	r.smi.GPUs(gpu0, gpu1)
	ra := r.startAgent()
	rep := ra.await(t, "the conflict reported", func(rep agent.Report) bool {
		return rep.Err == nil && len(rep.Problems) == 1 && len(rep.Nodes) == 1
	})
	if p := rep.Problems[agent.Key{IP: "127.0.0.1", Index: 1}]; !strings.Contains(p, fmt.Sprintf("held by node %d of another principal", held.PK)) {
		t.Errorf("problem: %q", p)
	}
	if rep.Nodes[agent.Key{IP: "127.0.0.1", Index: 0}] != imported {
		t.Errorf("nodes %v: the imported node %d was not adopted", rep.Nodes, imported)
	}
	ns := r.nodes()
	if ns[0].PK != imported || ns[0].Owner == nil || *ns[0].Owner != "agent-host-1" || ns[0].Source != "scp" ||
		ns[0].CPUMem != 1099511627776 || *ns[0].GPUMem != 85899345920 || ns[0].DriverVersion != "550.54.15" {
		t.Errorf("adopted node: %+v", ns[0])
	}
	if !strings.Contains(ra.logs.String(), "adopted the imported node") {
		t.Errorf("the adoption (200) is not told from a creation:\n%s", ra.logs.String())
	}
	// The admin removes the holder: the agent registers GPU 1.
	if code, body := call(t, "DELETE", fmt.Sprintf("http://%s/v1/nodes/%d", r.addr, held.PK), "", r.admin); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	ra.await(t, "GPU 1 registered", func(rep agent.Report) bool { return ok(rep) && len(rep.Nodes) == 2 })
	if ns := r.nodes(); len(ns) != 2 || *ns[1].Owner != "agent-host-1" {
		t.Errorf("nodes: %+v", ns)
	}
	// The README's filter finds the imported H100 and the one the agent
	// registered (81,559 MiB by nvidia-smi, 80 GiB as sold) alike.
	code, body = call(t, "POST", "http://"+r.addr+"/v1/nodes/list", `{"min_gpu_mem":85899345920}`, r.admin)
	var found []struct{ Source string }
	if err := json.Unmarshal([]byte(body), &found); code != 200 || err != nil || len(found) != 2 || found[0].Source != "scp" || found[1].Source != "api" {
		t.Errorf("min_gpu_mem 80 GiB: %d %s; want the imported node and the agent's", code, body)
	}
}

// The agent reports what nvidia-smi names (gpu_model, gpu_uuid), its
// REGISTRY_AGENT_FABRIC and REGISTRY_AGENT_LABELS; it sets its labels
// without removing an admin's, and on an imported host it keeps the
// provider's fabric and labels.
func TestAgentReportsTopology(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	imported := r.insertNode(`INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, gpu_mem, source,
		external_id, provider_state, gpu_model, fabric, labels)
		VALUES ('127.0.0.1', 1, 1099511627776, '', 85899345920, 'scp', 'host-1', 'running', 'H100', 'fab-7',
			'{"scp.registryd.io/region": "kr-west1"}') RETURNING pk`)
	r.refresh = 200 * time.Millisecond // the agent reads its nodes again soon
	r.agentEnv["REGISTRY_AGENT_FABRIC"] = "ib-local"
	r.agentEnv["REGISTRY_AGENT_LABELS"] = "rack=r12, team=ml"
	g0, g1 := gpu0, gpu1
	g0.UUID, g1.UUID = "GPU-0000", "GPU-1111"
	r.smi.GPUs(g0, g1)
	ra := r.startAgent()
	ns := r.awaitNodes(ra, "both nodes with their topology", func(ns []node) bool {
		return len(ns) == 2 && ns[0].GPUUUID != nil && ns[1].GPUUUID != nil
	})
	byIndex := map[int]node{ns[0].Index: ns[0], ns[1].Index: ns[1]}
	own, adopted := byIndex[0], byIndex[1]
	if *own.GPUModel != "NVIDIA H100 80GB HBM3" || *own.GPUUUID != "GPU-0000" || *own.Fabric != "ib-local" ||
		fmt.Sprint(own.Labels) != "map[rack:r12 team:ml]" {
		t.Errorf("the agent's node: %+v", own)
	}
	if adopted.PK != imported || *adopted.GPUModel != "NVIDIA H100 80GB HBM3" || *adopted.GPUUUID != "GPU-1111" ||
		*adopted.Fabric != "fab-7" || fmt.Sprint(adopted.Labels) != "map[rack:r12 scp.registryd.io/region:kr-west1 team:ml]" {
		t.Errorf("the adopted node: %+v; want the provider's fabric and labels beside the agent's", adopted)
	}
	// An admin's label stays; one the agent's differs from is set back.
	if code, body := call(t, "PATCH", fmt.Sprintf("http://%s/v1/nodes/%d", r.addr, own.PK),
		`{"labels":{"owner-team":"infra","rack":"moved"}}`, r.admin); code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	r.awaitNodes(ra, "the agent's label set back", func(ns []node) bool {
		return ns[1].PK == own.PK && fmt.Sprint(ns[1].Labels) == "map[owner-team:infra rack:r12 team:ml]"
	})
}

// A token rotated through REGISTRY_TOKEN_FILE is picked up without a
// restart: once the old one is revoked the agent backs off, and recovers
// when the file holds the new one.
func TestAgentTokenFileRotation(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(r.agentTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	delete(r.agentEnv, "REGISTRY_TOKEN")
	r.agentEnv["REGISTRY_TOKEN_FILE"] = tokFile
	r.smi.GPUs(gpu0)
	ra := r.startAgent()
	ra.await(t, "a first good pass", ok)

	// Revoke every token of the agent's principal issued until now.
	if code, body := call(t, "POST", "http://"+r.addr+"/v1/tokens/revoke", `{"sub":"agent-host-1"}`, r.admin); code != 200 {
		t.Fatalf("revoke: %d %s", code, body)
	}
	ra.await(t, "the revoked token refused", func(rep agent.Report) bool { return rep.ServerDown })
	// A revocation covers tokens issued up to its (whole) second: the new
	// one is minted after it.
	time.Sleep(1100 * time.Millisecond)
	fresh := r.mint("agent-host-1")
	tmp := tokFile + ".new"
	os.WriteFile(tmp, []byte(fresh+"\n"), 0o600)
	if err := os.Rename(tmp, tokFile); err != nil {
		t.Fatal(err)
	}
	ra.await(t, "recovery with the new token", ok)
	if ns := r.nodes(); len(ns) != 1 {
		t.Errorf("nodes: %+v", ns)
	}
}

// `registryd agent` as a command: --help, usage and configuration errors
// naming the variable, none of the server's settings needed or checked,
// a stop signal (a cancelled context) as exit 0, and --once.
func TestAgentCommand(t *testing.T) {
	t.Parallel()
	out, _, err := runCmd(t, map[string]string{}, "agent", "--help")
	if err != nil || !strings.Contains(out, "REGISTRY_AGENT_INTERVAL") {
		t.Errorf("--help: %v\n%s", err, out)
	}
	if _, stderr, err := runCmd(t, map[string]string{}, "agent", "--bogus"); !errors.Is(err, errUsage) || !strings.Contains(stderr, "usage: registryd agent") {
		t.Errorf("bad flag: %v %q", err, stderr)
	}
	if _, stderr, err := runCmd(t, map[string]string{}, "agent", "extra"); !errors.Is(err, errUsage) || !strings.Contains(stderr, "extra") {
		t.Errorf("stray argument: %v %q", err, stderr)
	}
	if out, _, _ := runCmd(t, map[string]string{}, "help"); !strings.Contains(out, "agent [--once]") {
		t.Errorf("the usage does not list agent:\n%s", out)
	}

	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte("a.b.c\n"), 0o600)
	caFile := filepath.Join(dir, "ca.pem")
	tlstest.WriteFile(t, caFile, tlstest.NewCA(t, "private CA").PEM)
	good := map[string]string{"REGISTRY_SERVER": "https://registry.example.com", "REGISTRY_TOKEN": "a.b.c",
		"REGISTRY_AGENT_STATE": filepath.Join(dir, "state", "state.json")}
	with := func(kv ...string) map[string]string {
		env := maps.Clone(good)
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(env, kv[i])
			} else {
				env[kv[i]] = kv[i+1]
			}
		}
		return env
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{with("REGISTRY_SERVER", ""), "REGISTRY_SERVER is not set"},
		{with("REGISTRY_SERVER", "registry.example.com"), "REGISTRY_SERVER"},
		{with("REGISTRY_SERVER", "ftp://registry.example.com"), "REGISTRY_SERVER"},
		{with("REGISTRY_SERVER", "https://user:pw@registry.example.com"), "must not carry credentials"},
		{with("REGISTRY_SERVER", "https://registry.example.com/?x=1"), "query"},
		{with("REGISTRY_SERVER", "https://:443"), "names no host"},
		{with("REGISTRY_SERVER", "https://registry.example.com:99999"), "port"},
		{with("REGISTRY_SERVER", "http://registry.example.com"), "REGISTRY_SERVER is plain http to registry.example.com, which is not this host"},
		{with("REGISTRY_SERVER", "http://10.0.0.5:8080"), "set REGISTRY_AGENT_INSECURE_HTTP=true"},
		{with("REGISTRY_SERVER", "http://10.0.0.5:8080", "REGISTRY_AGENT_INSECURE_HTTP", "maybe"), "REGISTRY_AGENT_INSECURE_HTTP"},
		{with("REGISTRY_AGENT_CA_FILE", filepath.Join(dir, "missing")), "REGISTRY_AGENT_CA_FILE=" + filepath.Join(dir, "missing") + ": open"},
		{with("REGISTRY_AGENT_CA_FILE", tokFile), "REGISTRY_AGENT_CA_FILE=" + tokFile + ": holds no PEM certificate"},
		{with("REGISTRY_AGENT_CA_FILE", caFile, "REGISTRY_SERVER", "http://127.0.0.1:8080"), "REGISTRY_AGENT_CA_FILE is set but REGISTRY_SERVER is not https"},
		{with("REGISTRY_TOKEN", ""), "set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE to an agent token"},
		{with("REGISTRY_TOKEN_FILE", tokFile), "set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE, not both"},
		{with("REGISTRY_TOKEN", "", "REGISTRY_TOKEN_FILE", filepath.Join(dir, "missing")), "REGISTRY_TOKEN_FILE"},
		{with("REGISTRY_TOKEN", "two words"), "REGISTRY_TOKEN must be the token alone"},
		{with("REGISTRY_AGENT_IP", "host.example"), "REGISTRY_AGENT_IP"},
		{with("REGISTRY_AGENT_IP", "fe80::1%eth0"), "REGISTRY_AGENT_IP"},
		{with("REGISTRY_AGENT_IP", "0.0.0.0"), "REGISTRY_AGENT_IP"},
		{with("REGISTRY_AGENT_INTERVAL", "fast"), "REGISTRY_AGENT_INTERVAL"},
		{with("REGISTRY_AGENT_INTERVAL", "100ms"), "REGISTRY_AGENT_INTERVAL"},
		{with("REGISTRY_AGENT_INTERVAL", "2h"), "REGISTRY_AGENT_INTERVAL"},
		{with("REGISTRY_AGENT_STATE", dir), "REGISTRY_AGENT_STATE"},
		{with("REGISTRY_AGENT_FABRIC", " ib-1"), "REGISTRY_AGENT_FABRIC"},
		{with("REGISTRY_AGENT_LABELS", "rack"), `REGISTRY_AGENT_LABELS: "rack" is not key=value`},
		{with("REGISTRY_AGENT_LABELS", "a=1,a=2"), `label "a" is given twice`},
		{with("REGISTRY_AGENT_LABELS", "Bad Key=1"), `label key "Bad Key"`},
		{with("REGISTRY_AGENT_LABELS", "scp.registryd.io/region=x"), "is set by the import"},
		{with("REGISTRY_LOG_LEVEL", "loud"), "REGISTRY_LOG_LEVEL"},
		{with("REGISTRY_LOG_FORMAT", "xml"), "REGISTRY_LOG_FORMAT"},
	} {
		_, _, err := runCmd(t, tc.env, "agent")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
	// A state folder that cannot be made stops the start, naming the
	// setting.
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o600)
	if _, _, err := runCmd(t, with("REGISTRY_AGENT_STATE", filepath.Join(blocker, "sub", "state.json")), "agent"); err == nil ||
		!strings.Contains(err.Error(), "REGISTRY_AGENT_STATE") {
		t.Errorf("unwritable state: %v", err)
	}

	// Plain http to another host, allowed on purpose: the agent starts,
	// and says what it costs.
	{
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var stderr apitest.Buffer
		env := with("REGISTRY_SERVER", "http://10.0.0.5:8080", "REGISTRY_AGENT_INSECURE_HTTP", "true", "REGISTRY_AGENT_IP", "10.0.0.7")
		if err := run(ctx, []string{"agent"}, envFunc(env), io.Discard, &stderr); err != nil ||
			!strings.Contains(stderr.String(), "the token crosses the network readable") {
			t.Errorf("http to another host with REGISTRY_AGENT_INSECURE_HTTP=true: %v\n%s", err, stderr.String())
		}
	}

	// None of the server's settings is needed, and bad ones are not the
	// agent's business: with its context ended (a signal) it exits 0.
	env := with("REGISTRY_TOKEN", "", "REGISTRY_TOKEN_FILE", tokFile, "REGISTRY_DB_MAX_CONNS", "0", "REGISTRY_JWT_SECRET", "short",
		"REGISTRY_MIGRATE", "maybe", "REGISTRY_AGENT_IP", "10.0.0.7", "REGISTRY_AGENT_INTERVAL", "1s")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stderr apitest.Buffer
	if err := run(ctx, []string{"agent"}, envFunc(env), io.Discard, &stderr); err != nil {
		t.Errorf("agent with a stop signal: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "agent stopped") {
		t.Errorf("no stop in the log:\n%s", stderr.String())
	}
}

// `registryd agent --once`: one pass against a real server, the nodes
// printed; a pass that fails exits non-zero.
func TestAgentOnce(t *testing.T) {
	t.Parallel()
	r := newAgentRig(t)
	r.smi.GPUs(gpu0, gpu1)
	env := maps.Clone(r.agentEnv)
	out, stderr, err := runCmd(t, env, "agent", "--once")
	if err != nil {
		t.Fatalf("--once: %v\n%s", err, stderr)
	}
	if !regexp.MustCompile(`(?m)^node \d+: 127\.0\.0\.1 index 0\nnode \d+: 127\.0\.0\.1 index 1\n$`).MatchString(out) {
		t.Errorf("output:\n%s", out)
	}
	if ns := r.nodes(); len(ns) != 2 {
		t.Errorf("nodes: %+v", ns)
	}
	// The same again: no new node, the same output.
	if out2, _, err := runCmd(t, env, "agent", "--once"); err != nil || out2 != out {
		t.Errorf("second --once: %v\n%s\nwas\n%s", err, out2, out)
	}
	// A broken driver fails the pass.
	r.smi.Answer("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9)
	if _, _, err := runCmd(t, env, "agent", "--once"); err == nil || !strings.Contains(err.Error(), "couldn't communicate") {
		t.Errorf("--once with a broken driver: %v", err)
	}
	// So does a node it cannot register.
	r.smi.GPUs(gpu0, gpu1, agenttest.GPU{Index: 2, MiB: 1, Driver: "550.54.15", Name: "X"})
	other := r.mint("agent-someone-else")
	call(t, "POST", "http://"+r.addr+"/v1/nodes/create",
		`{"ip":"127.0.0.1","index":2,"cpu_mem":1,"driver_version":"1","hardware_generation":null,"gpu_mem":null}`, other)
	out, _, err = runCmd(t, env, "agent", "--once")
	if err == nil || !strings.Contains(out, "problem: 127.0.0.1/2 is held by node") {
		t.Errorf("--once with a pair held by another: %v\n%s", err, out)
	}
	// A token bound to another address than the agent's: the server's
	// refusal is reported, nothing is registered.
	env["REGISTRY_AGENT_IP"] = "10.0.0.7"
	r.smi.GPUs(gpu0)
	out, _, err = runCmd(t, env, "agent", "--once")
	if err == nil || !strings.Contains(out, "problem: registering 10.0.0.7/0 was refused") || !strings.Contains(out, "bound to 127.0.0.1") {
		t.Errorf("--once at an address the token is not bound to: %v\n%s", err, out)
	}
	for _, n := range r.nodes() {
		if n.IP == "10.0.0.7" {
			t.Errorf("registered at an address the token is not bound to: %+v", n)
		}
	}
}

// The agent against a registryd serving TLS with a private CA's
// certificate: refused without REGISTRY_AGENT_CA_FILE (the system does not
// know the CA); with it, the agent registers its node and keeps it alive.
func TestAgentTrustsCAFile(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "private CA")
	certFile, keyFile := ca.Issue("127.0.0.1").Write(t, t.TempDir())
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	tlstest.WriteFile(t, caFile, ca.PEM)
	r := newAgentRigEnv(t, map[string]string{"REGISTRY_TLS_CERT_FILE": certFile, "REGISTRY_TLS_KEY_FILE": keyFile})
	r.smi.GPUs(gpu0)
	if _, _, err := runCmd(t, r.agentEnv, "agent", "--once"); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("without the CA file: %v", err)
	}
	r.agentEnv["REGISTRY_AGENT_CA_FILE"] = caFile
	ra := r.startAgent()
	ra.await(t, "a pass", ok)
	ra.await(t, "a heartbeat recorded", func(rep agent.Report) bool {
		resp, body, err := tlsGet(t, ca, "https://"+r.addr+"/v1/nodes/list", r.admin)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("list: %v %v %s", resp, err, body)
		}
		var ns []node
		if err := json.Unmarshal([]byte(body), &ns); err != nil {
			t.Fatal(err)
		}
		return ok(rep) && len(ns) == 1 && ns[0].LastSeen != nil
	})
	for range 3 {
		ra.await(t, "another pass (a heartbeat)", ok)
	}
}

// runMainEnv makes the test binary run registryd's main (see TestMain).
const runMainEnv = "REGISTRYD_TEST_RUN_MAIN"

// A real process: SIGTERM and SIGINT stop `registryd agent` with exit
// status 0, promptly, even while it backs off from a registry that does
// not answer.
func TestAgentExitsZeroOnSignal(t *testing.T) {
	t.Parallel()
	smi := agenttest.NewNvidiaSMI(t)
	smi.GPUs(gpu0)
	// An address nothing listens on: the agent backs off.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(os.Args[0], "agent")
		cmd.Env = []string{runMainEnv + "=1", "PATH=" + smi.Dir, "REGISTRY_SERVER=http://" + addr, "REGISTRY_TOKEN=a.b.c",
			"REGISTRY_AGENT_STATE=" + filepath.Join(t.TempDir(), "state.json"), "REGISTRY_LOG_FORMAT=text"}
		logs := &apitest.Buffer{}
		cmd.Stdout, cmd.Stderr = io.Discard, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Once it has found the registry down it is in its backoff.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(logs.String(), "the registry cannot be used") {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("%v: the agent did not try the registry within 30s:\n%s", sig, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Signal(sig)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%v: exit %v, want status 0\n%s", sig, err, logs.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: the agent did not exit within 10s", sig)
		}
		if !strings.Contains(logs.String(), "agent stopped") {
			t.Errorf("%v: no clean stop in the log:\n%s", sig, logs.String())
		}
	}
}
