package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
)

// fastRetry keeps the package's tests quick: tiny backoff, short timeouts.
var fastRetry = provider.Retry{Attempts: 3, Base: time.Millisecond, Max: 20 * time.Millisecond, Timeout: 2 * time.Second}

func config(endpoint string) e2e.Config {
	return e2e.Config{
		Endpoint:  endpoint,
		APIKey:    e2etest.TestAPIKey,
		Token:     e2etest.TestToken,
		ProjectID: e2etest.TestProjectID,
		Location:  e2etest.TestLocation,
		PerPage:   3,
		Retry:     fastRetry,
	}
}

// setup starts a fake with clusters and a client for it; edit changes the
// client's config first.
func setup(t *testing.T, clusters []e2etest.Cluster, edit func(*e2e.Config)) (*e2etest.Server, *e2e.Client) {
	t.Helper()
	s := e2etest.New(t)
	s.Lock()
	s.Clusters = clusters
	s.Unlock()
	cfg := config(s.URL)
	if edit != nil {
		edit(&cfg)
	}
	c, err := e2e.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func requests(s *e2etest.Server) int {
	s.Lock()
	defer s.Unlock()
	return s.Requests
}

// gpuClusters are n running single-worker 8 × H100 clusters.
func gpuClusters(n int) []e2etest.Cluster {
	var cs []e2etest.Cluster
	for i := 1; i <= n; i++ {
		cs = append(cs, e2etest.Cluster{
			ID: 100 + i, Name: fmt.Sprintf("training-cluster-%d", i), Status: "Running",
			CPU: 96, GPU: 8, MemoryGB: 1800, GPUMemoryGB: 640, GPUCardType: "H100",
			Workers: []e2etest.Worker{{ID: i, Name: fmt.Sprintf("worker-%d", i), PrivateIP: fmt.Sprintf("10.0.0.%d", i), Status: "Running"}},
		})
	}
	return cs
}

// noSecrets fails the test when err's text carries a credential or a query.
func noSecrets(t *testing.T, err error) {
	t.Helper()
	for _, s := range []string{e2etest.TestAPIKey, e2etest.TestToken, "apikey=", "?"} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error %q contains %q", err, s)
		}
	}
}

func TestFetchPages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		clusters, perPage, wantRequests int
	}{
		{clusters: 7, perPage: 3, wantRequests: 3},
		{clusters: 6, perPage: 3, wantRequests: 3}, // the last full page needs an empty one after it
		{clusters: 0, perPage: 3, wantRequests: 1},
		{clusters: 7, perPage: 0, wantRequests: 1}, // default 50
	} {
		t.Run(fmt.Sprintf("%d clusters by %d", tc.clusters, tc.perPage), func(t *testing.T) {
			t.Parallel()
			s, c := setup(t, gpuClusters(tc.clusters), func(cfg *e2e.Config) { cfg.PerPage = tc.perPage })
			inv, err := c.Fetch(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Hosts) != tc.clusters || len(inv.Skipped) != 0 {
				t.Errorf("got %d hosts, %d skipped; want %d, 0", len(inv.Hosts), len(inv.Skipped), tc.clusters)
			}
			for i, h := range inv.Hosts {
				if want := fmt.Sprintf("%d/%d", 101+i, i+1); h.ExternalID != want {
					t.Errorf("host %d is %q, want %q", i, h.ExternalID, want)
				}
			}
			if got := requests(s); got != tc.wantRequests {
				t.Errorf("%d requests, want %d", got, tc.wantRequests)
			}
		})
	}
}

