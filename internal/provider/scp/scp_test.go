package scp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

func TestSign(t *testing.T) {
	t.Parallel()
	// Expected values computed outside Go, e.g. for the first:
	//
	//	printf '%s' 'GEThttps://multinodegpucluster.kr-west1.s.samsungsdscloud.com/v1/gpu-nodes?page=0&size=100' \
	//	  '1605290625682' 'test-access-key' 'f5c8e56a4d9b49a8bd89e14758a32d53' 'Openapi' |
	//	  openssl dgst -sha256 -hmac 'test-secret-key' -binary | base64
	//
	// and for the second the same with the products URL and an empty
	// account id.
	const base = "https://multinodegpucluster.kr-west1.s.samsungsdscloud.com"
	tests := []struct {
		name      string
		url       string
		accountID string
		want      string
	}{
		{"with query and account", base + "/v1/gpu-nodes?page=0&size=100", "f5c8e56a4d9b49a8bd89e14758a32d53",
			"Br6XTnW6gKhzecqrN703dE4WCI1P9x7LOTTW4Df3BhE="},
		{"no query, no account", base + "/v1/gpu-nodes/products", "",
			"/u3BOpYU0hkU/wy3HdYP/tbimYG1ncLV1O8WEfhRaME="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scp.Sign("GET", tt.url, "1605290625682", "test-access-key", tt.accountID, "test-secret-key")
			if got != tt.want {
				t.Errorf("Sign = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	ok := scp.Config{Endpoint: "https://multinodegpucluster.kr-west1.s.samsungsdscloud.com", AccessKey: "AK-visible", SecretKey: "SK-hidden"}
	tests := []struct {
		name   string
		change func(*scp.Config)
		want   string // "" means valid
	}{
		{"valid", func(*scp.Config) {}, ""},
		{"trailing slash", func(c *scp.Config) { c.Endpoint += "/" }, ""},
		{"no endpoint", func(c *scp.Config) { c.Endpoint = "" }, "endpoint is required"},
		{"relative", func(c *scp.Config) { c.Endpoint = "multinodegpucluster.kr-west1.s.samsungsdscloud.com" }, "absolute http(s) URL"},
		{"ftp", func(c *scp.Config) { c.Endpoint = "ftp://example.com" }, "absolute http(s) URL"},
		{"user info", func(c *scp.Config) { c.Endpoint = "https://u:SK-hidden@example.com" }, "credentials"},
		{"query", func(c *scp.Config) { c.Endpoint = "https://example.com/?x=1" }, "query"},
		{"no access key", func(c *scp.Config) { c.AccessKey = "" }, "access key is required"},
		{"no secret key", func(c *scp.Config) { c.SecretKey = "" }, "secret key is required"},
		{"negative page size", func(c *scp.Config) { c.PageSize = -1 }, "page size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.change(&cfg)
			c, err := scp.New(cfg)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if c.Name() != "scp" {
					t.Errorf("Name = %q, want scp", c.Name())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error = %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "SK-hidden") {
				t.Errorf("error %q reveals the secret key", err)
			}
		})
	}
}

// Products of the test catalogue, by name.
var products = []scptest.Product{
	// PROVIDERS.md's example, with the seed's "│" separator.
	{ID: "prod-b300", Name: "b300_metal", GPUModel: "B300", MemoryValue: "4096", CPUValue: "128",
		Description: "CPU 128 │ Memory 4096GB │ B300(268GB)*8 │ Disk 960GB"},
	// "|", "G" and a count unlike the table's.
	{ID: "prod-h200", Name: "h200_half", GPUModel: "H200", MemoryValue: "1024", CPUValue: "64",
		Description: "CPU 64 | Memory 1024G | H200(141G)*4 | Disk 960G"},
	// The seed's own description says nothing of GPUs: the table answers.
	{ID: "prod-h100", Name: "s2v16m128_metal", GPUModel: "H100", MemoryValue: "128", CPUValue: "64",
		Description: "vCPU 16 │ Memory 128G │ Disk 480G"},
	{ID: "prod-cpu", Name: "cpu_metal", GPUModel: "NONE", MemoryValue: "512", CPUValue: "96",
		Description: "CPU 96 │ Memory 512GB │ Disk 960GB"},
	{ID: "prod-cpu2", Name: "cpu_blank", GPUModel: "", MemoryValue: "256", CPUValue: "48",
		Description: "CPU 48 │ Memory 256GB"},
	{ID: "prod-x999", Name: "x999_metal", GPUModel: "X999", MemoryValue: "2048", CPUValue: "128",
		Description: "CPU 128 │ Memory 2048GB │ Disk 960GB"},
	{ID: "prod-badmem", Name: "badmem_metal", GPUModel: "H100", MemoryValue: "lots", CPUValue: "64",
		Description: "CPU 64 │ Memory lots │ H100(80GB)*8"},
}

const gib = provider.GiB

// The catalogue's two fabrics, in one node pool.
var (
	fabricA = scptest.Topology{FabricID: "20c507a036c447cdb3b19468d8ea62ac", FabricName: "cluster001",
		NodePoolID: "POOL001-krw1a", RegionID: "kr-west1"}
	fabricB = scptest.Topology{FabricID: "9b1de7c4a2f04e3c8d5a6b7c8d9e0f1a", FabricName: "cluster002",
		NodePoolID: "POOL001-krw1a", RegionID: "kr-west1"}
)

// labels is a host's expected labels; "" leaves one out.
func labels(region, pool, fabricName, serverType string) map[string]string {
	m := map[string]string{}
	for k, v := range map[string]string{scp.LabelRegion: region, scp.LabelNodePool: pool,
		scp.LabelFabricName: fabricName, scp.LabelServerType: serverType} {
		if v != "" {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// catalogue is 45 GPU nodes, each case once, the rest ordinary B300
// nodes, and what Fetch must make of them.
func catalogue() (nodes []scptest.Node, hosts []provider.Host, skips []provider.Skip) {
	type nodeCase struct {
		node scptest.Node // Topology nil: in fabricA
		// host nil: skipped with a reason containing skip. Labels nil: a
		// host of fabricA or fabricB with the node's server_type.
		host *provider.Host
		skip string
	}
	cases := []nodeCase{
		{node: scptest.Node{ID: "n-b300", Name: "gpu-b300", PolicyIP: "10.0.0.1", ServerType: "b300_metal", ProductTypeID: "x", State: "RUNNING"},
			host: &provider.Host{GPUModel: "B300", GPUs: 8, GPUMemBytes: 268 * gib, CPUMemBytes: 4096 * gib}},
		{node: scptest.Node{ID: "n-h200", Name: "gpu-h200", PolicyIP: "10.0.0.2", ServerType: "h200_half", State: "RUNNING"},
			host: &provider.Host{GPUModel: "H200", GPUs: 4, GPUMemBytes: 141 * gib, CPUMemBytes: 1024 * gib}},
		{node: scptest.Node{ID: "n-h100", Name: "gpu-h100", PolicyIP: "10.0.0.3", ServerType: "s2v16m128_metal", State: "RUNNING"},
			host: &provider.Host{GPUModel: "H100", GPUs: 8, GPUMemBytes: 80 * gib, CPUMemBytes: 128 * gib}},
		// Found by product_type_id when server_type names no product.
		{node: scptest.Node{ID: "n-byid", Name: "gpu-byid", PolicyIP: "10.0.0.4", ServerType: "renamed_metal", ProductTypeID: "prod-h100", State: "RUNNING"},
			host: &provider.Host{GPUModel: "H100", GPUs: 8, GPUMemBytes: 80 * gib, CPUMemBytes: 128 * gib}},
		{node: scptest.Node{ID: "n-cpu", Name: "cpu-1", PolicyIP: "10.0.0.5", ServerType: "cpu_metal", State: "RUNNING"},
			host: &provider.Host{CPUMemBytes: 512 * gib}},
		{node: scptest.Node{ID: "n-cpu2", Name: "cpu-2", PolicyIP: "10.0.0.6", ServerType: "cpu_blank", State: "RUNNING"},
			host: &provider.Host{CPUMemBytes: 256 * gib}},
		{node: scptest.Node{ID: "n-stopped", Name: "gpu-stopped", PolicyIP: "10.0.0.7", ServerType: "b300_metal", State: "STOPPED"},
			host: &provider.Host{GPUModel: "B300", GPUs: 8, GPUMemBytes: 268 * gib, CPUMemBytes: 4096 * gib}},
		{node: scptest.Node{ID: "n-noip", Name: "gpu-noip", ServerType: "b300_metal", State: "CREATING"},
			skip: "no policy_ip"},
		{node: scptest.Node{ID: "n-noproduct", Name: "gpu-noproduct", PolicyIP: "10.0.0.9", ServerType: "gone_metal", ProductTypeID: "gone", State: "RUNNING"},
			skip: "unknown product"},
		{node: scptest.Node{ID: "n-x999", Name: "gpu-x999", PolicyIP: "10.0.0.10", ServerType: "x999_metal", State: "RUNNING"},
			skip: `"X999"`},
		{node: scptest.Node{ID: "n-badmem", Name: "gpu-badmem", PolicyIP: "10.0.0.11", ServerType: "badmem_metal", State: "RUNNING"},
			skip: "memory_value"},
		// No server_type: the product found by id names the server type.
		{node: scptest.Node{ID: "n-notype", Name: "gpu-notype", PolicyIP: "10.0.0.12", ProductTypeID: "prod-h200", State: "RUNNING"},
			host: &provider.Host{GPUModel: "H200", GPUs: 4, GPUMemBytes: 141 * gib, CPUMemBytes: 1024 * gib,
				Fabric: fabricA.FabricID, Labels: labels("kr-west1", "POOL001-krw1a", "cluster001", "h200_half")}},
		// A null cluster_fabric_id: no fabric, though the node names one.
		{node: scptest.Node{ID: "n-nofabric", Name: "gpu-nofabric", PolicyIP: "10.0.0.13", ServerType: "b300_metal", State: "RUNNING",
			Topology: &scptest.Topology{FabricName: "cluster-lost", NodePoolID: "POOL002-krw1b", RegionID: "kr-west1"}},
			host: &provider.Host{GPUModel: "B300", GPUs: 8, GPUMemBytes: 268 * gib, CPUMemBytes: 4096 * gib,
				Labels: labels("kr-west1", "POOL002-krw1b", "cluster-lost", "b300_metal")}},
		// Strings no label value can hold as they are.
		{node: scptest.Node{ID: "n-weird", Name: "gpu-weird", PolicyIP: "10.0.0.14", ServerType: "b300 metal/v2", ProductTypeID: "prod-b300", State: "RUNNING",
			Topology: &scptest.Topology{FabricID: " 5e0c1a2b3c4d5e6f7a8b9c0d1e2f3a4b\t", FabricName: "클러스터 A/1 (prod)",
				NodePoolID: strings.Repeat("POOL-", 20), RegionID: "서울"}},
			host: &provider.Host{GPUModel: "B300", GPUs: 8, GPUMemBytes: 268 * gib, CPUMemBytes: 4096 * gib,
				Fabric: "5e0c1a2b3c4d5e6f7a8b9c0d1e2f3a4b",
				Labels: labels("", strings.Repeat("POOL-", 12)+"POO", "A-1-prod", "b300-metal-v2")}},
		// Nothing at all about where it sits.
		{node: scptest.Node{ID: "n-nowhere", Name: "gpu-nowhere", PolicyIP: "10.0.0.15", ServerType: "cpu_metal", State: "RUNNING",
			Topology: &scptest.Topology{}},
			host: &provider.Host{CPUMemBytes: 512 * gib, Labels: labels("", "", "", "cpu_metal")}},
	}
	for i := len(cases); i < 45; i++ {
		t := &fabricA
		if i >= 30 {
			t = &fabricB
		}
		cases = append(cases, nodeCase{
			node: scptest.Node{ID: fmt.Sprintf("n-%02d", i), Name: fmt.Sprintf("gpu-%02d", i),
				PolicyIP: fmt.Sprintf("10.0.1.%d", i), ServerType: "b300_metal", ProductTypeID: "prod-b300", State: "RUNNING", Topology: t},
			host: &provider.Host{GPUModel: "B300", GPUs: 8, GPUMemBytes: 268 * gib, CPUMemBytes: 4096 * gib},
		})
	}
	for _, c := range cases {
		if c.node.Topology == nil {
			c.node.Topology = &fabricA
		}
		nodes = append(nodes, c.node)
		if c.host == nil {
			skips = append(skips, provider.Skip{ExternalID: c.node.ID, Name: c.node.Name, Reason: c.skip})
			continue
		}
		h := *c.host
		h.ExternalID, h.Name, h.IP, h.State = c.node.ID, c.node.Name, c.node.PolicyIP, c.node.State
		h.Running = c.node.State == "RUNNING"
		if h.Labels == nil {
			t := c.node.Topology
			h.Fabric = t.FabricID
			h.Labels = labels("kr-west1", "POOL001-krw1a", t.FabricName, c.node.ServerType)
		}
		hosts = append(hosts, h)
	}
	return nodes, hosts, skips
}

// sigRecorder remembers every Scp-Signature the client sent, to prove
// none reaches an error.
type sigRecorder struct {
	mu   sync.Mutex
	sigs []string
}

func (r *sigRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.sigs = append(r.sigs, req.Header.Get("Scp-Signature"))
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (r *sigRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sigs...)
}

// setup starts a fake holding the catalogue and a client for it with page
// size 20 and quick retries; change adjusts the client's config.
func setup(t *testing.T, change func(*scp.Config)) (*scptest.Server, *scp.Client, *sigRecorder) {
	t.Helper()
	fake := scptest.New(t)
	nodes, _, _ := catalogue()
	fake.Lock()
	fake.Nodes, fake.Products = nodes, products
	fake.Unlock()
	rec := &sigRecorder{}
	cfg := scp.Config{
		Endpoint:   fake.URL,
		AccessKey:  fake.AccessKey,
		SecretKey:  fake.SecretKey,
		AccountID:  fake.AccountID,
		PageSize:   20,
		Retry:      provider.Retry{Attempts: 3, Base: time.Millisecond, Max: 2 * time.Second, Timeout: 2 * time.Second},
		HTTPClient: &http.Client{Transport: rec},
	}
	if change != nil {
		change(&cfg)
	}
	c, err := scp.New(cfg)
	if err != nil {
		t.Fatalf("scp.New: %v", err)
	}
	return fake, c, rec
}

func TestFetchMapsEveryNodeOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		change   func(*scp.Config)
		requests int
	}{
		{"pages of 20", nil, 1 + 3},
		{"default page size", func(c *scp.Config) { c.PageSize = 0 }, 1 + 1},
		{"page size dividing the total", func(c *scp.Config) { c.PageSize = 15 }, 1 + 3},
		{"endpoint with trailing slash", func(c *scp.Config) { c.Endpoint += "/" }, 1 + 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake, c, _ := setup(t, tt.change)
			inv, err := c.Fetch(t.Context())
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			_, wantHosts, wantSkips := catalogue()
			if !reflect.DeepEqual(inv.Hosts, wantHosts) {
				t.Errorf("hosts differ:\n%s", diffHosts(inv.Hosts, wantHosts))
			}
			checkSkips(t, inv.Skipped, wantSkips)
			fake.Lock()
			defer fake.Unlock()
			if fake.Requests != tt.requests {
				t.Errorf("fake served %d requests, want %d", fake.Requests, tt.requests)
			}
		})
	}
}

func diffHosts(got, want []provider.Host) string {
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		var g, w provider.Host
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if !reflect.DeepEqual(g, w) {
			fmt.Fprintf(&b, "  [%d] got  %+v\n       want %+v\n", i, g, w)
		}
	}
	return b.String()
}

func checkSkips(t *testing.T, got, want []provider.Skip) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("skipped %d nodes, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ExternalID != w.ExternalID || g.Name != w.Name || !strings.Contains(g.Reason, w.Reason) {
			t.Errorf("skip %d = %+v, want id %q name %q and a reason containing %q", i, g, w.ExternalID, w.Name, w.Reason)
		}
	}
}

