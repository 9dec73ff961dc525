package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
)

// running fails the test if p has exited: what it waits for has not come.
func running(t *testing.T, p *process, why string) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("exited %s: %v\nstdout:\n%s\nstderr:\n%s", why, p.err, p.stdout, p.stderr)
	default:
	}
}

// A node uncordoned by someone else during a drain stays the drain's:
// while its job holds it, the drain waits and says it is held (once, a
// warning that it is no longer draining); once released, it is not
// drained (a claim may take it), and the drain fails.
func TestNodesCLIDrainUncordonedByOthers(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // job 41 holds nodes 1 and 2
	ctx := context.Background()
	p := startProcess(t, f.env(t), "nodes", "drain", "1", "2", "4", "--interval", "50ms", "--deadline", "1m", "--reason", "psu")
	waitFor(t, "the drain's progress", func() bool { return strings.Contains(p.stdout.String(), "2 of 3 nodes still held by job 41\n") })
	if _, err := f.api.UncordonNodes(ctx, client.NodeUncordon{Nodes: []int64{1, 2}}); err != nil {
		t.Fatal(err)
	}
	for _, pk := range []string{"1", "2"} {
		warning := "node/" + pk + " was uncordoned by someone else; it is no longer draining\n"
		waitFor(t, "the warning for node "+pk, func() bool { return strings.Contains(p.stderr.String(), warning) })
	}
	// Busy again, both are still held by job 41: the drain goes on.
	time.Sleep(500 * time.Millisecond)
	running(t, p, "while job 41 still held its nodes, uncordoned by someone else")
	if _, err := f.api.ReleaseNodes(ctx, client.NodeRelease{Job: 41}); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, p); code != 1 || !strings.Contains(p.stderr.String(), "2 of them (1 and 2) are no longer cordoned") {
		t.Errorf("a drain whose nodes someone uncordoned: exit %d\n%s", code, p.stderr)
	}
	if strings.Contains(p.stdout.String(), "drained") {
		t.Errorf("nodes someone uncordoned were said drained:\n%s", p.stdout)
	}
	if n := strings.Count(p.stderr.String(), "node/1 was uncordoned"); n != 1 {
		t.Errorf("the warning for node 1 came %d times, want once:\n%s", n, p.stderr)
	}
}

// flakyProxy stands between the CLI and the registry, and can stop
// answering (connections refused) and start again, at the same address.
type flakyProxy struct {
	addr  string
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	mu    sync.Mutex
	srv   *http.Server
}

func startFlakyProxy(t *testing.T, target string) *flakyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &flakyProxy{addr: "127.0.0.1:0", proxy: httputil.NewSingleHostReverseProxy(u), tr: tr}
	p.proxy.Transport = tr
	p.up(t)
	t.Cleanup(func() { p.down(); tr.CloseIdleConnections() })
	return p
}

func (p *flakyProxy) url() string { return "http://" + p.addr }

