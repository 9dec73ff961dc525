package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd/client"
)

// fakeRegistry answers every list with no nodes and records the
// Authorization header of each request it gets.
type fakeRegistry struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newFakeRegistry(t *testing.T, tlsServer bool) *fakeRegistry {
	t.Helper()
	f := &fakeRegistry{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Event-Id", "0")
		_, _ = w.Write([]byte("[]\n"))
	})
	if tlsServer {
		f.Server = httptest.NewTLSServer(h)
	} else {
		f.Server = httptest.NewServer(h)
	}
	t.Cleanup(f.Close)
	return f
}

// seen is the Authorization headers received so far.
func (f *fakeRegistry) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.auths...)
}

// writeTestFile writes text to a new file under dir and returns its path.
func writeTestFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A server that accepts and never answers does not hang the CLI: each
// request gives up after REGISTRY_REQUEST_TIMEOUT, and the command fails
// (exit 1) saying so.
func TestNodesCLIRequestTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	env := map[string]string{"REGISTRY_SERVER": "http://" + ln.Addr().String(), "REGISTRY_TOKEN": "x.y.z",
		"REGISTRY_CONFIG": filepath.Join(t.TempDir(), "none.yaml"), "REGISTRY_REQUEST_TIMEOUT": "200ms"}
	for _, args := range [][]string{{"nodes", "list"}, {"nodes", "list", "--watch"}, {"hardware", "list"}} {
		start := time.Now()
		r := cli(t, env, args...)
		took := time.Since(start)
		if r.code != 1 || !strings.Contains(r.stderr, "no answer from "+ln.Addr().String()+" within 200ms") {
			t.Errorf("%q against a server that never answers: exit %d, stderr %q; want 1 and the timeout named", args, r.code, r.stderr)
		}
		// Retries of a read multiply the bound by the client's attempts
		// (4) and its backoff; far below the minute cli allows.
		if took > 15*time.Second {
			t.Errorf("%q took %s", args, took)
		}
	}
	env["REGISTRY_REQUEST_TIMEOUT"] = "soon"
	if r := cli(t, env, "nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "REGISTRY_REQUEST_TIMEOUT") {
		t.Errorf("a bad REGISTRY_REQUEST_TIMEOUT: %+v", r)
	}
}

// headerTimeout is the error http.Transport gives when its
// ResponseHeaderTimeout passes.
type headerTimeout struct{}

func (headerTimeout) Error() string   { return "timeout awaiting response headers" }
func (headerTimeout) Timeout() bool   { return true }
func (headerTimeout) Temporary() bool { return true }

