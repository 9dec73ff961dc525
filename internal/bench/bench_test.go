package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// registrydBinary builds registryd once for the package's tests.
func registrydBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "registryd-bench-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "registryd")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/registryd/registryd/cmd/registryd").CombinedOutput()
		if err != nil {
			buildErr = errors.New("go build registryd: " + err.Error() + "\n" + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// workDir is a folder for a run's server, which the postgres user must be
// able to enter when the tests run as root: t.TempDir's parent is closed
// to others.
func workDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "registryd-bench-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// pgbenchOrSkip finds pgbench; without one it skips, except under CI,
// which installs PostgreSQL (and so pgbench) and must run both sides.
func pgbenchOrSkip(t *testing.T) string {
	t.Helper()
	p, err := FindPgbench()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so pgbench must be installed: %v", err)
		}
		return ""
	}
	return p
}

// The whole harness at a tiny size: every workload serves requests with
// no error, pgbench runs its script, the JSON lines parse, and the table
// names every path.
func TestHarnessEndToEnd(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	pgbench := pgbenchOrSkip(t)
	if pgbench == "" {
		t.Log("pgbench not installed (and CI unset): measuring registryd's side only")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	work := workDir(t)
	rep, err := Run(ctx, Config{
		Nodes: 800, Agents: 20, Duration: time.Second, Clients: 8,
		Registryd: bin, Pgbench: pgbench, WorkDir: work,
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s\nserver log:\n%s", err, stdout.String(), stderr.String(), readTail(filepath.Join(work, "serve.log")))
	}

	head, table, ok := strings.Cut(stdout.String(), "\n\n")
	if !ok {
		t.Fatalf("no table after the JSON lines:\n%s", stdout.String())
	}
	sc := bufio.NewScanner(strings.NewReader(head))
	sc.Buffer(nil, 1<<20)
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not JSON (%v): %s", len(lines)+1, err, sc.Text())
		}
		lines = append(lines, m)
	}
	if len(lines) != 1+len(AllWorkloads) {
		t.Fatalf("%d JSON lines, want the run's and one per workload (%d):\n%s", len(lines), len(AllWorkloads), head)
	}
	machine, _ := lines[0]["machine"].(map[string]any)
	if machine == nil || machine["postgresql"] == "" || machine["cores"] == nil {
		t.Errorf("first line has no machine description: %v", lines[0])
	}
	for i, name := range AllWorkloads {
		l := lines[i+1]
		if l["workload"] != name {
			t.Errorf("line %d is workload %v, want %s", i+2, l["workload"], name)
		}
		if rate, _ := l["rate"].(float64); rate <= 0 {
			t.Errorf("%s: rate %v, want > 0", name, l["rate"])
		}
		if errs, _ := l["errors"].(float64); errs != 0 {
			t.Errorf("%s: %v errors: %v", name, errs, l["error_samples"])
		}
		if rss, _ := l["server_peak_rss_bytes"].(float64); rss <= 0 {
			t.Errorf("%s: no server peak RSS", name)
		}
		if name == Claim || name == Gang { // the claim requests timed apart from their releases
			c, _ := l["claim_only"].(map[string]any)
			n, _ := c["claims"].(float64)
			p99, _ := c["p99_ms"].(float64)
			opMax, _ := l["max_ms"].(float64)
			// An op whose claim ended in the warm-up counts; its claim does
			// not: at most one per client.
			if ops, _ := l["ops"].(float64); n <= 0 || n < ops-gangClients || p99 <= 0 || p99 > opMax {
				t.Errorf("%s: claim_only %v: want about one claim per op (%v) and a p99 within the ops' max %v", name, c, ops, opMax)
			}
		}
		if name == Abandon {
			ab, _ := l["abandon"].(map[string]any)
			sent, _ := ab["sent"].(float64)
			held, ok := ab["held_after"].(float64)
			if sent <= 0 || !ok || held != 0 || ab["undisturbed_rate"] == nil {
				t.Errorf("abandon: %v, want claims sent, the rate alone and none held after", ab)
			}
		}
		if name == Renew { // one event per renewal, listing the job's nodes
			rn, _ := l["renew"].(map[string]any)
			renewals, _ := rn["renewals"].(float64)
			renewed, _ := rn["renewed"].(float64)
			listed, _ := rn["nodes_listed"].(float64)
			if renewals <= 0 || renewed != renewals || listed != renewals*renewJobNodes {
				t.Errorf("renew: %v, want one renewed event of %d nodes per renewal", rn, renewJobNodes)
			}
		}
		if name == Heartbeat || name == Retrieve || name == FreePage {
			want := "go"
			if FindWrk() != "" {
				want = "wrk"
			}
			if l["client"] != want {
				t.Errorf("%s: driven by %v, want %s", name, l["client"], want)
			}
		}
		if name == Fill { // every gang the fleet had, none left, each scheduler refused at the end
			fl, _ := l["fill"].(map[string]any)
			capacity, _ := fl["capacity"].(float64)
			placed, _ := fl["placed"].(float64)
			left, ok := fl["left"].(float64)
			refused, _ := fl["refused"].(float64)
			released, _ := fl["release_rate"].(float64)
			qs, _ := fl["quarters"].([]any)
			var inQuarters float64
			for _, q := range qs {
				n, _ := q.(map[string]any)["claims"].(float64)
				inQuarters += n
			}
			if capacity <= 0 || placed != capacity || !ok || left != 0 || refused < gangClients || released <= 0 || len(qs) != 4 || inQuarters != placed {
				t.Errorf("fill: %v, want every gang of the capacity placed, none left, %d refusals at least, releases timed", fl, gangClients)
			}
			if !strings.Contains(table, "gangs placed") {
				t.Errorf("the table has no fill line:\n%s", table)
			}
		}
		if name == Keep || name == Keep1 {
			k, _ := l["kept"].(map[string]any)
			jobs, _ := k["jobs"].(float64)
			nodes, _ := k["nodes"].(float64)
			released, _ := k["release_rate"].(float64)
			size := map[string]float64{Keep: gangSize, Keep1: 1}[name]
			if jobs <= 0 || nodes != jobs*size || released <= 0 {
				t.Errorf("%s: kept %v, want jobs of %v nodes held to the end, then released (timed)", name, k, size)
			}
		}
		if pgbench != "" && name != ListAll && name != Startup && name != Fill && name != Keep && name != Keep1 { // those have no pgbench script
			p, _ := l["pgbench"].(map[string]any)
			if tps, _ := p["tps"].(float64); tps <= 0 || p["error"] != nil {
				t.Errorf("%s: pgbench %v, want a tps and no error", name, p)
			}
			p50, _ := p["p50_ms"].(float64)
			p99, _ := p["p99_ms"].(float64)
			if p50 <= 0 || p99 < p50 {
				t.Errorf("%s: pgbench %v, want its p50 and p99 from its transaction log", name, p)
			}
			if ratio, _ := l["ratio"].(float64); ratio <= 0 {
				t.Errorf("%s: no ratio", name)
			}
			if name == Fabric { // counted apart: the transactions that claimed a whole gang
				whole, _ := p["whole_transactions"].(float64)
				all, _ := p["transactions"].(float64)
				if whole <= 0 || whole > all {
					t.Errorf("fabric: pgbench %v, want its whole gangs counted (1..%v)", p, all)
				}
			}
		}
		if !strings.Contains(table, "| "+rep.Results[i].Path+clientNote(rep.Results[i].Client)+" |") {
			t.Errorf("the table has no row for %s:\n%s", name, table)
		}
	}
	checkListAll(t, rep, table)
	checkStartup(t, rep, table)
	for _, want := range []string{"| path | clients | registryd rate | p50 | p99 |", "Machine: ", "synchronous_commit=", "registryd peak RSS"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	// The server it started is gone, and with it its PostgreSQL.
	if procs := processesUsing(work); len(procs) > 0 {
		t.Errorf("processes still running on %s: %v", work, procs)
	}
}

// listall streamed whole lists of the 800 nodes, with a throughput, and
// PostgreSQL's own read of the same rows to compare with.
func checkListAll(t *testing.T, rep *Report, table string) {
	t.Helper()
	r := result(rep, ListAll)
	if r == nil || r.List == nil {
		t.Fatalf("no listall result with list stats: %+v", r)
	}
	l := r.List
	if r.Clients != 1 || r.Ops == 0 || r.P50MS <= 0 || r.P99MS < r.P50MS {
		t.Errorf("listall: clients %d, %d lists, p50 %v ms, p99 %v ms", r.Clients, r.Ops, r.P50MS, r.P99MS)
	}
	// A node's document is well over 300 bytes.
	if l.Nodes != 800 || l.Bytes < 800*300 || l.MBPerS <= 0 || l.NodesPerS <= 0 {
		t.Errorf("listall: %+v", l)
	}
	if l.PgxReadMS <= 0 || l.PgxReads < 1 || l.PgxError != "" || r.Ratio <= 0 {
		t.Errorf("listall: pgx read %v ms ×%d (%s), ratio %v", l.PgxReadMS, l.PgxReads, l.PgxError, r.Ratio)
	}
	for _, want := range []string{"- listall: ", " MB/s, ", "nodes/s (one list: 800 nodes", "PostgreSQL hands the same rows to pgx in ", "| one full read (pgx) |"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
}

// startup restarted the server three times on its data, each start timed
// from exec to the banner and to /readyz 200.
func checkStartup(t *testing.T, rep *Report, table string) {
	t.Helper()
	r := result(rep, Startup)
	if r == nil || r.Start == nil {
		t.Fatalf("no startup result with times: %+v", r)
	}
	s := r.Start
	if r.Ops != startupRuns || len(s.ReadyMS) != startupRuns || len(s.BannerMS) != startupRuns || len(s.StopMS) != startupRuns {
		t.Fatalf("startup: %d ops, ready %v, banner %v: want %d of each", r.Ops, s.ReadyMS, s.BannerMS, startupRuns)
	}
	for i := range s.ReadyMS {
		if s.BannerMS[i] <= 0 || s.ReadyMS[i] < s.BannerMS[i] || s.ReadyMS[i] > 2*60*1000 {
			t.Errorf("start %d: banner %v ms, ready %v ms: want 0 < banner ≤ ready < 2 min", i, s.BannerMS[i], s.ReadyMS[i])
		}
		if s.StopMS[i] <= 0 || s.StopMS[i] > 60*1000 {
			t.Errorf("start %d: stop took %v ms, want 0 < stop ≤ 60 s", i, s.StopMS[i])
		}
	}
	if s.ReadyMinMS <= 0 || s.ReadyMinMS > s.ReadyMedianMS || s.BannerMinMS > s.BannerMedianMS || r.P50MS != s.ReadyMedianMS {
		t.Errorf("startup: %+v, p50 %v", s, r.P50MS)
	}
	if !strings.Contains(table, "- startup with 800 nodes: banner after ") || !strings.Contains(table, "stop (SIGTERM to exit) ") {
		t.Errorf("the table lacks startup's times:\n%s", table)
	}
}

func result(rep *Report, name string) *Result {
	for i := range rep.Results {
		if rep.Results[i].Workload == name {
			return &rep.Results[i]
		}
	}
	return nil
}

// processesUsing lists the command lines that mention dir: the server
// (by its binary's environment we cannot see) is found through its
// PostgreSQL, whose -D names the data folder under dir.
func processesUsing(dir string) []string {
	var found []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			found = append(found, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// A server that cannot start is an error quoting why, at once.
func TestServerThatFailsToStart(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, Config{Nodes: 8, Duration: time.Second, Registryd: bin, Pgbench: "", WorkDir: workDir(t),
		ServerEnv: []string{"REGISTRY_NODE_TTL=bogus"}})
	if err == nil || !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "REGISTRY_NODE_TTL") {
		t.Fatalf("Run = %v, want the server's exit and its message naming REGISTRY_NODE_TTL", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %s to notice", d)
	}

	_, err = Run(ctx, Config{Nodes: 8, Registryd: filepath.Join(t.TempDir(), "no-registryd"), WorkDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "start server") {
		t.Fatalf("Run with a missing binary = %v, want a start error", err)
	}
}

// A pgbench that is not there is an error before anything starts.
func TestPgbenchMissing(t *testing.T) {
	t.Parallel()
	_, err := Run(t.Context(), Config{Nodes: 8, Registryd: "registryd", Pgbench: filepath.Join(t.TempDir(), "pgbench")})
	if !errors.Is(err, ErrNoPgbench) {
		t.Fatalf("Run = %v, want ErrNoPgbench", err)
	}
}

// A workload whose requests fail, and a pgbench that fails, are reported
// as such: errors counted by kind with a sample, no rate made of
// failures, the run's error naming the workload, the table flagging both.
func TestFailuresAreReported(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	fake := filepath.Join(t.TempDir(), "pgbench")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'pgbench: boom: the script broke' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 80, Agents: 2, Duration: time.Second, Clients: 2, Workloads: []string{Retrieve}, Client: "go",
		Registryd: bin, Pgbench: fake, WorkDir: workDir(t), Stdout: &stdout,
		// The harness mints 12 h tokens: a server capping them at 1 h
		// refuses every request with 401.
		ServerEnv: []string{"REGISTRY_TOKEN_MAX_TTL=1h"},
	})
	if !errors.Is(err, ErrWorkloadErrors) || !strings.Contains(err.Error(), Retrieve) {
		t.Fatalf("Run = %v, want ErrWorkloadErrors naming %s", err, Retrieve)
	}
	if rep == nil || len(rep.Results) != 1 {
		t.Fatalf("report %+v, want one result", rep)
	}
	r := rep.Results[0]
	if r.Errors == 0 || r.Ops != 0 || r.Rate != 0 {
		t.Errorf("errors %d, ops %d, rate %v: want only errors and no rate", r.Errors, r.Ops, r.Rate)
	}
	const kind = "HTTP 401 /v1/nodes/{pk}"
	if r.ErrorKinds[kind] != r.Errors || !strings.Contains(r.ErrorFirst[kind], "401") {
		t.Errorf("error kinds %v, samples %v: want all %s", r.ErrorKinds, r.ErrorFirst, kind)
	}
	if r.Pgbench == nil || !strings.Contains(r.Pgbench.Error, "boom") {
		t.Errorf("pgbench %+v, want its failure with its stderr", r.Pgbench)
	}
	out := stdout.String()
	for _, want := range []string{`"errors":`, `"error_kinds":{"HTTP 401 /v1/nodes/{pk}":`, "| **failed** |", "**retrieve: ", "no op succeeded", "pgbench failed**: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestParsePgbench(t *testing.T) {
	t.Parallel()
	const pg15 = `transaction type: retrieve.sql
scaling factor: 1
query mode: prepared
number of clients: 32
number of threads: 2
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 331201
number of failed transactions: 0 (0.000%)
latency average = 0.965 ms
initial connection time = 41.287 ms
tps = 33146.505163 (without initial connection time)
`
	p, err := parsePgbench(pg15)
	if err != nil || p.TPS != 33146.505163 || p.LatencyMS != 0.965 || p.Processed != 331201 || p.Failed != 0 {
		t.Errorf("parsePgbench = %+v, %v", p, err)
	}
	if _, err := parsePgbench("pgbench: error: connection refused\n"); err == nil {
		t.Error("no tps line: want an error")
	}
	if _, err := parsePgbench(strings.Replace(pg15, "processed: 331201", "processed: 0", 1)); err == nil {
		t.Error("no transactions: want an error")
	}
}

// pgbench's own failures: a nonzero exit, failed transactions, aborted
// clients, each an error with what pgbench said.
func TestRunPgbenchFailures(t *testing.T) {
	t.Parallel()
	summary := func(failed string) string {
		return "cat <<'EOF'\nnumber of transactions actually processed: 100\nnumber of failed transactions: " + failed +
			"\nlatency average = 1.0 ms\ntps = 100.0 (without initial connection time)\nEOF\n"
	}
	for name, tc := range map[string]struct {
		script string
		want   string
	}{
		"exit":    {"echo 'pgbench: error: could not connect' >&2; exit 1", "could not connect"},
		"failed":  {summary("7 (7.000%)"), "7 failed transactions"},
		"aborted": {summary("0 (0.000%)") + "echo 'client 3 aborted in command 2' >&2", "clients aborted"},
		"garbage": {"echo hello", "no tps line"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			bin := filepath.Join(dir, "pgbench")
			if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := runPgbench(t.Context(), bin, dir, "postgres:///x", "retrieve.sql", 2, time.Second, &fleet{minPK: 1, maxPK: 8})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("runPgbench = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestHoldingsCatchDoubleAssignment(t *testing.T) {
	t.Parallel()
	h := newHoldings()
	if err := h.take(1, []int64{5, 6}); err != nil {
		t.Fatal(err)
	}
	err := h.take(2, []int64{7, 6})
	if !errors.Is(err, errDoubleAssignment) || !strings.Contains(err.Error(), "node 6 given to job 2 while job 1 holds it") {
		t.Fatalf("take = %v, want a double assignment of node 6", err)
	}
	if k := errorKind(err); k != "double assignment" {
		t.Errorf("counted as %q", k)
	}
	if h.doubles.Load() != 1 {
		t.Errorf("doubles = %d", h.doubles.Load())
	}
	h.drop([]int64{5, 6})
	if err := h.take(2, []int64{7, 6}); err != nil {
		t.Errorf("after the release: %v", err)
	}
}

func TestCheckClaim(t *testing.T) {
	t.Parallel()
	job := int64(9)
	other := int64(10)
	ok := []claimedNode{{PK: 1, IP: "10.0.0.1", CurrentJob: &job}, {PK: 2, IP: "10.0.0.1", CurrentJob: &job}}
	if err := checkClaim(job, 2, true, ok); err != nil {
		t.Errorf("good claim: %v", err)
	}
	for name, nodes := range map[string][]claimedNode{
		"short":      ok[:1],
		"two hosts":  {ok[0], {PK: 3, IP: "10.0.0.2", CurrentJob: &job}},
		"other job":  {ok[0], {PK: 2, IP: "10.0.0.1", CurrentJob: &other}},
		"no job set": {ok[0], {PK: 2, IP: "10.0.0.1"}},
	} {
		if err := checkClaim(job, 2, true, nodes); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), 30)
}

func TestCopyIndex(t *testing.T) {
	t.Parallel()
	for def, want := range map[string]string{
		"CREATE UNIQUE INDEX nodes_pkey ON public.nodes USING btree (pk)":                                            "CREATE UNIQUE INDEX bench_nodes_pkey ON bench_nodes USING btree (pk)",
		"CREATE INDEX nodes_free_idx ON public.nodes USING btree (pk) WHERE ((current_job IS NULL) AND schedulable)": "CREATE INDEX bench_nodes_free_idx ON bench_nodes USING btree (pk) WHERE ((current_job IS NULL) AND schedulable)",
		"CREATE INDEX nodes_ip_idx ON nodes USING btree (ip)":                                                        "CREATE INDEX bench_nodes_ip_idx ON bench_nodes USING btree (ip)",
	} {
		if got := copyIndex(def); got != want {
			t.Errorf("copyIndex(%q) = %q, want %q", def, got, want)
		}
	}
}

// Against a running registryd given its URL, its database and an admin
// token (no secret): heartbeats are the admin acting as the node, and the
// report says so. A second run refuses the registry it already seeded.
func TestRunningServerWithAdminToken(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	work := workDir(t)
	secret := []byte("bench-test-secret-0123456789abcdef")
	srv, err := startServer(ctx, bin, work, secret, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	admin, err := auth.Signer{Secret: secret}.Sign("bench-admin", registry.RoleAdmin, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Nodes: 80, Agents: 4, Duration: time.Second, Clients: 2, Workloads: []string{Heartbeat, Retrieve},
		URL: srv.url, DatabaseURL: srv.dbURL, Token: admin, Pgbench: pgbenchOrSkip(t), WorkDir: workDir(t),
	}
	var stdout bytes.Buffer
	cfg.Stdout = &stdout
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, stdout.String())
	}
	if len(rep.Results) != 2 || rep.Results[0].Errors != 0 || rep.Results[0].Rate <= 0 || rep.Results[1].Rate <= 0 {
		t.Fatalf("results %+v", rep.Results)
	}
	if !strings.Contains(rep.Results[0].Path, "admin acting as the node") || !strings.Contains(stdout.String(), "no token secret") {
		t.Errorf("the report does not say heartbeats were an admin's:\n%s", stdout.String())
	}
	if rep.Results[0].ServerPeakRSS != 0 {
		t.Errorf("a peak RSS for a server the harness did not start")
	}
	if _, err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "holds 80 nodes already") {
		t.Errorf("second Run = %v, want a refusal of the seeded registry", err)
	}
}

// wrkOrSkip finds wrk; without it the test skips, except under CI, whose
// script installs it.
func wrkOrSkip(t *testing.T) string {
	t.Helper()
	p := FindWrk()
	if p == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set, so wrk must be installed")
		}
		t.Skip("wrk not installed")
	}
	return p
}

// The request-only workloads through the harness's own Go client, as when
// wrk is missing.
func TestGoClientWorkloads(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 400, Agents: 10, Duration: time.Second, Clients: 4, Client: "go",
		Workloads: []string{Heartbeat, Retrieve, FreePage}, Registryd: bin, Pgbench: pgbenchOrSkip(t), WorkDir: workDir(t),
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, r := range rep.Results {
		if r.Client != "go" || r.Ops == 0 || r.Errors != 0 {
			t.Errorf("%s: client %s, %d ops, %d errors", r.Workload, r.Client, r.Ops, r.Errors)
		}
	}
}

// wrk's runs count non-2xx answers as errors, apart from the rate, and
// what its script's done function prints is read back.
func TestRunWrkCountsErrors(t *testing.T) {
	t.Parallel()
	wrk := wrkOrSkip(t)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if n.Add(1)%4 == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("{}"))
	}))
	defer srv.Close()
	tg := &target{url: srv.URL, fleet: &fleet{minPK: 1, maxPK: 100, scheduler: "tok"}}
	script, ok := tg.wrkScript(Retrieve)
	if !ok {
		t.Fatal("retrieve has no wrk script")
	}
	l, err := runWrk(t.Context(), wrk, t.TempDir(), Retrieve, script, srv.URL, 4, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	served := n.Load()
	if l.Ops == 0 || l.Errors == 0 || l.ErrorKinds["HTTP non-2xx (wrk)"] != l.Errors {
		t.Fatalf("ops %d, errors %d %v: want both, the errors as non-2xx", l.Ops, l.Errors, l.ErrorKinds)
	}
	if got := l.Ops + l.Errors; got < served-8 || got > served {
		t.Errorf("ops + errors = %d, the server answered %d", got, served)
	}
	if l.Rate <= 0 || l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P99 {
		t.Errorf("rate %v, p50 %v, p99 %v, max %v", l.Rate, l.P50, l.P99, l.Max)
	}
	if _, err := parseWrk([]byte("Running 1s test\nno marker here\n")); err == nil {
		t.Error("output without the marker line parsed")
	}
}

