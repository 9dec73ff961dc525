// Command amplification measures what bodies built to be expensive cost a
// registryd: it fires rounds of concurrent 1 MiB requests (~90,000 unknown
// keys to POST /v1/nodes/list, the shape of issue 8's finding 2; one long
// string; an array of ~500,000 node pks to POST /v1/nodes/release) and
// reports the answers' sizes and the server's peak RSS
// (VmHWM from /proc/PID/status, reset through /proc/PID/clear_refs once
// the server is idle).
//
// It starts the registryd binary given by -bin on a throwaway PostgreSQL
// (or the one -db names), a fresh server for every row of the table, and
// stops them at the end:
//
//	go build -o /tmp/registryd ./cmd/registryd
//	go run ./scripts/amplification -bin /tmp/registryd
//
// Linux only (it reads /proc). Not a test: numbers depend on the machine.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/pglocal"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "amplification:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "", "the registryd binary to measure (required)")
	db := flag.String("db", "", "a PostgreSQL URL to use (its database is migrated); default: a throwaway local cluster")
	concurrency := flag.String("n", "16,40", "comma-separated numbers of concurrent requests per burst")
	rounds := flag.Int("rounds", 3, "bursts per concurrency")
	kinds := flag.String("body", "unknown-keys,long-string,int-array", "comma-separated body kinds: unknown-keys, long-string (both to nodes/list), int-array (to nodes/release)")
	flag.Parse()
	if *bin == "" {
		return errors.New("-bin is required")
	}
	ns, err := parseInts(*concurrency)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	dbURL := *db
	if dbURL == "" {
		stop, url, err := startPostgres(ctx)
		if err != nil {
			return err
		}
		defer stop()
		dbURL = url
	}
	fmt.Println("| body | concurrent | rounds | status | answer bytes (each) | idle RSS | peak RSS (VmHWM) | time per burst |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, kind := range strings.Split(*kinds, ",") {
		body, err := makeBody(kind)
		if err != nil {
			return err
		}
		for _, n := range ns {
			// A fresh process per row: a Go heap that grew in one burst is
			// not given back at once and would count in the next row.
			if err := measure(ctx, *bin, dbURL, kind, body, n, *rounds); err != nil {
				return err
			}
		}
	}
	return nil
}

func measure(ctx context.Context, bin, dbURL, kind string, body []byte, n, rounds int) error {
	srv, err := startServer(ctx, bin, dbURL)
	if err != nil {
		return err
	}
	defer srv.stop()
	idle := srv.status("VmRSS")
	if err := srv.resetPeak(); err != nil {
		return err
	}
	var statuses, sizes []int
	var took time.Duration
	for range rounds {
		st, sz, d, err := burst(ctx, srv, paths[kind], body, n)
		if err != nil {
			return err
		}
		statuses, sizes, took = append(statuses, st...), append(sizes, sz...), took+d
	}
	fmt.Printf("| %s (%d bytes) | %d | %d | %s | %s | %s | %s | %s |\n", kind, len(body), n, rounds,
		summarize(statuses), summarize(sizes), idle, srv.status("VmHWM"), (took / time.Duration(rounds)).Round(time.Millisecond))
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// paths maps a body kind to the endpoint it is sent to.
var paths = map[string]string{"unknown-keys": "/v1/nodes/list", "long-string": "/v1/nodes/list", "int-array": "/v1/nodes/release"}

// makeBody builds a body of just under 1 MiB (the server's limit).
func makeBody(kind string) ([]byte, error) {
	const limit = 1 << 20
	var b bytes.Buffer
	switch kind {
	case "unknown-keys":
		b.WriteByte('{')
		for i := 0; ; i++ {
			item := fmt.Sprintf(`"k%07d":0`, i)
			if b.Len()+len(item)+2 > limit {
				break
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(item)
		}
		b.WriteByte('}')
	case "long-string":
		b.WriteString(`{"ip":"`)
		b.WriteString(strings.Repeat("a", limit-b.Len()-2))
		b.WriteString(`"}`)
	case "int-array":
		b.WriteString(`{"job":1,"nodes":[1`)
		b.WriteString(strings.Repeat(",1", (limit-b.Len()-2)/2))
		b.WriteString(`]}`)
	default:
		return nil, fmt.Errorf("unknown body kind %q", kind)
	}
	return b.Bytes(), nil
}

// burst sends n requests at once and waits for every answer.
func burst(ctx context.Context, srv *server, path string, body []byte, n int) (statuses, sizes []int, took time.Duration, err error) {
	statuses, sizes = make([]int, n), make([]int, n)
	errs := make([]error, n)
	var start sync.WaitGroup
	start.Add(1)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			start.Wait()
			req, err := http.NewRequestWithContext(ctx, "POST", srv.url+path, bytes.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+srv.token)
			resp, err := srv.client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			got, err := io.Copy(io.Discard, resp.Body)
			statuses[i], sizes[i], errs[i] = resp.StatusCode, int(got), err
		})
	}
	start.Done()
	wg.Wait()
	return statuses, sizes, time.Since(t0), errors.Join(errs...)
}

// summarize prints the distinct values of xs.
func summarize(xs []int) string {
	u := slices.Compact(slices.Sorted(slices.Values(xs)))
	parts := make([]string, len(u))
	for i, x := range u {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ", ")
}

// startPostgres starts a throwaway cluster under the system temp dir, which
// the postgres system user can enter when we run as root.
func startPostgres(ctx context.Context) (stop func(), url string, err error) {
	dir, err := os.MkdirTemp("", "registryd-amplification-")
	if err != nil {
		return nil, "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	c, err := pglocal.Start(ctx, pglocal.Options{DataDir: filepath.Join(dir, "data"), Database: "registry", Ephemeral: true})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("start PostgreSQL (or pass -db): %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
		os.RemoveAll(dir)
	}, c.URL(), nil
}

type server struct {
	cmd    *exec.Cmd
	pid    int
	url    string
	token  string
	client *http.Client
}

// startServer runs bin serve on a free port and waits until it is ready.
func startServer(ctx context.Context, bin, dbURL string) (*server, error) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	env := append(os.Environ(),
		"REGISTRY_DATABASE_URL="+dbURL,
		"REGISTRY_JWT_SECRET="+hex.EncodeToString(secret),
		"REGISTRY_LISTEN="+addr,
		"REGISTRY_MIGRATE=true",
		"REGISTRY_LOG_LEVEL=warn",
	)
	tok := exec.CommandContext(ctx, bin, "token", "--sub", "amplification", "--role", "scheduler")
	tok.Env = env
	out, err := tok.Output() // a scheduler: it may list and release
	if err != nil {
		return nil, fmt.Errorf("registryd token: %w", err)
	}
	// The token is the last line.
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	token := lines[len(lines)-1]

	cmd := exec.Command(bin, "serve")
	cmd.Env = env
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, pid: cmd.Process.Pid, url: "http://" + addr, token: token,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("registryd did not become ready within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// status reads one field of /proc/PID/status, e.g. "VmHWM".
func (s *server) status(field string) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return strings.TrimSpace(v)
			}
			return fmt.Sprintf("%d MB", kb/1024)
		}
	}
	return "?"
}

// resetPeak sets VmHWM back to the current RSS (Linux: clear_refs 5).
func (s *server) resetPeak() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.pid), []byte("5"), 0)
}