// The transport's header timeout and the request deadline have the same
// length; when the header timeout fires first (the request's context still
// live) the error still names REGISTRY_REQUEST_TIMEOUT. A caller's own
// cancellation is not called a timeout.
func TestTimeoutTransportNamesEitherTimeout(t *testing.T) {
	t.Parallel()
	d := &timeoutTransport{timeout: time.Hour, next: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, headerTimeout{}
	})}
	req := httptest.NewRequest(http.MethodPost, "http://registry.test/v1/hardware/list", nil)
	if _, err := d.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "within 1h0m0s (REGISTRY_REQUEST_TIMEOUT)") {
		t.Errorf("header timeout before the deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.RoundTrip(req.WithContext(ctx)); err == nil || strings.Contains(err.Error(), "REGISTRY_REQUEST_TIMEOUT") {
		t.Errorf("the caller's own cancellation: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A dangling current_context does not stand in the way of a registry the
// environment names fully; without that it is a context not found (4).
func TestNodesCLIDanglingContext(t *testing.T) {
	t.Parallel()
	reg := newFakeRegistry(t, false)
	cfg := writeTestFile(t, t.TempDir(), "config.yaml", "current_context: gone\n")
	env := map[string]string{"REGISTRY_CONFIG": cfg, "REGISTRY_SERVER": reg.URL, "REGISTRY_TOKEN": "env.token.x"}
	if r := cli(t, env, "nodes", "list", "-o", "name"); r.code != 0 {
		t.Errorf("env-configured list with a dangling current_context: %+v", r)
	}
	delete(env, "REGISTRY_TOKEN")
	if r := cli(t, env, "nodes", "list"); r.code != exitNotFound || !strings.Contains(r.stderr, `"gone"`) {
		t.Errorf("a dangling current_context without the environment's token: %+v; want exit 4", r)
	}
}

// A password in REGISTRY_SERVER is never echoed.
func TestNodesCLIServerPasswordRedacted(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_CONFIG": filepath.Join(t.TempDir(), "none.yaml"),
		"REGISTRY_SERVER": "https://admin:hunter2secret@registry.example.com", "REGISTRY_TOKEN": "x.y.z"}
	r := cli(t, env, "nodes", "list")
	if r.code != 1 || strings.Contains(r.stderr, "hunter2secret") || !strings.Contains(r.stderr, "admin:xxxxx@registry.example.com") {
		t.Errorf("a server URL with a password: exit %d, stderr %q; want 1, the URL redacted", r.code, r.stderr)
	}
}

// The CLI sends no token over plain http to another host unless told to,
// sends no context's token to a server REGISTRY_SERVER swapped in, and
// takes a CA from REGISTRY_CA_FILE.
func TestNodesCLITokenSafety(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{"REGISTRY_CONFIG": filepath.Join(dir, "none.yaml"),
		"REGISTRY_SERVER": "http://192.0.2.1:8080", "REGISTRY_TOKEN": "x.y.z", "REGISTRY_REQUEST_TIMEOUT": "100ms"}
	if r := cli(t, env, "nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "plain http") || !strings.Contains(r.stderr, "REGISTRY_INSECURE_HTTP") {
		t.Errorf("plain http to another host: %+v; want a refusal naming REGISTRY_INSECURE_HTTP", r)
	}
	// Told to, it sends: the request goes out and finds nobody there
	// (192.0.2.1 is a documentation address), within the timeout or at
	// once when this machine has no route.
	env["REGISTRY_INSECURE_HTTP"] = "true"
	if r := cli(t, env, "nodes", "list"); r.code != 1 || strings.Contains(r.stderr, "plain http") ||
		!(strings.Contains(r.stderr, "no answer from 192.0.2.1:8080 within 100ms") || strings.Contains(r.stderr, "dial tcp 192.0.2.1:8080")) {
		t.Errorf("plain http with REGISTRY_INSECURE_HTTP=true: %+v; want the request sent (no answer, or no route)", r)
	}

	// The prod context's token must not go to the server REGISTRY_SERVER names.
	prod := newFakeRegistry(t, false)
	staging := newFakeRegistry(t, false)
	cfg := writeTestFile(t, dir, "config.yaml", "current_context: prod\ncontexts:\n  - name: prod\n    server: "+prod.URL+"\n    token: \"prod.token.x\\n\"\n")
	env = map[string]string{"REGISTRY_CONFIG": cfg, "REGISTRY_SERVER": staging.URL}
	if r := cli(t, env, "nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "REGISTRY_TOKEN") {
		t.Errorf("another server without a token of its own: %+v; want a refusal", r)
	}
	if got := staging.seen(); len(got) != 0 {
		t.Errorf("staging was sent %q", got)
	}
	env["REGISTRY_TOKEN"] = "staging.token.x"
	if r := cli(t, env, "nodes", "list"); r.code != 0 {
		t.Errorf("another server with its own token: %+v", r)
	}
	if got := staging.seen(); len(got) != 1 || got[0] != "Bearer staging.token.x" {
		t.Errorf("staging got %q; want its own token only", got)
	}
	// The same server as the context's: the context's token, trimmed of
	// the newline the file holds.
	env = map[string]string{"REGISTRY_CONFIG": cfg}
	if r := cli(t, env, "nodes", "list"); r.code != 0 {
		t.Errorf("the prod context: %+v", r)
	}
	if got := prod.seen(); len(got) != 1 || got[0] != "Bearer prod.token.x" {
		t.Errorf("prod got %q; want its token, trimmed", got)
	}

	// Env only, over https with a private CA.
	secure := newFakeRegistry(t, true)
	ca := writeTestFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw})))
	env = map[string]string{"REGISTRY_CONFIG": filepath.Join(dir, "none.yaml"), "REGISTRY_SERVER": secure.URL, "REGISTRY_TOKEN": "x.y.z"}
	if r := cli(t, env, "nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Errorf("https to a private CA's server without the CA: %+v", r)
	}
	env["REGISTRY_CA_FILE"] = ca
	if r := cli(t, env, "nodes", "list"); r.code != 0 {
		t.Errorf("https with REGISTRY_CA_FILE: %+v", r)
	}
}