func TestFetchSeesChangesBetweenPasses(t *testing.T) {
	t.Parallel()
	fake, c, _ := setup(t, nil)
	if _, err := c.Fetch(t.Context()); err != nil {
		t.Fatalf("first Fetch: %v", err)
	}
	fake.Lock()
	fake.Nodes = fake.Nodes[:3]
	fake.Nodes[0].State = "STOPPING"
	fake.Unlock()
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatalf("second Fetch: %v", err)
	}
	if len(inv.Hosts) != 3 || inv.Hosts[0].Running || inv.Hosts[0].State != "STOPPING" {
		t.Errorf("second pass hosts = %+v, want 3 with the first STOPPING", inv.Hosts)
	}
}

func TestFetchEmptyAccount(t *testing.T) {
	t.Parallel()
	fake, c, _ := setup(t, nil)
	fake.Lock()
	fake.Nodes = nil
	fake.Unlock()
	inv, err := c.Fetch(t.Context())
	if err != nil || len(inv.Hosts) != 0 || len(inv.Skipped) != 0 {
		t.Fatalf("Fetch = %+v, %v; want an empty inventory", inv, err)
	}
}

func TestFetchRecoversFromTransientFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fault    func(*scptest.Server)
		requests int
		minWait  time.Duration
	}{
		{"429 with Retry-After", func(s *scptest.Server) { s.RetryAfter[1] = 1 }, 1 + 3 + 1, time.Second},
		{"500 once on a middle page", func(s *scptest.Server) { s.FailPage[1] = http.StatusInternalServerError }, 1 + 3 + 1, 0},
		{"503 once on the first page", func(s *scptest.Server) { s.FailPage[0] = http.StatusServiceUnavailable }, 1 + 3 + 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake, c, _ := setup(t, nil)
			fake.Lock()
			tt.fault(fake)
			fake.Unlock()
			start := time.Now()
			inv, err := c.Fetch(t.Context())
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if took := time.Since(start); took < tt.minWait {
				t.Errorf("Fetch took %v, want at least %v (Retry-After honoured)", took, tt.minWait)
			}
			_, wantHosts, _ := catalogue()
			if len(inv.Hosts) != len(wantHosts) {
				t.Errorf("got %d hosts, want %d", len(inv.Hosts), len(wantHosts))
			}
			fake.Lock()
			defer fake.Unlock()
			if fake.Requests != tt.requests {
				t.Errorf("fake served %d requests, want %d", fake.Requests, tt.requests)
			}
		})
	}
}