// up listens again, at the address it listened at before.
func (p *flakyProxy) up(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.srv = &http.Server{Handler: p.proxy, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
}

// down closes the listener and every connection: the next ones are
// refused.
func (p *flakyProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.srv.Close()
}

// A drain outlives a registry that stops answering for a while: it says
// so once, looks again every interval, and ends when the nodes are
// released, as it would have.
func TestNodesCLIDrainRegistryRestart(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // job 41 holds nodes 1 and 2
	proxy := startFlakyProxy(t, f.url)
	env := f.env(t)
	env["REGISTRY_SERVER"] = proxy.url()
	p := startProcess(t, env, "nodes", "drain", "1", "2", "--interval", "50ms", "--deadline", "1m", "--reason", "psu")
	waitFor(t, "the drain's progress", func() bool { return strings.Contains(p.stdout.String(), "2 of 2 nodes still held by job 41\n") })
	proxy.down()
	waitFor(t, "the warning", func() bool { return strings.Contains(p.stderr.String(), "warning: cannot read the nodes") })
	running(t, p, "while the registry did not answer")
	if _, err := f.api.ReleaseNodes(context.Background(), client.NodeRelease{Job: 41}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	running(t, p, "while the registry did not answer")
	proxy.up(t)
	if code := exitStatus(t, p); code != 0 || !strings.Contains(p.stdout.String(), "2 of 2 nodes drained: no job holds any\n") {
		t.Fatalf("drain after the registry came back: exit %d\nstdout:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	if n := strings.Count(p.stderr.String(), "warning: cannot read the nodes"); n != 1 || !strings.Contains(p.stderr.String(), "the registry answers again\n") {
		t.Errorf("the outage was said %d times (want once, then that it answers again):\n%s", n, p.stderr)
	}
	// A refusal that will not pass by itself still ends it: a reader may
	// not cordon (403), before any wait.
	env["REGISTRY_TOKEN"] = f.reader
	if r := cli(t, env, "nodes", "drain", "4", "--interval", "50ms", "--deadline", "1m"); r.code != 1 || !strings.Contains(r.stderr, "403") {
		t.Errorf("a reader's drain: %+v", r)
	}
}

// An admin's cordon reason is never replaced by the CLI's default: a
// cordon or drain without --reason leaves a cordoned node's reason as it
// is, and gives the default only to nodes not cordoned yet; --reason
// replaces every one. The help says so, and no "(default x)".
func TestNodesCLICordonKeepsReason(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // node 3 cordoned for "fan failure"
	ctx := context.Background()
	reasons := func() map[int64]string {
		t.Helper()
		nodes, err := f.api.ListNodes(ctx, client.NodeFilter{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[int64]string{}
		for _, n := range nodes {
			if n.CordonReason != nil {
				out[n.PK] = *n.CordonReason
			}
		}
		return out
	}
	out := f.ok(t, "nodes", "cordon", "3", "4")
	if want := "node/3 cordoned (already cordoned: fan failure)\nnode/4 cordoned\n"; out != want {
		t.Errorf("cordon 3 4:\n%q\nwant\n%q", out, want)
	}
	want := map[int64]string{3: "fan failure", 4: "cordoned with registryd nodes cordon"}
	if d := cmp.Diff(want, reasons()); d != "" {
		t.Errorf("reasons after a cordon without --reason (-want +got):\n%s", d)
	}
	// By filters, and a drain: the same.
	f.ok(t, "nodes", "cordon", "--selector", "team=research")
	f.ok(t, "nodes", "drain", "--ip", "10.0.1.2", "--interval", "50ms", "--deadline", "10s")
	f.ok(t, "nodes", "drain", "3", "--interval", "50ms", "--deadline", "10s")
	want = map[int64]string{1: "cordoned with registryd nodes cordon", 2: "cordoned with registryd nodes cordon", 3: "fan failure",
		4: "cordoned with registryd nodes cordon", 5: "drained with registryd nodes drain"}
	if d := cmp.Diff(want, reasons()); d != "" {
		t.Errorf("reasons after cordons and drains without --reason (-want +got):\n%s", d)
	}
	// --reason is the admin's word: it replaces.
	f.ok(t, "nodes", "cordon", "3", "--reason", "new fan")
	if got := reasons()[3]; got != "new fan" {
		t.Errorf("node 3's reason after --reason: %q", got)
	}
	for _, name := range []string{"cordon", "drain"} {
		help, _, err := runCmd(t, nil, "nodes", name, "--help")
		if err != nil || strings.Contains(help, "(default x)") || !strings.Contains(help, "keep theirs") {
			t.Errorf("nodes %s --help: %v\n%s", name, err, help)
		}
	}
}

// More than a request takes (1000 pks): cordon and uncordon by filters
// send the nodes in batches, and act on every one.
func TestNodesCLIThousandsByFilter(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	const n = maxPKsPerRequest + 5
	// Registered 16 at a time.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				ip := "10.1." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1)
				_, _, err := f.api.CreateNode(context.Background(), client.NodeCreate{IP: ip, CPUMem: 1 << 30,
					DriverVersion: "550.54.15", Labels: &client.NodeLabels{"rack": "r12"}})
				errs <- err
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	count := func(state client.NodeState) int {
		t.Helper()
		nodes, err := listAll(context.Background(), f.api, client.NodeFilter{State: client.States(state)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(nodes)
	}
	// More than the API cordons by filter: refused, nothing cordoned,
	// unless --all says so.
	if r := cli(t, f.env(t), "nodes", "cordon", "--selector", "rack=r12", "--reason", "rack move"); r.code != 1 ||
		!strings.Contains(r.stderr, "--all") || count(client.StateCordoned) != 0 {
		t.Fatalf("cordon of %d nodes by selector without --all: exit %d, %d cordoned\n%s", n, r.code, count(client.StateCordoned), r.stderr)
	}
	if r := cli(t, f.env(t), "nodes", "drain", "--selector", "rack=r12"); r.code != 1 || count(client.StateCordoned) != 0 {
		t.Fatalf("drain of %d nodes by selector without --all: exit %d, %d cordoned\n%s", n, r.code, count(client.StateCordoned), r.stderr)
	}
	if r := cli(t, f.env(t), "nodes", "cordon", "--selector", "rack=r12", "--reason", "rack move", "--all"); r.code != 0 || count(client.StateCordoned) != n {
		t.Fatalf("cordon of %d nodes by selector: exit %d, %d cordoned\n%s", n, r.code, count(client.StateCordoned), r.stderr)
	}
	if r := cli(t, f.env(t), "nodes", "uncordon", "--selector", "rack=r12"); r.code != 0 || count(client.StateFree) != n {
		t.Fatalf("uncordon of %d nodes by selector: exit %d, %d free\n%s", n, r.code, count(client.StateFree), r.stderr)
	}
}

// nodes delete and label act on every pk named, whatever becomes of one:
// each failure is named, and the exit status is the most severe (1 for
// any failure, else 4 for a pk that names no node). The server's
// conflict says which job holds the node.
func TestNodesCLIEveryPK(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // job 41 holds nodes 1 and 2
	ctx := context.Background()
	r := cli(t, f.env(t), "nodes", "delete", "99999", "1", "4")
	if r.code != 1 || r.stdout != "node/4 deleted\n" {
		t.Errorf("delete 99999 1 4: %+v", r)
	}
	for _, want := range []string{"node/1: 409 Conflict: job 41 holds node 1;", "no node 99999"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("delete 99999 1 4: stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if _, err := f.api.GetNode(ctx, 4); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("node 4 after delete 99999 1 4: %v", err)
	}
	// Only pks that name nothing: 4.
	r = cli(t, f.env(t), "nodes", "label", "99999", "3", "5", "tier=gold")
	if r.code != exitNotFound || !strings.Contains(r.stderr, "no node 99999") {
		t.Errorf("label 99999 3 5: %+v", r)
	}
	for _, pk := range []int64{3, 5} {
		if n, err := f.api.GetNode(ctx, pk); err != nil || n.Labels["tier"] != "gold" {
			t.Errorf("node %d after label 99999 3 5: %v %v", pk, err, n.Labels)
		}
	}
}

// Mistakes the command line shows are usage errors (exit 2), and nothing
// is sent: an empty reason, a label key or value the server refuses, a
// label both set and removed, an --ip prefix with host bits.
func TestNodesCLIUsageNotSent(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	ctx := context.Background()
	before, err := f.api.ListNodes(ctx, client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"nodes", "cordon", "4", "--reason", ""},
		{"nodes", "cordon", "4", "--reason", " padded"},
		{"nodes", "drain", "4", "--reason", ""},
		{"nodes", "label", "4", "bad key=1"},
		{"nodes", "label", "4", "a=bad value"},
		{"nodes", "label", "4", "x.-"},
		{"nodes", "label", "4", "a=1", "a-"},
		{"nodes", "label", "4", "a=1", "a=2"},
		{"nodes", "list", "--ip", "10.0.0.5/24"},
		{"nodes", "cordon", "--ip", "10.0.0.5/24"},
	} {
		r := cli(t, f.env(t), args...)
		if r.code != 2 || !strings.Contains(r.stderr, "usage: registryd") || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error (2)", args, r.code, r.stdout, r.stderr)
		}
	}
	after, err := f.api.ListNodes(ctx, client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("usage errors changed nodes (-before +after):\n%s", d)
	}
}

// A batch that fails after others went through says what was done and
// what was not sent, and keeps the server's error for the exit status.
func TestNodesCLIPartlyDone(t *testing.T) {
	refused := &client.Error{Status: http.StatusServiceUnavailable, Title: "Service Unavailable"}
	if err := partly(refused, 0, "cordoned", 0, []int64{1, 2}); err != refused {
		t.Errorf("the first batch's failure: %v, want the server's error alone", err)
	}
	err := partly(refused, 2, "cordoned", 2000, []int64{2001, 2002, 2500})
	var ce *client.Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "2000 nodes were cordoned before this failure; 3 not sent (node/2001 to node/2500)") {
		t.Errorf("a later batch's failure: %v", err)
	}
}