// A misspelt setting is named, with the one it is likely a typo of.
func TestNodesCLIUnknownSetting(t *testing.T) {
	t.Parallel()
	reg := newFakeRegistry(t, false)
	typo := "REGISTRY_" + "REQUST_TIMEOUT" // spelt apart: the settings test reads sources
	env := map[string]string{"REGISTRY_CONFIG": filepath.Join(t.TempDir(), "none.yaml"),
		"REGISTRY_SERVER": reg.URL, "REGISTRY_TOKEN": "x.y.z", typo: "1s"}
	if r := cli(t, env, "nodes", "list"); r.code != 0 || !strings.Contains(r.stderr, typo+" is not a setting registryd reads; it is ignored; did you mean REGISTRY_REQUEST_TIMEOUT?") {
		t.Errorf("a misspelt setting: %+v", r)
	}
}

// A watch shows a node leaving its --selector (its labels changed
// elsewhere): the node's row once more, as it now is. The filters mean
// what the server's mean: --ip takes an IPv4-mapped prefix.
func TestNodesCLIWatchLeavesSelector(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	ctx := context.Background()
	p := startProcess(t, f.env(t), "nodes", "list", "--watch", "--selector", "team=research", "--ip", "::ffff:10.0.0.0/120")
	waitFor(t, "the first table", func() bool { return strings.Count(p.stdout.String(), "\n") >= 5 })
	if _, err := f.api.PatchNode(ctx, 4, client.NodePatch{Labels: map[string]*string{"team": client.Ptr("other")}}); err != nil {
		t.Fatal(err)
	}
	// Node 4 is shown again once it left; node 6, registered after it
	// in the range and with the label, enters (the stream went on, and
	// --ip's mapped prefix matches it as the server's filter does).
	f.node(t, "10.0.0.9", 0, nil, "ib-b", map[string]string{"team": "research"})
	waitFor(t, "node 6's row", func() bool {
		return regexp.MustCompile(`(?m)^6\s+10\.0\.0\.9\s+0\s+80Gi\s+free\s`).MatchString(p.stdout.String())
	})
	if n := strings.Count(p.stdout.String(), "\n4 "); n != 2 {
		t.Errorf("node 4 shown %d times; want twice (listed, then leaving the selector):\n%s", n, p.stdout)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, p); code != 0 {
		t.Errorf("watch after SIGTERM: exit %d\n%s", code, p.stderr)
	}
}

// apiBody is the body the API answers to method path (body: JSON sent),
// as curl would print it, asked with the fleet's admin token.
func (f *cliFleet) apiBody(t *testing.T, method, path, body string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.admin)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %v %s", method, path, resp.StatusCode, err, b)
	}
	return b
}

// compact is JSON text without its blanks.
func compact(t *testing.T, b []byte) string {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return out.String()
}

// yamlKeys are the keys of the first mapping of a YAML text, in order.
func yamlKeys(t *testing.T, text string) []string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	m := doc.Content[0]
	if m.Kind == yaml.SequenceNode {
		m = m.Content[0]
	}
	var keys []string
	for i := 0; i < len(m.Content); i += 2 {
		keys = append(keys, m.Content[i].Value)
	}
	return keys
}

