package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

var updateCLI = flag.Bool("update-cli", false, "rewrite testdata/cli/*.golden from what the CLI prints")

// cliFleet is a real registryd serve and what the CLI tests need of it.
type cliFleet struct {
	url, admin, reader string
	db                 string
	api                *client.Client // the admin's, for changes made "elsewhere"
}

// setupCLI starts a registryd serve on a database of its own. Its node
// cache is off, so that times a test sets in the database (for tables
// that show ages) are what the API answers.
func setupCLI(t *testing.T) *cliFleet {
	t.Helper()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_NODE_CACHE": "0", "REGISTRY_NODE_TTL": "24h"}
	srv := startServer(t, env)
	f := &cliFleet{url: srv.url, admin: adminToken(t, env), db: db}
	out, stderr, err := runCmd(t, env, "token", "--sub", "test-reader", "--role", "reader")
	if err != nil {
		t.Fatalf("token: %v %s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f.reader = lines[len(lines)-1]
	f.api, err = client.New(f.url, client.WithToken(f.admin), client.WithHTTPClient(apitest.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// env is the CLI's environment for the fleet, as an admin.
func (f *cliFleet) env(t *testing.T) map[string]string {
	return map[string]string{"REGISTRY_SERVER": f.url, "REGISTRY_TOKEN": f.admin, "HOME": t.TempDir()}
}

// cliResult is what a run of the binary did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the registryd binary (this test binary running main, see
// TestMain) with env and args, bounded by a minute.
func cli(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("registryd %q: %v", args, err)
	}
	return cliResult{out.String(), errb.String(), code}
}

// ok runs the binary and fails the test unless it exits 0.
func (f *cliFleet) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := cli(t, f.env(t), args...)
	if r.code != 0 {
		t.Fatalf("registryd %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// node registers a node at ip and index (80 GiB of GPU unless cpu).
func (f *cliFleet) node(t *testing.T, ip string, index int32, hw *int64, fabric string, labels map[string]string) client.Node {
	t.Helper()
	n := client.NodeCreate{IP: ip, Index: index, CPUMem: 1 << 40, DriverVersion: "550.54.15", HardwareGeneration: hw,
		GPUMem: client.Ptr(int64(80 << 30))}
	if fabric != "" {
		n.Fabric, n.GPUModel = &fabric, client.Ptr("NVIDIA H100 80GB HBM3")
	}
	if labels != nil {
		n.Labels = (*client.NodeLabels)(&labels)
	}
	got, _, err := f.api.CreateNode(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// exec runs SQL on the fleet's database.
func (f *cliFleet) exec(t *testing.T, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// golden compares got with testdata/cli/name.golden (-update-cli rewrites it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "cli", name+".golden")
	if *updateCLI {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/registryd -run %s -update-cli writes it)", err, t.Name())
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s differs (-want +got; -update-cli rewrites it):\n%s", path, d)
	}
}

// aFleet is a small fleet in a known state: hardware H100; host 10.0.0.8
// with four GPUs in fabric ib-a, team research, two of them claimed by
// job 41 on a 10-minute lease and one cordoned; host 10.0.1.2 with one
// CPU-only node. Every node was registered 3 hours ago, and node 1 last
// acted 5 minutes ago (set in the database: ages read the same on every
// run).
func aFleet(t *testing.T, f *cliFleet) {
	t.Helper()
	ctx := context.Background()
	hw, err := f.api.CreateHardware(ctx, client.HardwareCreate{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range int32(4) {
		f.node(t, "10.0.0.8", i, &hw.PK, "ib-a", map[string]string{"team": "research"})
	}
	cpu := client.NodeCreate{IP: "10.0.1.2", CPUMem: 1 << 30, DriverVersion: "550.54.15"}
	if _, _, err := f.api.CreateNode(ctx, cpu); err != nil {
		t.Fatal(err)
	}
	if _, err := f.api.ClaimNodes(ctx, client.NodeClaim{Job: 41, Count: client.Ptr(2), LeaseSeconds: client.Ptr(int64(600))}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.api.CordonNodes(ctx, client.NodeCordon{Nodes: &[]int64{3}, Reason: "fan failure"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.api.Ping(ctx, client.AsNode(1)); err != nil {
		t.Fatal(err)
	}
	// Heartbeats are stored in batches: wait for this one before
	// setting the time.
	waitFor(t, "node 1's heartbeat", func() bool {
		n, err := f.api.GetNode(ctx, 1)
		return err == nil && n.LastSeen != nil
	})
	f.exec(t, `UPDATE nodes SET created_at = now() - interval '3 hours 10 seconds'`)
	f.exec(t, `UPDATE node_liveness SET last_seen = now() - interval '5 minutes 10 seconds'`)
	f.exec(t, `UPDATE hardware_generations SET created_at = now() - interval '2 days 1 minute'`)
}

// The tables, as the built binary prints them against a real server, are
// the golden files': list (narrow, wide, filtered, sorted, without
// headers), get, fabrics and hardware.
func TestNodesCLITables(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"list", []string{"nodes", "list"}},
		{"list-wide", []string{"nodes", "list", "-o", "wide"}},
		{"list-free-sorted", []string{"nodes", "list", "--free", "--sort-by", "host", "--no-headers"}},
		{"list-by-state", []string{"nodes", "list", "--sort-by", "state", "--fabric", "ib-a"}},
		{"list-job", []string{"nodes", "list", "--job", "41", "--hardware", "H100", "--min-gpu-mem", "80Gi"}},
		{"list-name", []string{"nodes", "list", "-o", "name", "--selector", "team=research", "--limit", "3"}},
		{"get", []string{"nodes", "get", "3", "1"}},
		{"fabrics", []string{"fabrics", "list"}},
		{"hardware", []string{"hardware", "list"}},
	} {
		golden(t, tc.name, f.ok(t, tc.args...))
	}
}

// -o json and -o yaml are the API's documents: parsed, they are what the
// API answers; one node asked for is one document.
func TestNodesCLIJSON(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	want, err := f.api.ListNodes(context.Background(), client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []client.Node
	if err := json.Unmarshal([]byte(f.ok(t, "nodes", "list", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("nodes list -o json differs from the API (-api +cli):\n%s", d)
	}
	var one client.Node
	if err := json.Unmarshal([]byte(f.ok(t, "nodes", "get", "3", "-o", "json")), &one); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want[2], one); d != "" {
		t.Errorf("nodes get 3 -o json (-api +cli):\n%s", d)
	}
	// YAML carries the same members and values as the JSON.
	var fromJSON, fromYAML []map[string]any
	if err := json.Unmarshal([]byte(f.ok(t, "nodes", "list", "-o", "json", "--state", "busy")), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(f.ok(t, "nodes", "list", "-o", "yaml", "--state", "busy")), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if len(fromJSON) != 2 || len(fromYAML) != 2 {
		t.Fatalf("busy nodes: json %d, yaml %d; want 2", len(fromJSON), len(fromYAML))
	}
	for i := range fromJSON {
		for k, v := range fromJSON[i] {
			y := fromYAML[i][k]
			if tm, ok := y.(time.Time); ok {
				y = tm.Format(time.RFC3339Nano)
			}
			if n, ok := y.(int); ok {
				y = float64(n)
			}
			if d := cmp.Diff(v, y); d != "" && k != "labels" {
				t.Errorf("node %d %s: json %v, yaml %v", i, k, v, y)
			}
		}
	}
	// An empty list is an empty JSON list, not null.
	if out := f.ok(t, "nodes", "list", "-o", "json", "--owner", "nobody"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty list: %q", out)
	}
	var audit []client.AuditEntry
	if err := json.Unmarshal([]byte(f.ok(t, "audit", "list", "-o", "json", "--action", "node.cordon")), &audit); err != nil || len(audit) != 1 || *audit[0].TargetPK != 3 {
		t.Errorf("audit list --action node.cordon: %v %+v", err, audit)
	}
}

// waitFor polls what() until it holds, for at most 30 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exitStatus waits (bounded) for a process started with startProcess and
// returns its exit status.
func exitStatus(t *testing.T, p *process) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit within 60s; stdout:\n%s\nstderr:\n%s", p.stdout.String(), p.stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// A drain cordons its nodes and waits: it shows which job still holds
// them, and exits 0 once that job released them (from elsewhere, while it
// waited). One whose deadline comes first exits 3, naming the job and its
// nodes; one interrupted exits 1, naming them too.
func TestNodesCLIDrain(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // job 41 holds nodes 1 and 2
	ctx := context.Background()

	p := startProcess(t, f.env(t), "nodes", "drain", "1", "2", "4", "--interval", "50ms", "--deadline", "1m", "--reason", "psu")
	waitFor(t, "the drain's progress", func() bool { return strings.Contains(p.stdout.String(), "2 of 3 nodes still held by job 41\n") })
	select {
	case <-p.done:
		t.Fatalf("the drain ended before job 41 released its nodes: %v\n%s%s", p.err, p.stdout, p.stderr)
	default:
	}
	if _, err := f.api.ReleaseNodes(ctx, client.NodeRelease{Job: 41}); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, p); code != 0 {
		t.Fatalf("drain: exit %d\n%s%s", code, p.stdout, p.stderr)
	}
	out := p.stdout.String()
	for _, want := range []string{"node/1 draining (job 41 holds it)\n", "node/4 cordoned\n", "3 of 3 nodes drained"} {
		if !strings.Contains(out, want) {
			t.Errorf("drain's output lacks %q:\n%s", want, out)
		}
	}
	n, err := f.api.GetNode(ctx, 1)
	if err != nil || n.State != client.StateCordoned || *n.CordonReason != "psu" {
		t.Errorf("node 1 after the drain: %v %s %v", err, n.State, n.CordonReason)
	}

	// The deadline: job 42 holds node 5 and 2, and keeps them.
	if _, err := f.api.ClaimNodes(ctx, client.NodeClaim{Job: 42, Count: client.Ptr(1), IP: client.Ptr("10.0.1.2")}); err != nil {
		t.Fatal(err)
	}
	r := cli(t, f.env(t), "nodes", "drain", "--ip", "10.0.1.2", "--deadline", "300ms", "--interval", "50ms")
	if r.code != exitDeadline || !strings.Contains(r.stderr, "deadline 300ms reached: 1 of 1 nodes still held: job 42 holds node 5") {
		t.Errorf("drain past its deadline: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// Ctrl-C (SIGTERM here) stops the wait, and the exit status says the
	// drain is not done.
	p = startProcess(t, f.env(t), "nodes", "drain", "5", "--interval", "50ms")
	waitFor(t, "the drain's progress", func() bool { return strings.Contains(p.stdout.String(), "1 of 1 nodes still held by job 42\n") })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, p); code != 1 || !strings.Contains(p.stderr.String(), "interrupted: 1 of 1 nodes still held: job 42 holds node 5") {
		t.Errorf("an interrupted drain: exit %d\n%s", code, p.stderr)
	}
}

// nodes list --watch, as a process, shows a cordon made elsewhere: the
// node's row again, cordoned, and nothing of a node outside its filter;
// SIGTERM ends it with status 0.
func TestNodesCLIWatch(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	p := startProcess(t, f.env(t), "nodes", "list", "--watch", "--fabric", "ib-a")
	waitFor(t, "the first table", func() bool { return strings.Count(p.stdout.String(), "\n") >= 5 })
	// Node 5 (no fabric) is cordoned first, then node 4: the stream
	// brings them in that order, so once node 4's row is there, node 5's
	// event has been seen, and left out.
	for _, pk := range []int64{5, 4} {
		if _, err := f.api.CordonNodes(context.Background(), client.NodeCordon{Nodes: &[]int64{pk}, Reason: "elsewhere"}); err != nil {
			t.Fatal(err)
		}
	}
	row := regexp.MustCompile(`(?m)^4\s+10\.0\.0\.8\s+3\s+80Gi\s+cordoned\s`)
	waitFor(t, "node 4's row, cordoned", func() bool { return row.MatchString(p.stdout.String()) })
	if strings.Contains(p.stdout.String(), "10.0.1.2") {
		t.Errorf("the watch showed a node outside its filter:\n%s", p.stdout)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, p); code != 0 {
		t.Errorf("watch after SIGTERM: exit %d\n%s", code, p.stderr)
	}
}

// Contexts: set-context writes a 0600 file, the first context is the
// current one, use-context switches server and token, and the
// environment overrides the file.
func TestNodesCLIContexts(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	home := t.TempDir()
	env := map[string]string{"HOME": home}
	tokens := t.TempDir()
	for name, tok := range map[string]string{"admin": f.admin, "reader": f.reader} {
		if err := os.WriteFile(filepath.Join(tokens, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) cliResult { return cli(t, env, args...) }
	for _, args := range [][]string{
		{"config", "set-context", "ops", "--server", f.url, "--token-file", filepath.Join(tokens, "admin")},
		{"config", "set-context", "audit", "--server", f.url, "--token-file", filepath.Join(tokens, "reader")},
		{"config", "set-context", "down", "--server", "http://127.0.0.1:1", "--token", "x.y.z"},
	} {
		if r := run(args...); r.code != 0 {
			t.Fatalf("%q: exit %d %s", args, r.code, r.stderr)
		}
	}
	path := filepath.Join(home, ".config", "registryd", "config.yaml")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("contexts file: %v %v; want mode 0600", err, fi)
	}
	if r := run("config", "current-context"); r.stdout != "ops\n" {
		t.Errorf("current context: %+v", r)
	}
	if r := run("nodes", "cordon", "5"); r.code != 0 {
		t.Errorf("cordon as ops (admin): %+v", r)
	}

	// use-context switches the token: a reader may not cordon.
	if r := run("config", "use-context", "audit"); r.code != 0 {
		t.Fatal(r)
	}
	if r := run("nodes", "cordon", "4"); r.code != 1 || !strings.Contains(r.stderr, "403") {
		t.Errorf("cordon as audit (reader): %+v", r)
	}
	if r := run("nodes", "list", "-o", "name", "--state", "cordoned"); r.stdout != "node/3\nnode/5\n" {
		t.Errorf("list as audit: %+v", r)
	}
	if r := run("config", "get-contexts"); !regexp.MustCompile(`(?m)^\*\s+audit\s`).MatchString(r.stdout) {
		t.Errorf("get-contexts does not mark audit current:\n%s", r.stdout)
	}
	// ... and the server: nothing listens on port 1.
	if r := run("config", "use-context", "down"); r.code != 0 {
		t.Fatal(r)
	}
	if r := run("nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Errorf("list on context down: %+v", r)
	}
	// The environment overrides the file: the server, and the token
	// (REGISTRY_TOKEN_FILE replaces the context's token). Context down's
	// token is not sent to another server.
	env["REGISTRY_SERVER"] = f.url
	if r := run("nodes", "list", "-o", "name", "--job", "41"); r.code != 1 || !strings.Contains(r.stderr, "REGISTRY_TOKEN") {
		t.Errorf("context down's token for another server: %+v", r)
	}
	env["REGISTRY_TOKEN_FILE"] = filepath.Join(tokens, "admin")
	if r := run("nodes", "list", "-o", "name", "--job", "41"); r.code != 0 || r.stdout != "node/1\nnode/2\n" {
		t.Errorf("environment over the context: %+v", r)
	}
	env["REGISTRY_TOKEN"] = f.reader
	if r := run("nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "not both") {
		t.Errorf("both token variables: %+v", r)
	}
	delete(env, "REGISTRY_TOKEN")
	delete(env, "REGISTRY_TOKEN_FILE")
	delete(env, "REGISTRY_SERVER")

	// REGISTRY_CONFIG names another file; XDG_CONFIG_HOME moves the default.
	if r := run("config", "use-context", "nowhere"); r.code != exitNotFound {
		t.Errorf("use-context of a context that does not exist: %+v", r)
	}
	env["REGISTRY_CONFIG"] = filepath.Join(t.TempDir(), "other.yaml")
	if r := run("config", "current-context"); r.code != exitNotFound {
		t.Errorf("current-context of an empty file: %+v", r)
	}
	delete(env, "REGISTRY_CONFIG")
	env["XDG_CONFIG_HOME"] = t.TempDir()
	if r := run("config", "set-context", "x", "--server", f.url); r.code != 0 || !strings.Contains(r.stdout, env["XDG_CONFIG_HOME"]) {
		t.Errorf("set-context under XDG_CONFIG_HOME: %+v", r)
	}
}

// Exit statuses scripts rely on: 2 for usage, 4 for a pk that names
// nothing, 1 with the server's problem (and its request id) for a
// refusal.
func TestNodesCLIExitStatus(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	for _, args := range [][]string{
		{"nodes"},
		{"nodes", "list", "--bogus"},
		{"nodes", "list", "-o", "xml"},
		{"nodes", "list", "--state", "sleeping"},
		{"nodes", "list", "--sort-by", "colour"},
		{"nodes", "list", "--min-gpu-mem", "lots"},
		{"nodes", "list", "--ip", "10.0.0.300"},
		{"nodes", "get"},
		{"nodes", "get", "x"},
		{"nodes", "cordon"},
		{"nodes", "cordon", "3", "--selector", "team=research"},
		{"nodes", "drain", "3", "--deadline", "-1s"},
		{"nodes", "label", "3"},
		{"nodes", "label", "3", "=x"},
		{"nodes", "claim", "--count", "2"},
		{"nodes", "renew", "--job", "41"},
		{"nodes", "delete"},
		{"audit", "list", "--role", "king"},
		{"config", "use-context"},
		{"completion", "tcsh"},
	} {
		r := cli(t, f.env(t), args...)
		if r.code != 2 || !strings.Contains(r.stderr, "usage: registryd") || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error (2)", args, r.code, r.stdout, r.stderr)
		}
	}
	for _, args := range [][]string{
		{"nodes", "get", "999"},
		{"nodes", "get", "1", "999"},
		{"nodes", "cordon", "999"},
		{"nodes", "uncordon", "999"},
		{"nodes", "label", "999", "a=b"},
		{"nodes", "delete", "999"},
		{"nodes", "renew", "--job", "77", "--lease", "1m"},
		{"nodes", "list", "--hardware", "B300"},
	} {
		r := cli(t, f.env(t), args...)
		if r.code != exitNotFound {
			t.Errorf("%q: exit %d, stderr %q; want %d (not found)", args, r.code, r.stderr, exitNotFound)
		}
	}
	// A refusal: the reader may not cordon. The problem and its request
	// id are on stderr.
	env := f.env(t)
	env["REGISTRY_TOKEN"] = f.reader
	r := cli(t, env, "nodes", "cordon", "4", "--reason", "x")
	if r.code != 1 || !regexp.MustCompile(`^registryd: nodes cordon: 403 Forbidden: .*cordon.* \[request [0-9a-f]+\]\n$`).MatchString(r.stderr) {
		t.Errorf("a reader's cordon: exit %d, stderr %q; want 1 and the 403 problem with its request id", r.code, r.stderr)
	}
	// A claim refused for capacity names the reason.
	r = cli(t, f.env(t), "nodes", "claim", "--job", "50", "--count", "99")
	if r.code != 1 || !strings.Contains(r.stderr, "409") {
		t.Errorf("a claim of too many: %+v", r)
	}
}

// The scheduler's verbs and the label and delete verbs do what they say.
func TestNodesCLIJobsAndLabels(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	ctx := context.Background()
	if out := f.ok(t, "nodes", "claim", "--job", "60", "--count", "1", "--fabric", "ib-a", "--lease", "5m", "-o", "name"); out != "node/4\n" {
		t.Errorf("claim: %q", out)
	}
	if out := f.ok(t, "nodes", "renew", "--job", "60", "--lease", "20m", "-o", "name"); out != "node/4\n" {
		t.Errorf("renew: %q", out)
	}
	n, _ := f.api.GetNode(ctx, 4)
	if n.LeaseExpiresAt == nil || time.Until(*n.LeaseExpiresAt) < 15*time.Minute {
		t.Errorf("lease after renew: %v", n.LeaseExpiresAt)
	}
	if out := f.ok(t, "nodes", "release", "--job", "60", "-o", "name"); out != "node/4\n" {
		t.Errorf("release: %q", out)
	}
	f.ok(t, "nodes", "label", "1", "4", "tier=gold", "team-")
	for _, pk := range []int64{1, 4} {
		n, _ := f.api.GetNode(ctx, pk)
		if d := cmp.Diff(client.NodeLabels{"tier": "gold"}, n.Labels); d != "" {
			t.Errorf("node %d's labels: %s", pk, d)
		}
	}
	if out := f.ok(t, "nodes", "uncordon", "--selector", "team=research"); out != "node/3 uncordoned (free)\n" {
		t.Errorf("uncordon by selector: %q", out)
	}
	if r := cli(t, f.env(t), "nodes", "delete", "1"); r.code != 1 || !strings.Contains(r.stderr, "409") {
		t.Errorf("delete of a held node: %+v", r)
	}
	if out := f.ok(t, "nodes", "delete", "1", "--force"); out != "node/1 deleted\n" {
		t.Errorf("delete --force: %q", out)
	}
	if _, err := f.api.GetNode(ctx, 1); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("node 1 after delete: %v", err)
	}
}

// Every CLI command has a runner and a --help with an example, and the
// list of commands names each verb.
func TestNodesCLIHelp(t *testing.T) {
	t.Parallel()
	out, _, err := runCmd(t, nil, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for name := range cliRunners {
		if _, ok := findCommand(name); !ok {
			t.Errorf("%q runs, but the commands table has no such command", name)
		}
	}
	for _, c := range commands {
		_, cli := cliRunners[c.name]
		if !cli && c.reads != cmdCLI {
			continue
		}
		if !cli && !c.group {
			t.Errorf("%q reads the CLI's settings but is no CLI command", c.name)
		}
		help, _, err := runCmd(t, nil, append(strings.Fields(c.name), "--help")...)
		if err != nil || !strings.Contains(help, "Example") {
			t.Errorf("%s --help has no example: %v\n%s", c.name, err, help)
		}
		if !c.group && !strings.Contains(out, "  "+c.synopsis) {
			t.Errorf("the list of commands does not name %q", c.synopsis)
		}
	}
}

// Each completion script is valid in its shell (checked by the shell when
// it is installed) and names every command, subcommand and flag.
func TestNodesCLICompletion(t *testing.T) {
	t.Parallel()
	tree := buildTree()
	for _, sh := range completionShells {
		script, stderr, err := runCmd(t, nil, "completion", sh)
		if err != nil {
			t.Fatalf("completion %s: %v %s", sh, err, stderr)
		}
		for _, c := range commands {
			for _, w := range strings.Fields(c.name) {
				if !strings.Contains(script, w) {
					t.Errorf("%s script lacks %q", sh, w)
				}
			}
			for _, fl := range tree.flags[c.name] {
				if !strings.Contains(script, fl.Name) {
					t.Errorf("%s script lacks %s's flag %s", sh, c.name, fl.Name)
				}
			}
		}
		check := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}[sh]
		if _, err := exec.LookPath(check[0]); err != nil {
			if os.Getenv("CI") == "true" {
				t.Errorf("%s is not installed: CI checks every completion script with its shell", sh)
			}
			t.Logf("%s is not installed: its script's syntax is not checked", sh)
			continue
		}
		file := filepath.Join(t.TempDir(), "completion."+sh)
		if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(check[0], append(check[1:], file)...).CombinedOutput(); err != nil {
			t.Errorf("%s finds the script invalid: %v\n%s", sh, err, out)
		}
	}
	// bash completes for real: after `registryd nodes l`, list and label.
	if _, err := exec.LookPath("bash"); err == nil {
		script, _, _ := runCmd(t, nil, "completion", "bash")
		out, err := exec.Command("bash", "-c", script+`
COMP_WORDS=(registryd nodes l); COMP_CWORD=2; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd nodes drain --dead); COMP_CWORD=3; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd nodes list -o w); COMP_CWORD=4; _registryd; echo "${COMPREPLY[@]}"`).CombinedOutput()
		if err != nil || string(out) != "list label\n--deadline\nwide\n" {
			t.Errorf("bash completion: %v %q", err, out)
		}
	}
}

// The pure parts of the tables: human times, sizes, flags among
// arguments, and colour only on a terminal without NO_COLOR.
func TestNodesCLIFormatting(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	for d, want := range map[time.Duration]string{0: "now", -time.Hour: "now", 12 * time.Second: "12s ago",
		3*time.Minute + 59*time.Second: "3m ago", 5 * time.Hour: "5h ago", 47 * time.Hour: "47h ago", 72 * time.Hour: "3d ago"} {
		if got := ago(at(d), now); got != want {
			t.Errorf("ago(%s) = %q, want %q", d, got, want)
		}
	}
	if ago(nil, now) != "-" || until(nil, now) != "-" || until(at(time.Second), now) != "expired" || until(at(-9*time.Minute-30*time.Second), now) != "in 9m" {
		t.Error("ago or until")
	}
	for s, want := range map[string]int64{"80Gi": 80 << 30, "80G": 80 << 30, "80GiB": 80 << 30, "1024": 1024, "2T": 2 << 40, "512Mi": 512 << 20} {
		if got, err := parseBytes(s); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "lots", "-1", "1.5G", "99999999999T"} {
		if _, err := parseBytes(s); err == nil {
			t.Errorf("parseBytes(%q) accepted", s)
		}
	}
	if bytesText(client.Ptr(int64(80<<30))) != "80Gi" || bytesText(client.Ptr(int64(81559<<20))) != "81559Mi" || bytesText(nil) != "-" {
		t.Error("bytesText")
	}
	fs := newFlagSet("x")
	reason := fs.String("reason", "", "")
	rest, err := parseInterspersed(fs, []string{"3", "--reason", "fan", "4", "k-", "--", "--not-a-flag"})
	if err != nil || *reason != "fan" || strings.Join(rest, " ") != "3 4 k- --not-a-flag" {
		t.Errorf("parseInterspersed: %v %q %q", err, *reason, rest)
	}
	var buf strings.Builder
	if colourful(&buf, envFunc(nil)) || colourful(os.Stdout, envFunc(map[string]string{"NO_COLOR": "1"})) {
		t.Error("colour where it has no place")
	}
	tb := &table{header: []string{"A", "STATE"}, rows: [][]string{{"1", "free"}, {"22", "lost"}},
		paint: func(i int, c string) string {
			if i == 1 {
				return paintState(c)
			}
			return c
		}}
	tb.write(&buf, false)
	if want := "A   STATE\n1   \x1b[32mfree\x1b[0m\n22  \x1b[31mlost\x1b[0m\n"; buf.String() != want {
		t.Errorf("a coloured table:\n%q\nwant\n%q", buf.String(), want)
	}
	held := map[int64][]int64{42: {7}, 41: {6, 5}}
	if got := progressLine(held, 8); got != "3 of 8 nodes still held by jobs 41, 42" {
		t.Errorf("progressLine: %q", got)
	}
	if got := heldText(held, 8); got != "3 of 8 nodes still held: job 41 holds nodes 5 and 6; job 42 holds node 7" {
		t.Errorf("heldText: %q", got)
	}
}
