package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
)

// maxHostileRSS is the most memory the real binary may hold at its peak
// while hostile providers flood it (issue 25).
const maxHostileRSS = 300 << 20

// Hostile providers, as in issue 25's report: an SCP whose count is
// 1,000,000 and whose pages hold 100 nodes named by 600 KiB each, an E2E
// whose list never ends with 50 clusters a page named by 1.2 MB each; and
// the same with names short enough for a page to stay within the most one
// answer may be, so that only the pass's read budget ends it. The real
// binary, `sync --once` and `serve`, stays under maxHostileRSS at its
// peak, every pass fails and nothing changes.
func TestHostileProvidersMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds registryd and reads 512 MiB from the fakes a pass")
	}
	bin := buildRegistryd(t, moduleRoot(t))
	scp, e2e := fakeSCP(t), e2etest.New(t)
	e2e.Clusters = []e2etest.Cluster{{ID: 1, Name: "c", Status: "Running", CPU: 8, GPU: 0, MemoryGB: 32,
		Workers: []e2etest.Worker{{ID: 1, Name: "w", PrivateIP: "10.31.0.1", Status: "Running"}}}}
	env := syncEnv(t, scp, e2e)
	if out, _, err := runCmd(t, env, "sync", "--once"); err != nil {
		t.Fatalf("the first pass, from honest providers: %v\n%s", err, out)
	}
	before := nodeRows(t, env["REGISTRY_DATABASE_URL"])
	flood := func(scpName, e2eName int) {
		scp.Lock()
		scp.FloodNameBytes = scpName
		scp.Unlock()
		e2e.Lock()
		e2e.FloodNameBytes = e2eName
		e2e.Unlock()
	}
	for _, tc := range []struct {
		name             string
		scpName, e2eName int
		why              string
	}{
		{"as reported", 600 << 10, 1200 << 10, "the most one answer may be"},
		{"within an answer", 150 << 10, 300 << 10, "its budget"},
	} {
		t.Run("sync --once "+tc.name, func(t *testing.T) {
			flood(tc.scpName, tc.e2eName)
			out, _, peak, err := runMeasured(t, bin, env, 50*time.Second, nil, "sync", "--once")
			t.Logf("sync --once, hostile providers %s: peak RSS %.1f MiB\n%s", tc.name, float64(peak)/(1<<20), out)
			if err == nil {
				t.Errorf("sync --once succeeded:\n%s", out)
			}
			for _, want := range []string{"scp: FAILED, nothing changed", "e2e: FAILED, nothing changed"} {
				if !strings.Contains(out, want) {
					t.Errorf("the summary lacks %q:\n%s", want, out)
				}
			}
			if strings.Count(out, tc.why) != 2 {
				t.Errorf("the passes did not both fail for %q:\n%s", tc.why, out)
			}
			if peak > maxHostileRSS {
				t.Errorf("peak RSS %d MiB, over %d MiB", peak>>20, maxHostileRSS>>20)
			}
		})
	}
	t.Run("serve", func(t *testing.T) {
		flood(150<<10, 300<<10)
		senv := map[string]string{"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_SYNC_INTERVAL": "1s", "REGISTRY_LOG_FORMAT": "text"}
		for k, v := range env {
			senv[k] = v
		}
		// A failed pass of each provider, as its loop runs them.
		done := func(log string) bool {
			return strings.Count(log, "sync failed") >= 2
		}
		_, log, peak, err := runMeasured(t, bin, senv, 50*time.Second, done, "serve")
		t.Logf("serve, hostile providers within an answer: peak RSS %.1f MiB", float64(peak)/(1<<20))
		if err != nil {
			t.Errorf("serve: %v\n%s", err, tail(log, 3000))
		}
		if !done(log) {
			t.Errorf("serve did not fail a pass of each provider:\n%s", tail(log, 3000))
		}
		if peak > maxHostileRSS {
			t.Errorf("peak RSS %d MiB, over %d MiB", peak>>20, maxHostileRSS>>20)
		}
	})
	if diff := cmp.Diff(before, nodeRows(t, env["REGISTRY_DATABASE_URL"])); diff != "" {
		t.Errorf("a pass from hostile providers changed nodes (-before +after):\n%s", diff)
	}
}

// runMeasured runs bin with args and env, and returns its output, its
// peak resident memory (the kernel's VmHWM, sampled while it runs, and
// its rusage at exit) and how it ended. With until set, the process is
// stopped with SIGTERM as soon as until holds for its stderr; else it
// must exit of itself. Either way it is killed after limit.
func runMeasured(t *testing.T, bin string, env map[string]string, limit time.Duration,
	until func(stderr string) bool, args ...string) (stdout, stderr string, peak int64, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb apitest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	stopping := false
	for {
		select {
		case err = <-exited:
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				peak = max(peak, ru.Maxrss<<10) // KiB on Linux
			}
			if ctx.Err() != nil {
				err = fmt.Errorf("still running after %s: %w", limit, err)
			} else if stopping && err != nil && cmd.ProcessState.ExitCode() == 0 {
				err = nil
			}
			return out.String(), errb.String(), peak, err
		case <-tick.C:
			peak = max(peak, highWaterMark(cmd.Process.Pid))
			if until != nil && !stopping && until(errb.String()) {
				stopping = true
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
		}
	}
}

// highWaterMark is VmHWM of process pid in bytes: the most resident
// memory it has had. 0 when it cannot be read (the process is gone).
func highWaterMark(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib << 10
		}
	}
	return 0
}

// nodeRows is every node, as its row's JSON, in pk order.
func nodeRows(t *testing.T, db string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT to_jsonb(n)::text FROM nodes n ORDER BY pk`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("no nodes")
	}
	return got
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