// -o json is the API's text: the same members in the same order with the
// same values, and members the client does not know kept. -o yaml has
// the same members in the same order, and a YAML 1.1 reader (PyYAML)
// reads strings such as yes and on as strings.
func TestNodesCLIJSONIsTheAPIs(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	labels := map[string]*string{"on": client.Ptr("yes"), "x": client.Ptr("NO")}
	if _, err := f.api.PatchNode(context.Background(), 1, client.NodePatch{Labels: labels}); err != nil {
		t.Fatal(err)
	}
	api := f.apiBody(t, "POST", "/v1/nodes/list", "{}")
	if got := f.ok(t, "nodes", "list", "-o", "json"); compact(t, []byte(got)) != compact(t, api) {
		t.Errorf("nodes list -o json is not the API's list:\ncli %s\napi %s", compact(t, []byte(got)), compact(t, api))
	}
	one := f.apiBody(t, "GET", "/v1/nodes/1", "")
	if got := f.ok(t, "nodes", "get", "1", "-o", "json"); compact(t, []byte(got)) != compact(t, one) {
		t.Errorf("nodes get 1 -o json is not the API's document:\ncli %s\napi %s", compact(t, []byte(got)), compact(t, one))
	}
	// The other lists print the API's documents too.
	for _, tc := range []struct {
		args       []string
		path, body string
	}{
		{[]string{"fabrics", "list", "-o", "json"}, "/v1/fabrics/list", "{}"},
		{[]string{"hardware", "list", "-o", "json"}, "/v1/hardware/list", "{}"},
	} {
		if got, api := f.ok(t, tc.args...), f.apiBody(t, "POST", tc.path, tc.body); compact(t, []byte(got)) != compact(t, api) {
			t.Errorf("%v is not the API's list:\ncli %s\napi %s", tc.args, compact(t, []byte(got)), compact(t, api))
		}
	}
	all, err := f.api.ListAudit(context.Background(), client.AuditFilter{})
	if err != nil || len(all) < 4 {
		t.Fatalf("audit log: %d entries, %v", len(all), err)
	}
	newest := f.apiBody(t, "POST", "/v1/audit/list", fmt.Sprintf(`{"after":%d,"limit":3}`, all[len(all)-4].ID))
	if got := f.ok(t, "audit", "list", "--limit", "3", "-o", "json"); compact(t, []byte(got)) != compact(t, newest) {
		t.Errorf("audit list --limit 3 -o json is not the API's entries:\ncli %s\napi %s", compact(t, []byte(got)), compact(t, newest))
	}
	y := f.ok(t, "nodes", "get", "1", "-o", "yaml")
	if d := cmp.Diff(yamlKeys(t, compact(t, one)), yamlKeys(t, y)); d != "" {
		t.Errorf("nodes get 1 -o yaml: members not in the API's order (-api +cli):\n%s", d)
	}
	for _, want := range []string{`"on": "yes"`, `x: "NO"`} {
		if !strings.Contains(y, want) {
			t.Errorf("nodes get 1 -o yaml lacks %s:\n%s", want, y)
		}
	}
	if _, err := exec.LookPath("python3"); err == nil {
		py := `import sys, yaml; d = yaml.safe_load(sys.stdin); print(sorted((str(k), type(k).__name__, type(v).__name__) for k, v in d["labels"].items()))`
		cmd := exec.Command("python3", "-c", py)
		cmd.Stdin = strings.NewReader(y)
		out, err := cmd.CombinedOutput()
		switch {
		case err != nil && strings.Contains(string(out), "No module named"):
			t.Log("PyYAML is not installed: YAML 1.1 reading not checked")
		case err != nil:
			t.Errorf("PyYAML: %v %s", err, out)
		case strings.TrimSpace(string(out)) != "[('on', 'str', 'str'), ('team', 'str', 'str'), ('x', 'str', 'str')]":
			t.Errorf("PyYAML reads the labels as %s; want strings", out)
		}
	}

	// A newer server's member is printed too, where the API put it.
	newer := strings.Replace(string(one), `"ip"`, `"from_the_future":{"b":1,"a":2},"ip"`, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, newer)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"REGISTRY_SERVER": srv.URL, "REGISTRY_TOKEN": "x.y.z", "HOME": t.TempDir()}
	if r := cli(t, env, "nodes", "get", "1", "-o", "json"); r.code != 0 || compact(t, []byte(r.stdout)) != compact(t, []byte(newer)) {
		t.Errorf("a newer server's document: %+v", r)
	}
}