func TestFetchMapping(t *testing.T) {
	t.Parallel()
	clusters := []e2etest.Cluster{
		{
			ID: 101, Name: "h100", Status: "Running",
			CPU: 96, GPU: 8, MemoryGB: 1800, GPUMemoryGB: 640, GPUCardType: "H100",
			Workers: []e2etest.Worker{
				{ID: 1, Name: "h100-w1", PrivateIP: "10.0.0.1", Status: "Running"},
				{ID: "w-2", Name: "h100-w2", PrivateIP: "10.0.0.2"},                   // no worker status: the cluster's
				{ID: 3, Name: "h100-w3", PrivateIP: "10.0.0.3", Status: "Restarting"}, // worker not running
				{ID: 4, Name: "h100-w4", Status: "Running"},                           // no address
				{Name: "h100-w5", PrivateIP: "10.0.0.5", Status: "Running"},           // no id: the name
			},
		},
		{
			// The seed's SKU.
			ID: 102, Name: "cpu", Status: "Running", CPU: 8, MemoryGB: 32,
			Workers: []e2etest.Worker{{ID: 7, Name: "cpu-w1", PrivateIP: "10.0.1.1", Status: "Running"}},
		},
		{
			ID: 103, Name: "stopped", Status: "Stopped",
			CPU: 16, GPU: 2, MemoryGB: 200, GPUMemoryGB: 96, GPUCardType: "L40S",
			Workers: []e2etest.Worker{{ID: 8, Name: "l40s-w1", PrivateIP: "10.0.2.1"}},
		},
		{ID: 104, Name: "creating", Status: "Creating", CPU: 96, GPU: 8, MemoryGB: 1800,
			GPUMemoryGB: 640, GPUCardType: "H100", NoOfNodes: 2},
		{
			ID: 105, Name: "no-card", Status: "Running", CPU: 96, GPU: 8, MemoryGB: 1800, GPUMemoryGB: 640,
			Workers: []e2etest.Worker{{ID: 9, Name: "nocard-w1", PrivateIP: "10.0.3.1", Status: "Running"}},
		},
		{
			ID: 106, Name: "partial", Status: "Running", CPU: 8, MemoryGB: 32, NoOfNodes: 3,
			Workers: []e2etest.Worker{{ID: 10, Name: "partial-w1", PrivateIP: "10.0.4.1", Status: "Running"}},
		},
	}
	_, c := setup(t, clusters, nil)
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const gib = provider.GiB
	h100 := func(id, name, ip, state string, running bool) provider.Host {
		return provider.Host{ExternalID: id, Name: name, IP: ip, State: state, Running: running,
			GPUModel: "H100", GPUs: 8, GPUMemBytes: 80 * gib, CPUMemBytes: 1800 * gib,
			Fabric: "cluster-101", Labels: labels("Delhi", "h100", "GDC3.8xH100-640GB")}
	}
	want := provider.Inventory{
		Hosts: []provider.Host{
			h100("101/1", "h100-w1", "10.0.0.1", "Running", true),
			h100("101/w-2", "h100-w2", "10.0.0.2", "Running", true),
			h100("101/3", "h100-w3", "10.0.0.3", "Restarting", false),
			h100("101/h100-w5", "h100-w5", "10.0.0.5", "Running", true),
			{ExternalID: "102/7", Name: "cpu-w1", IP: "10.0.1.1", State: "Running", Running: true, CPUMemBytes: 32 * gib,
				Fabric: "cluster-102", Labels: labels("Delhi", "cpu", "C3.32GB")},
			{ExternalID: "103/8", Name: "l40s-w1", IP: "10.0.2.1", State: "Stopped", Running: false,
				GPUModel: "L40S", GPUs: 2, GPUMemBytes: 48 * gib, CPUMemBytes: 200 * gib,
				Fabric: "cluster-103", Labels: labels("Delhi", "stopped", "GDC3.2xL40S-96GB")},
			{ExternalID: "106/10", Name: "partial-w1", IP: "10.0.4.1", State: "Running", Running: true, CPUMemBytes: 32 * gib,
				Fabric: "cluster-106", Labels: labels("Delhi", "partial", "C3.32GB")},
		},
		Skipped: []provider.Skip{
			{ExternalID: "101/4", Name: "h100-w4", Reason: "worker has no address"},
			{ExternalID: "104", Name: "creating", Reason: "cluster reports 2 nodes but no worker details"},
			{ExternalID: "105/9", Name: "nocard-w1", Reason: "GPU SKU without gpu_card_type"},
			{ExternalID: "106", Name: "partial", Reason: "cluster reports 3 nodes but details for only 1"},
		},
	}
	diffInventory(t, inv, want)
}