func TestFetchFailsWholly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fault    func(*scptest.Server)
		change   func(*scp.Config)
		want     []string // substrings of the error
		requests int      // 0: not checked
	}{
		{
			name:     "wrong secret",
			change:   func(c *scp.Config) { c.SecretKey = "not-the-secret" },
			want:     []string{"scp: GET /v1/gpu-nodes/products: HTTP 401", "signature mismatch"},
			requests: 1, // 401 is not retried
		},
		{
			name:   "account id not signed",
			change: func(c *scp.Config) { c.AccountID = "" },
			want:   []string{"HTTP 401", "signature mismatch"},
		},
		{
			name:   "clock off by ten minutes",
			change: func(c *scp.Config) { c.Now = func() time.Time { return time.Now().Add(-10 * time.Minute) } },
			want:   []string{"HTTP 401", "5 minutes"},
		},
		{
			name:     "500 on a page every time",
			fault:    func(s *scptest.Server) { s.FailPageAlways[1] = http.StatusInternalServerError },
			want:     []string{"GET /v1/gpu-nodes page 1: HTTP 500", "injected failure"},
			requests: 1 + 1 + 3,
		},
		{
			name:  "404 on a page",
			fault: func(s *scptest.Server) { s.FailPage[2] = http.StatusNotFound },
			want:  []string{"page 2: HTTP 404"},
		},
		{
			name:   "timeout",
			fault:  func(s *scptest.Server) { s.DelayPage[1] = 2 * time.Second },
			change: func(c *scp.Config) { c.Retry.Attempts, c.Retry.Timeout = 2, 100*time.Millisecond },
			want:   []string{"page 1", "no answer within 100ms"},
		},
		{
			name:  "malformed JSON",
			fault: func(s *scptest.Server) { s.MalformedPage[2] = true },
			want:  []string{"page 2", "decoding the answer"},
		},
		{
			name:  "count that lies",
			fault: func(s *scptest.Server) { n := 50; s.ReportCount = &n },
			want:  []string{"count says 50", "only 45", "not applied"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake, c, rec := setup(t, tt.change)
			if tt.fault != nil {
				fake.Lock()
				tt.fault(fake)
				fake.Unlock()
			}
			inv, err := c.Fetch(t.Context())
			if err == nil {
				t.Fatalf("Fetch succeeded with %d hosts, want an error", len(inv.Hosts))
			}
			if !reflect.DeepEqual(inv, provider.Inventory{}) {
				t.Errorf("Fetch returned a partial inventory with its error: %+v", inv)
			}
			var perr *provider.Error
			if !errors.As(err, &perr) {
				t.Errorf("error %T is not a *provider.Error", err)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			fake.Lock()
			secrets := append(rec.all(), fake.SecretKey, fake.AccessKey, "not-the-secret")
			requests := fake.Requests
			fake.Unlock()
			for _, s := range secrets {
				if s != "" && strings.Contains(msg, s) {
					t.Errorf("error %q reveals %q", msg, s)
				}
			}
			if tt.requests != 0 && requests != tt.requests {
				t.Errorf("fake served %d requests, want %d", requests, tt.requests)
			}
		})
	}
}

func TestFetchStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	fake, c, _ := setup(t, func(c *scp.Config) { c.Retry.Timeout = 30 * time.Second })
	fake.Lock()
	fake.DelayPage[0] = 5 * time.Second
	fake.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	inv, err := c.Fetch(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch error = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Fetch took %v after cancellation, want prompt return", took)
	}
	if !reflect.DeepEqual(inv, provider.Inventory{}) {
		t.Errorf("Fetch returned an inventory with its error: %+v", inv)
	}
}