// nodes list --watch -o json, yaml and name show events, a deletion
// included: json one {"type","object"} per line, yaml a --- document
// each, name node/PK and "deleted".
func TestNodesCLIWatchEvents(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	procs := map[string]*process{}
	for _, o := range []string{"json", "yaml", "name"} {
		procs[o] = startProcess(t, f.env(t), "nodes", "list", "--watch", "--fabric", "ib-a", "-o", o)
	}
	waitFor(t, "the lists", func() bool {
		return strings.Count(procs["json"].stdout.String(), "\n") == 4 && strings.Count(procs["name"].stdout.String(), "\n") == 4 &&
			strings.Count(procs["yaml"].stdout.String(), "---\n") == 4
	})
	if err := f.api.ForceDeleteNode(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion", func() bool {
		return strings.Contains(procs["name"].stdout.String(), "node/4 deleted\n") &&
			strings.Contains(procs["json"].stdout.String(), `{"type":"deleted","object":{"pk":4,`) &&
			strings.Count(procs["yaml"].stdout.String(), "---\n") == 5
	})
	for o, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitStatus(t, p); code != 0 {
			t.Errorf("-o %s: exit %d %s", o, code, p.stderr)
		}
	}
	if got, want := procs["name"].stdout.String(), "node/1\nnode/2\nnode/3\nnode/4\nnode/4 deleted\n"; got != want {
		t.Errorf("-o name: %q, want %q", got, want)
	}
	lines := strings.Split(strings.TrimSpace(procs["json"].stdout.String()), "\n")
	var types []string
	for _, l := range lines {
		var ev struct {
			Type   string
			Object client.Node
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("-o json line %q: %v", l, err)
		}
		types = append(types, fmt.Sprintf("%s %d", ev.Type, ev.Object.PK))
	}
	if d := cmp.Diff([]string{"added 1", "added 2", "added 3", "added 4", "deleted 4"}, types); d != "" {
		t.Errorf("-o json events (-want +got):\n%s", d)
	}
	dec := yaml.NewDecoder(strings.NewReader(procs["yaml"].stdout.String()))
	types = nil
	for {
		var ev struct {
			Type   string         `yaml:"type"`
			Object map[string]any `yaml:"object"`
		}
		if err := dec.Decode(&ev); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		types = append(types, fmt.Sprintf("%s %v", ev.Type, ev.Object["pk"]))
	}
	if d := cmp.Diff([]string{"added 1", "added 2", "added 3", "added 4", "deleted 4"}, types); d != "" {
		t.Errorf("-o yaml events (-want +got):\n%s", d)
	}
}

// audit list shows the newest --limit entries, oldest first, and says on
// stderr that there were more; --since takes days.
func TestNodesCLIAuditNewest(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	all, err := f.api.ListAudit(context.Background(), client.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 5 {
		t.Fatalf("the fleet's audit log has %d entries; want at least 5", len(all))
	}
	r := cli(t, f.env(t), "audit", "list", "--limit", "3", "-o", "json", "--since", "1d")
	var got []client.AuditEntry
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil {
		t.Fatalf("audit list --limit 3: %v %+v", err, r)
	}
	var ids, want []int64
	for _, a := range got {
		ids = append(ids, a.ID)
	}
	for _, a := range all[len(all)-3:] {
		want = append(want, a.ID)
	}
	if d := cmp.Diff(want, ids); d != "" {
		t.Errorf("audit list --limit 3: not the newest 3 (-want +got):\n%s", d)
	}
	if hint := fmt.Sprintf("showing the newest 3 of %d entries", len(all)); !strings.Contains(r.stderr, hint) {
		t.Errorf("audit list --limit 3: stderr %q lacks %q", r.stderr, hint)
	}
	if r := cli(t, f.env(t), "audit", "list", "--limit", "0", "-o", "name"); r.code != 2 {
		t.Errorf("audit list -o name: %+v; want a usage error", r)
	}
	if r := cli(t, f.env(t), "audit", "list", "--limit", "0"); r.code != 0 || strings.Contains(r.stderr, "showing") {
		t.Errorf("audit list --limit 0: %+v", r)
	}
	// Without --since or --after, the last day; --since all, the whole log.
	f.exec(t, fmt.Sprintf(`ALTER TABLE audit_log DISABLE TRIGGER USER; -- append-only: made older here, by hand
		UPDATE audit_log SET at = now() - interval '25 hours' WHERE id <= %d;
		ALTER TABLE audit_log ENABLE TRIGGER USER`, all[1].ID))
	count := func(args ...string) int {
		t.Helper()
		r := cli(t, f.env(t), append([]string{"audit", "list", "--limit", "0", "-o", "json"}, args...)...)
		var got []client.AuditEntry
		if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil {
			t.Fatalf("audit list %q: %v %+v", args, err, r)
		}
		return len(got)
	}
	if n := count(); n != len(all)-2 {
		t.Errorf("audit list: %d entries, want the %d of the last day", n, len(all)-2)
	}
	if n := count("--since", "all"); n != len(all) {
		t.Errorf("audit list --since all: %d entries, want %d", n, len(all))
	}
	if n := count("--after", fmt.Sprint(all[0].ID)); n != len(all)-1 {
		t.Errorf("audit list --after: %d entries, want %d", n, len(all)-1)
	}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{"7d": now.Add(-7 * 24 * time.Hour), "90m": now.Add(-90 * time.Minute),
		"2026-12-01T00:00:00Z": time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "-1h", "d", "1.5d", "-2d"} {
		if _, err := parseSince(in, now); err == nil {
			t.Errorf("parseSince(%q) accepted", in)
		}
	}
}

// config set-context keeps --token-file and --ca-file as absolute paths,
// so that the context works from any folder.
func TestNodesCLIContextAbsolutePaths(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	env := map[string]string{"REGISTRY_CONFIG": cfg}
	if r := cli(t, env, "config", "set-context", "x", "--server", "https://registry.example.com",
		"--token-file", "some.token", "--ca-file", filepath.Join("testdata", "ca.pem")); r.code != 0 {
		t.Fatalf("set-context: %+v", r)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"token_file: " + filepath.Join(wd, "some.token"), "ca_file: " + filepath.Join(wd, "testdata", "ca.pem")} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the contexts file lacks %q:\n%s", want, b)
		}
	}
}