func diffInventory(t *testing.T, got, want provider.Inventory) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	for i := range max(len(got.Hosts), len(want.Hosts)) {
		var g, w provider.Host
		if i < len(got.Hosts) {
			g = got.Hosts[i]
		}
		if i < len(want.Hosts) {
			w = want.Hosts[i]
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("host %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	for i := range max(len(got.Skipped), len(want.Skipped)) {
		var g, w provider.Skip
		if i < len(got.Skipped) {
			g = got.Skipped[i]
		}
		if i < len(want.Skipped) {
			w = want.Skipped[i]
		}
		if g != w {
			t.Errorf("skip %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

// TestFetchWorkerFieldNames covers the undocumented worker_nodes fields:
// the other names for address and name, and ids as strings or numbers.
func TestFetchWorkerFieldNames(t *testing.T) {
	t.Parallel()
	body := `{"code":200,"errors":{},"message":"Success","data":[{
		"id": "201", "name": "alt", "status": "Running", "no_of_nodes": 4,
		"sku_details": {"specs": {"cpu": 8, "gpu": "1", "memory": 64, "gpu_memory": 24, "gpu_card_type": "L4"}},
		"worker_nodes": [
			{"id": 1, "node_name": "n1", "ip_address": "10.1.0.1"},
			{"id": 2, "hostname": "n2", "private_ip": null, "ip": "10.1.0.2", "status": "Running"},
			{"node_name": "n3", "private_ip": "", "node_ip": "10.1.0.3", "status": "NotReady"},
			"n4"
		]}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	c, err := e2e.New(config(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// No plan and no SKU name: the location is the one listed.
	l4 := func(id, name, ip, state string, running bool) provider.Host {
		return provider.Host{ExternalID: id, Name: name, IP: ip, State: state, Running: running,
			GPUModel: "L4", GPUs: 1, GPUMemBytes: 24 * provider.GiB, CPUMemBytes: 64 * provider.GiB,
			Fabric: "cluster-201", Labels: labels("Delhi", "alt", "")}
	}
	diffInventory(t, inv, provider.Inventory{
		Hosts: []provider.Host{
			l4("201/1", "n1", "10.1.0.1", "Running", true),
			l4("201/2", "n2", "10.1.0.2", "Running", true),
			l4("201/n3", "n3", "10.1.0.3", "NotReady", false),
		},
		Skipped: []provider.Skip{{ExternalID: "201/#3", Reason: "worker entry is not an object"}},
	})
}

// TestFetchSeed reads the seed's own cluster object: a running CPU cluster
// with one node and no worker details.
func TestFetchSeed(t *testing.T) {
	t.Parallel()
	seed, err := os.ReadFile("testdata/cluster_seed.json")
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(seed, &env); err != nil {
		t.Fatal(err)
	}
	env["data"] = json.RawMessage("[" + string(env["data"]) + "]")
	list, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(list)
	}))
	t.Cleanup(srv.Close)
	c, err := e2e.New(config(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	diffInventory(t, inv, provider.Inventory{Skipped: []provider.Skip{{
		ExternalID: "101", Name: "training-cluster-010125103045",
		Reason: "cluster reports 1 nodes but no worker details",
	}}})
}

func TestFetchEndpointWithBasePath(t *testing.T) {
	t.Parallel()
	_, c := setup(t, gpuClusters(1), func(cfg *e2e.Config) { cfg.Endpoint += "/myaccount/api/v1/gpu/" })
	inv, err := c.Fetch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Hosts) != 1 {
		t.Errorf("got %d hosts, want 1", len(inv.Hosts))
	}
}

func TestFetchRejected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		edit       func(*e2e.Config)
		wantStatus int
		wantText   []string
	}{
		{"bad token", func(c *e2e.Config) { c.Token = "wrong-token-123" }, 401,
			[]string{"Authentication failed: invalid API key or token"}},
		{"bad key", func(c *e2e.Config) { c.APIKey = "wrong-key-456" }, 401,
			[]string{"Authentication failed: invalid API key or token"}},
		{"other project", func(c *e2e.Config) { c.ProjectID = "999" }, 400,
			[]string{"Bad Request", "You do not have access to this project."}},
		{"other location", func(c *e2e.Config) { c.Location = "Chennai" }, 400,
			[]string{"Bad Request", "Select a valid location."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c := setup(t, gpuClusters(2), tc.edit)
			inv, err := c.Fetch(t.Context())
			if err == nil {
				t.Fatalf("got %+v, want an error", inv)
			}
			var pe *provider.Error
			if !errors.As(err, &pe) || pe.Status != tc.wantStatus {
				t.Errorf("error %#v, want a *provider.Error with status %d", err, tc.wantStatus)
			}
			for _, want := range tc.wantText {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			noSecrets(t, err)
			for _, secret := range []string{"wrong-token-123", "wrong-key-456"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q contains %q", err, secret)
				}
			}
			if len(inv.Hosts) != 0 || len(inv.Skipped) != 0 {
				t.Errorf("got a partial inventory %+v", inv)
			}
			if got := requests(s); got != 1 {
				t.Errorf("%d requests, want 1: 4xx is not retried", got)
			}
		})
	}
}

// TestErrorsHideSecrets covers a provider that echoes the key in its
// errors, and a transport failure, whose net/http error quotes the URL.
func TestErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"code":403,"errors":{"apikey":"%s is suspended","auth":%q},"message":"Forbidden"}`,
			r.URL.Query().Get("apikey"), r.Header.Get("Authorization"))
	}))
	t.Cleanup(echo.Close)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for name, endpoint := range map[string]string{"echo": echo.URL, "closed": closed.URL} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := config(endpoint)
			cfg.Retry.Attempts = 1
			c, err := e2e.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Fetch(t.Context())
			if err == nil {
				t.Fatal("no error")
			}
			noSecrets(t, err)
			if name == "echo" && !strings.Contains(err.Error(), "[redacted] is suspended") {
				t.Errorf("error %q lost the provider's message", err)
			}
		})
	}
}

