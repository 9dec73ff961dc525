package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The request-only workloads (heartbeat, retrieve, free page) are driven by
// wrk when it is installed: a C event loop that takes a small share of the
// cores the server, PostgreSQL and the load generator share. Measured on
// the 2-core machine of docs/benchmarks.md, the same server answered
// retrieves about twice as fast under wrk as under the harness's own Go
// client, which was the limit. Claims, releases and lists stay with the Go
// client: they check what comes back.

// FindWrk returns the wrk binary on PATH, or "".
func FindWrk() string {
	p, err := exec.LookPath("wrk")
	if err != nil {
		return ""
	}
	return p
}

// wrkMarker starts the line the script's done function prints.
const wrkMarker = "BENCH-WRK"

// wrkScript is the Lua script for workload name: a request function that
// draws what the Go op draws, and a done function that prints the counts
// and latencies (µs) on one line. false: the workload is not a wrk one.
func (t *target) wrkScript(name string) (string, bool) {
	f := t.fleet
	var b strings.Builder
	b.WriteString("math.randomseed(os.time())\n")
	switch name {
	case Heartbeat:
		b.WriteString("local agents = {\n")
		for _, a := range f.agents {
			fmt.Fprintf(&b, "  {%q, {", "Bearer "+a.token)
			for i, pk := range a.nodes {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(strconv.FormatInt(pk, 10))
			}
			b.WriteString("}},\n")
		}
		b.WriteString(`}
request = function()
  local a = agents[math.random(#agents)]
  local pk = a[2][math.random(#a[2])]
  return wrk.format("GET", "/v1/nodes/ping", {["Authorization"] = a[1], ["Node-Id"] = tostring(pk), ["Cache-Control"] = "max-stale"})
end
`)
	case Retrieve:
		fmt.Fprintf(&b, `local auth = %q
request = function()
  return wrk.format("GET", "/v1/nodes/" .. math.random(%d, %d), {["Authorization"] = auth})
end
`, "Bearer "+f.scheduler, f.minPK, f.maxPK)
	case FreePage:
		fmt.Fprintf(&b, `local auth = %q
request = function()
  local body = '{"free":true,"min_gpu_mem":%d,"after":' .. math.random(0, %d) .. ',"limit":100}'
  return wrk.format("POST", "/v1/nodes/list", {["Authorization"] = auth, ["Content-Type"] = "application/json"}, body)
end
`, "Bearer "+f.scheduler, minGPUMem, f.maxPK-1)
	default:
		return "", false
	}
	fmt.Fprintf(&b, `done = function(s, latency, requests)
  local e = s.errors
  io.write(string.format("%s %%d %%d %%d %%d %%d %%d %%d %%d %%d %%d\n", s.requests, s.duration,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.connect, e.read, e.write, e.timeout))
end
`, wrkMarker)
	return b.String(), true
}

// runWrk runs wrk with script against url: clients connections over two
// threads, a warm-up run first (connections opened, statements
// prepared), then the measured run.
func runWrk(ctx context.Context, bin, dir, name, script, url string, clients int, warmup, d time.Duration) (Load, error) {
	path := filepath.Join(dir, "wrk-"+name+".lua")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		return Load{}, err
	}
	threads := min(2, clients)
	run := func(d time.Duration) (Load, error) {
		secs := max(1, int(d.Round(time.Second)/time.Second))
		cmd := exec.CommandContext(ctx, bin, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(clients),
			"-d", strconv.Itoa(secs)+"s", "--timeout", strconv.Itoa(int(requestTimeout/time.Second))+"s", "-s", path, url)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return Load{}, fmt.Errorf("bench: wrk: %w: %s", err, strings.TrimSpace(errb.String()))
		}
		return parseWrk(out.Bytes())
	}
	if warmup > 0 {
		if _, err := run(warmup); err != nil {
			return Load{}, err
		}
	}
	return run(d)
}

// parseWrk reads the done function's line: every request wrk sent, the
// run's duration (µs), p50, p99 and max latency (µs), non-2xx answers and
// socket errors (connect, read, write, timeout).
func parseWrk(out []byte) (Load, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 11 || fields[0] != wrkMarker {
			continue
		}
		var v [10]int64
		for i, f := range fields[1:] {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return Load{}, fmt.Errorf("bench: wrk printed %q: %w", sc.Text(), err)
			}
			v[i] = n
		}
		requests, elapsed := v[0], time.Duration(v[1])*time.Microsecond
		status, socket := v[5], v[6]+v[7]+v[8]+v[9]
		l := Load{Elapsed: elapsed, P50: time.Duration(v[2]) * time.Microsecond, P99: time.Duration(v[3]) * time.Microsecond,
			Max: time.Duration(v[4]) * time.Microsecond, ErrorKinds: map[string]int64{}, ErrorSamples: map[string]string{}}
		l.Ops = max(0, requests-status)
		if status > 0 {
			l.ErrorKinds["HTTP non-2xx (wrk)"] = status
			l.ErrorSamples["HTTP non-2xx (wrk)"] = fmt.Sprintf("%d answers were not 2xx or 3xx", status)
		}
		if socket > 0 {
			l.ErrorKinds["socket errors (wrk)"] = socket
			l.ErrorSamples["socket errors (wrk)"] = fmt.Sprintf("connect %d, read %d, write %d, timeout %d", v[6], v[7], v[8], v[9])
		}
		l.Errors = status + socket
		if elapsed > 0 {
			l.Rate = float64(l.Ops) / elapsed.Seconds()
		}
		if l.Ops == 0 {
			l.P50, l.P99, l.Max = 0, 0, 0
		}
		return l, nil
	}
	return Load{}, fmt.Errorf("bench: wrk printed no %s line:\n%s", wrkMarker, out)
}