// Completion offers each command's own values: token --role no system,
// audit list -o only its formats, the sort keys sortKeys has, and the
// contexts' names after config use-context.
func TestNodesCLICompletionValues(t *testing.T) {
	t.Parallel()
	for _, k := range sortKeyWords {
		if _, ok := sortKeys[k]; !ok {
			t.Errorf("sort key %q is offered but sorts nothing", k)
		}
	}
	if len(sortKeyWords) != len(sortKeys) {
		t.Errorf("sortKeyWords %q and sortKeys differ", sortKeyWords)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	for _, name := range []string{"prod", "staging"} {
		if r := cli(t, map[string]string{"REGISTRY_CONFIG": cfg}, "config", "set-context", name, "--server", "https://"+name+".example.com"); r.code != 0 {
			t.Fatal(r)
		}
	}
	if r := cli(t, map[string]string{"REGISTRY_CONFIG": cfg}, "config", "set-context", "$(id)", "--server", "https://x.example.com"); r.code != 2 {
		t.Errorf("a context name a shell would run: %+v", r)
	}
	// A name written into the file by hand is offered, never run.
	mark := filepath.Join(t.TempDir(), "ran")
	evil := "s$(touch${IFS}" + mark + ")"
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, fmt.Sprintf("    - name: %q\n      server: https://x.example.com\n", evil)...)
	if err := os.WriteFile(cfg, text, 0o600); err != nil {
		t.Fatal(err)
	}
	script, _, err := runCmd(t, nil, "completion", "bash")
	if err != nil {
		t.Fatal(err)
	}
	// registryd on PATH is this test binary running main.
	bin := t.TempDir()
	wrapper := "#!/bin/sh\n" + runMainEnv + "=1 REGISTRY_CONFIG=" + cfg + " exec " + os.Args[0] + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "registryd"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script+`
COMP_WORDS=(registryd token --role ""); COMP_CWORD=3; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd audit list --role ""); COMP_CWORD=4; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd audit list -o ""); COMP_CWORD=4; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd nodes list --sort-by g); COMP_CWORD=4; _registryd; echo "${COMPREPLY[@]}"
COMP_WORDS=(registryd config use-context s); COMP_CWORD=3; _registryd; echo "${COMPREPLY[@]}"`)
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	want := "admin scheduler agent reader\nadmin scheduler agent reader system\ntable json yaml\ngpu-mem\nstaging " + evil + "\n"
	if err != nil || string(out) != want {
		t.Errorf("bash completion: %v\n%s\nwant\n%s", err, out, want)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("bash completion ran the code in a context's name")
	}
}