// pgbench's per-transaction logs (one per thread) give its percentiles,
// and are removed once read.
func TestPgbenchPercentiles(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "pgbench-log-x")
	var a, b strings.Builder
	for i := range 100 { // latencies 1..100 ms over two threads' files
		w := &a
		if i%2 == 1 {
			w = &b
		}
		fmt.Fprintf(w, "%d %d %d 0 1764640000 %d\n", i%4, i, (i+1)*1000, i)
	}
	a.WriteString("3 7 skipped 0 1764640000 0\n")
	for name, text := range map[string]string{prefix + ".123": a.String(), prefix + ".123.1": b.String()} {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p50, p99 := pgbenchPercentiles(prefix); p50 != 51 || p99 != 100 {
		t.Errorf("p50 %v p99 %v, want 51 and 100", p50, p99)
	}
	if left, _ := filepath.Glob(prefix + ".*"); len(left) != 0 {
		t.Errorf("logs left behind: %v", left)
	}
	if p50, p99 := pgbenchPercentiles(prefix); p50 != 0 || p99 != 0 {
		t.Errorf("no logs: %v %v, want zeros", p50, p99)
	}
}

// A fleet seeded through the API is the fleet seed describes: the same
// addresses, agents that own their hosts' nodes and have pinged them, 1 in 8
// hosts wholly claimed and 1 in 8 with 3 claimed, each by its own job.
func TestSeedThroughAPI(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	secret := []byte("bench-test-secret-0123456789abcdef")
	srv, err := startServer(ctx, bin, workDir(t), secret, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	pool, err := pgxpool.New(ctx, srv.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := seedAPI(ctx, srv.url, pool, nil, 16, 1); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Errorf("seed through the API without a secret = %v, want a refusal", err)
	}
	f, err := seedAPI(ctx, srv.url, pool, secret, 164, 3) // 21 hosts, the last with 4 nodes
	if err != nil {
		t.Fatal(err)
	}
	if f.nodes != 164 || f.hosts != 21 || f.maxPK-f.minPK != 163 || len(f.agents) != 3 {
		t.Fatalf("fleet %+v", f)
	}
	if a := f.agents[2]; a.sub != "bench-agent-2" || a.ip != "10.0.0.3" || len(a.nodes) != 8 {
		t.Errorf("agent %+v, want bench-agent-2 on 10.0.0.3 with 8 nodes", a)
	}
	var wholly, three, jobs, alive, ips int64
	err = pool.QueryRow(ctx, `
		WITH h AS (SELECT ip, count(current_job) AS held, count(DISTINCT current_job) AS jobs FROM nodes GROUP BY ip)
		SELECT (SELECT count(*) FROM h WHERE held = 8), (SELECT count(*) FROM h WHERE held = 3),
			(SELECT coalesce(sum(jobs), 0) FROM h),
			(SELECT count(*) FROM node_liveness l JOIN nodes n ON n.pk = l.node_pk WHERE n.owner LIKE 'bench-agent-%'),
			(SELECT count(DISTINCT ip) FROM nodes)`).Scan(&wholly, &three, &jobs, &alive, &ips)
	if err != nil {
		t.Fatal(err)
	}
	// Hosts 7 and 15 wholly, 5, 13 (and 21 would be, but there are 21
	// hosts: 0..20) with three.
	if wholly != 2 || three != 2 || jobs != 4 || alive != 24 || ips != 21 {
		t.Errorf("hosts wholly held %d (want 2), with 3 held %d (want 2), jobs %d (want 4), agent nodes with liveness %d (want 24), addresses %d (want 21)",
			wholly, three, jobs, alive, ips)
	}
	if _, err := seedAPI(ctx, srv.url, pool, secret, 8, 1); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("a second seed = %v, want a refusal of the seeded registry", err)
	}
}