func TestFetchRetries(t *testing.T) {
	t.Parallel()
	t.Run("429 with Retry-After", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t, gpuClusters(7), func(cfg *e2e.Config) { cfg.Retry.Max = 5 * time.Second })
		s.Lock()
		s.RetryAfter[2] = 1
		s.Unlock()
		start := time.Now()
		inv, err := c.Fetch(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.Hosts) != 7 {
			t.Errorf("got %d hosts, want 7", len(inv.Hosts))
		}
		// The backoff alone would be a millisecond.
		if elapsed := time.Since(start); elapsed < time.Second {
			t.Errorf("took %s; Retry-After: 1 was not honoured", elapsed)
		}
		if got := requests(s); got != 4 {
			t.Errorf("%d requests, want 4", got)
		}
	})
	t.Run("500 once on a middle page", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t, gpuClusters(7), nil)
		s.Lock()
		s.FailPage[2] = http.StatusInternalServerError
		s.Unlock()
		inv, err := c.Fetch(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.Hosts) != 7 {
			t.Errorf("got %d hosts, want 7", len(inv.Hosts))
		}
		if got := requests(s); got != 4 {
			t.Errorf("%d requests, want 4", got)
		}
	})
	t.Run("500 every time", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"code":500,"errors":{},"message":"Internal Server Error"}`)
		}))
		t.Cleanup(srv.Close)
		c, err := e2e.New(config(srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Fetch(t.Context())
		var pe *provider.Error
		if !errors.As(err, &pe) || pe.Status != 500 || pe.Op != "GET /distributed_jobs_v2/cluster/ page 1" {
			t.Errorf("error %#v, want a *provider.Error for page 1 with status 500", err)
		}
		if got := calls.Load(); got != int32(fastRetry.Attempts) {
			t.Errorf("%d calls, want %d", got, fastRetry.Attempts)
		}
	})
}

func TestFetchFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		fault    func(s *e2etest.Server)
		wantText string
	}{
		{"timeout", func(s *e2etest.Server) { s.DelayPage[2] = time.Minute }, "no answer within 100ms"},
		{"malformed JSON", func(s *e2etest.Server) { s.MalformedPage[3] = true }, "malformed answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c := setup(t, gpuClusters(7), func(cfg *e2e.Config) {
				cfg.Retry.Timeout = 100 * time.Millisecond
				cfg.Retry.Attempts = 2
			})
			s.Lock()
			tc.fault(s)
			s.Unlock()
			inv, err := c.Fetch(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantText)
			}
			noSecrets(t, err)
			if len(inv.Hosts) != 0 || len(inv.Skipped) != 0 {
				t.Errorf("got a partial inventory %+v", inv)
			}
		})
	}
}

func TestFetchBadAnswers(t *testing.T) {
	t.Parallel()
	full := `{"code":200,"errors":{},"message":"Success","data":[` +
		`{"id":1,"worker_nodes":[]},{"id":2,"worker_nodes":[]},{"id":3,"worker_nodes":[]}]}`
	for _, tc := range []struct {
		name, body, wantText string
	}{
		{"page_no ignored", full, "ignore page_no"},
		{"code in the envelope", `{"code":400,"errors":{"per_page":"too large"},"message":"Bad Request"}`,
			`answer code 400: Bad Request: {"per_page":"too large"}`},
		{"data not a list", `{"code":200,"data":{"id":1},"errors":{},"message":"Success"}`, "data is not a list"},
		{"wrong type", `{"code":200,"data":[{"id":1,"sku_details":{"specs":{"gpu":"eight"}}}]}`, "malformed answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			c, err := e2e.New(config(srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			inv, err := c.Fetch(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("got %+v, %v; want an error containing %q", inv, err, tc.wantText)
			}
		})
	}
}

func TestFetchCanceled(t *testing.T) {
	t.Parallel()
	s, c := setup(t, gpuClusters(7), func(cfg *e2e.Config) { cfg.Retry.Timeout = time.Minute })
	s.Lock()
	s.DelayPage[2] = time.Minute
	s.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Fetch(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("took %s to notice the cancel", elapsed)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		edit     func(*e2e.Config)
		wantText string // "" for no error
	}{
		{"ok", func(*e2e.Config) {}, ""},
		{"relative", func(c *e2e.Config) { c.Endpoint = "/myaccount/api/v1/gpu" }, "absolute http(s) URL"},
		{"no scheme", func(c *e2e.Config) { c.Endpoint = "api.e2enetworks.com" }, "absolute http(s) URL"},
		{"ftp", func(c *e2e.Config) { c.Endpoint = "ftp://api.e2enetworks.com" }, "absolute http(s) URL"},
		{"unparsable", func(c *e2e.Config) { c.Endpoint = "https://a b.com/%zz" }, "absolute http(s) URL"},
		{"query", func(c *e2e.Config) { c.Endpoint = "https://api.e2enetworks.com/gpu?apikey=x" }, "query"},
		{"user info", func(c *e2e.Config) { c.Endpoint = "https://u:p@api.e2enetworks.com/gpu" }, "user info"},
		{"no key", func(c *e2e.Config) { c.APIKey = "" }, "missing API key"},
		{"nothing", func(c *e2e.Config) { c.APIKey, c.Token, c.ProjectID, c.Location = "", " ", "", "" },
			"missing API key, token, project id, location"},
		{"negative page", func(c *e2e.Config) { c.PerPage = -1 }, "per page"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := config("https://api.e2enetworks.com/myaccount/api/v1/gpu")
			tc.edit(&cfg)
			c, err := e2e.New(cfg)
			switch {
			case tc.wantText == "" && err != nil:
				t.Fatal(err)
			case tc.wantText == "":
				if c.Name() != "e2e" {
					t.Errorf("Name() = %q", c.Name())
				}
			case err == nil || !strings.Contains(err.Error(), tc.wantText):
				t.Errorf("error %v, want one containing %q", err, tc.wantText)
			default:
				noSecrets(t, err)
			}
		})
	}
}