// A table fits a terminal whatever the nodes hold: long free text is cut
// (fabric, host, driver, labels), and a watch's later rows keep the
// widths of the table it printed first.
func TestNodesCLITableWidths(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	long := strings.Repeat("f", 150)
	n := client.NodeCreate{IP: "10.0.0.8", CPUMem: 1 << 30, DriverVersion: strings.Repeat("5", 60), Fabric: &long,
		Labels: &client.NodeLabels{"team": strings.Repeat("r", 60)}}
	if _, _, err := f.api.CreateNode(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"nodes", "list"}, {"nodes", "list", "-o", "wide"}} {
		out := f.ok(t, args...)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if w := len([]rune(line)); w > 100 && len(args) == 2 || w > 220 {
				t.Errorf("%q: a line of %d columns:\n%s", args, w, out)
			}
		}
		if !strings.Contains(out, strings.Repeat("f", 39)+"…") {
			t.Errorf("%q: the fabric is not cut:\n%s", args, out)
		}
	}

	var b strings.Builder
	tb := &table{header: []string{"A", "B", "C"}, rows: [][]string{{"1", "free", "x"}}}
	tb.write(&b, false)
	tb.keep = true
	tb.rows = [][]string{{"22", "a-long-one", "the last column is not cut"}}
	tb.write(&b, true)
	if want := "A  B     C\n1  free  x\n…  a-l…  the last column is not cut\n"; b.String() != want {
		t.Errorf("a kept table:\n%q\nwant\n%q", b.String(), want)
	}
	// Columns that tell nodes apart are never cut: two IPv6 hosts that
	// share a long prefix stay two.
	b.Reset()
	tb = &table{header: []string{"PK", "HOST", "STATE"}, rows: [][]string{{"1", "10.0.0.8", "free"}}}
	tb.write(&b, false)
	tb.keep = true
	tb.rows = [][]string{{"1234567", "fd00:1234:5678:9abc:def0:1234:5678:aaaa", "busy-and-more"}}
	tb.write(&b, true)
	if want := "PK  HOST      STATE\n1   10.0.0.8  free\n1234567  fd00:1234:5678:9abc:def0:1234:5678:aaaa  busy-and-more\n"; b.String() != want {
		t.Errorf("a kept table cuts what tells nodes apart:\n%q\nwant\n%q", b.String(), want)
	}
}

// A redirect is not followed: the API never sends one, and following it
// could carry the token to a scheme or host the CLI did not check.
func TestNodesCLIRefusesRedirects(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		http.Error(w, "not a registry", http.StatusTeapot)
	}))
	t.Cleanup(elsewhere.Close)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)
	env := map[string]string{"REGISTRY_CONFIG": filepath.Join(t.TempDir(), "none.yaml"), "REGISTRY_SERVER": redirector.URL, "REGISTRY_TOKEN": "x.y.z"}
	if r := cli(t, env, "nodes", "list"); r.code != 1 || !strings.Contains(r.stderr, "redirect") {
		t.Errorf("a redirecting server: %+v", r)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the redirect was followed %d times", n)
	}
}

// REGISTRY_SERVER names the context's own server however it is spelt;
// another host, port, scheme or path is another server.
func TestSameServer(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"https://prod.example.com", "https://prod.example.com/", true},
		{"https://PROD.example.com:443", "https://prod.example.com", true},
		{"http://[::1]:80/", "http://[::1]", true},
		{"https://prod.example.com/registry/", "https://prod.example.com/registry", true},
		{"https://prod.example.com", "http://prod.example.com", false},
		{"https://prod.example.com", "https://prod.example.com:8443", false},
		{"https://prod.example.com", "https://staging.example.com", false},
		{"https://prod.example.com/a", "https://prod.example.com/b", false},
	} {
		if got := sameServer(tc.a, tc.b); got != tc.same {
			t.Errorf("sameServer(%q, %q) = %t, want %t", tc.a, tc.b, got, tc.same)
		}
	}
}