// A pgbench run that processed nothing (its clients took the whole of a
// short run to connect, on a loaded machine) is run once more, longer,
// before it counts as failed.
func TestRunPgbenchRetriesAnEmptyRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "pgbench")
	// The first run processes nothing; the second (-T 3) does.
	script := `#!/bin/sh
case "$*" in
*"-T 3 "*) printf 'number of transactions actually processed: 50\nnumber of failed transactions: 0 (0.000%%)\nlatency average = 2.0 ms\ntps = 25.0 (without initial connection time)\n' ;;
*) printf 'number of transactions actually processed: 0\nnumber of failed transactions: 0 (NaN%%)\n' ;;
esac
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := runPgbench(t.Context(), bin, dir, "postgres:///x", "retrieve.sql", 2, time.Second, &fleet{minPK: 1, maxPK: 8})
	if err != nil || p.Processed != 50 || p.TPS != 25 {
		t.Fatalf("runPgbench = %+v, %v; want the second run's 50 transactions", p, err)
	}
}

// The sync seed imports the fleet through registryd sync --once from the
// fake SCP: every host's 8 nodes, in fabrics of hostsPerFabric, with the
// import's labels, at the SQL seed's addresses; a registry that holds
// nodes is refused. waitSettled waits for a vacuum and an analyze of the
// nodes table after a point in time, and no longer than it is told.
func TestSeedThroughSync(t *testing.T) {
	t.Parallel()
	bin := registrydBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	work := workDir(t)
	srv, err := startServer(ctx, bin, work, []byte("bench-test-secret-0123456789abcdef"), 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	pool, err := pgxpool.New(ctx, srv.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, _, err := seedSync(ctx, "", srv.dbURL, pool, 8, work); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Errorf("seed sync without a binary = %v, want a refusal", err)
	}
	f, took, err := seedSync(ctx, bin, srv.dbURL, pool, 4004, work) // 501 hosts: two fabrics
	if err != nil {
		t.Fatal(err)
	}
	if f.nodes != 4008 || f.count != 4008 || f.maxPK-f.minPK != 4007 || len(f.agents) != 0 || took <= 0 {
		t.Fatalf("fleet %+v, pass %s", f, took)
	}
	var hosts, fabrics, firstFabric, labelled, h100, free int64
	var lastIP string
	err = pool.QueryRow(ctx, `
		SELECT count(DISTINCT ip), count(DISTINCT fabric),
			(SELECT count(DISTINCT ip) FROM nodes WHERE fabric = (SELECT fabric FROM nodes ORDER BY ip LIMIT 1)),
			count(*) FILTER (WHERE labels ? 'scp.registryd.io/region'),
			count(*) FILTER (WHERE gpu_mem = 80 * 1024^3),
			count(*) FILTER (WHERE current_job IS NULL),
			host(max(ip))
		FROM nodes`).Scan(&hosts, &fabrics, &firstFabric, &labelled, &h100, &free, &lastIP)
	if err != nil {
		t.Fatal(err)
	}
	// Host 500 is 10.0.2.1: (500/250)*256 + 500%250 + 1 = 513.
	if hosts != 501 || fabrics != 2 || firstFabric != hostsPerFabric || labelled != 4008 || h100 != 4008 || free != 4008 || lastIP != "10.0.2.1" {
		t.Errorf("hosts %d (want 501), fabrics %d (2), hosts in the first %d (%d), labelled %d, 80 GiB %d, free %d (all 4008), last address %s (10.0.2.1)",
			hosts, fabrics, firstFabric, hostsPerFabric, labelled, h100, free, lastIP)
	}
	if _, _, err := seedSync(ctx, bin, srv.dbURL, pool, 8, work); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("a second seed = %v, want a refusal of the seeded registry", err)
	}

	since := time.Now()
	if _, err := waitSettled(ctx, pool, since, 3*time.Second); err == nil || !strings.Contains(err.Error(), "not vacuumed") {
		t.Errorf("waitSettled with nothing vacuumed since = %v, want it to give up", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE nodes`); err != nil {
		t.Fatal(err)
	}
	if waited, err := waitSettled(ctx, pool, since, time.Minute); err != nil || waited > 5*time.Second {
		t.Errorf("waitSettled after VACUUM ANALYZE: %v after %s", err, waited)
	}
}
