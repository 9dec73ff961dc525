package scptest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

// send makes a signed GET of path on fake; change may spoil the headers.
func send(t *testing.T, fake *scptest.Server, path string, change func(http.Header)) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, fake.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
	req.Header.Set("Scp-Accesskey", fake.AccessKey)
	req.Header.Set("Scp-Signature", scp.Sign("GET", req.URL.String(), ts, fake.AccessKey, fake.AccountID, fake.SecretKey))
	req.Header.Set("Scp-Timestamp", ts)
	req.Header.Set("Scp-ClientType", "Openapi")
	req.Header.Set("Scp-Api-Version", "multinodegpucluster 1.2")
	if change != nil {
		change(req.Header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("GET %s: answer is not JSON: %q", path, b)
	}
	return resp.StatusCode, body
}

func detail(body map[string]any) string {
	errs, _ := body["errors"].([]any)
	if len(errs) != 1 {
		return fmt.Sprintf("no single error in %v", body)
	}
	e, _ := errs[0].(map[string]any)
	s, _ := e["detail"].(string)
	return s
}

func TestServerRefuses(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	tests := []struct {
		name   string
		path   string
		change func(http.Header)
		status int
		detail string
	}{
		{"missing signature", "/v1/gpu-nodes", func(h http.Header) { h.Del("Scp-Signature") }, 401, "Scp-Signature"},
		{"missing client type", "/v1/gpu-nodes", func(h http.Header) { h.Del("Scp-ClientType") }, 401, "Scp-ClientType"},
		{"old API version", "/v1/gpu-nodes", func(h http.Header) { h.Set("Scp-Api-Version", "multinodegpucluster 1.1") }, 401, "Scp-Api-Version"},
		{"other access key", "/v1/gpu-nodes", func(h http.Header) { h.Set("Scp-Accesskey", "someone-else") }, 401, "access key"},
		{"stale timestamp", "/v1/gpu-nodes", func(h http.Header) {
			h.Set("Scp-Timestamp", strconv.FormatInt(time.Now().Add(-6*time.Minute).UnixMilli(), 10))
		}, 401, "5 minutes"},
		{"signature of another URL", "/v1/gpu-nodes?page=1", func(h http.Header) {
			ts := h.Get("Scp-Timestamp")
			h.Set("Scp-Signature", scp.Sign("GET", "http://elsewhere/v1/gpu-nodes?page=1", ts, scptest.AccessKey, scptest.AccountID, scptest.SecretKey))
		}, 401, "signature mismatch"},
		{"unknown path", "/v1/gpu-nodes/n1/interfaces", nil, 404, "no such resource"},
		{"unknown fabric", "/v1/cluster-fabrics/nope", nil, 404, "not found"},
		{"fabric page not a number", "/v1/cluster-fabrics?page=x", nil, 400, "page"},
		{"unknown node", "/v1/gpu-nodes/nope", nil, 404, "not found"},
		{"size zero", "/v1/gpu-nodes?size=0", nil, 400, "size"},
		{"page not a number", "/v1/gpu-nodes?page=x", nil, 400, "page"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := send(t, fake, tt.path, tt.change)
			if status != tt.status || !strings.Contains(detail(body), tt.detail) {
				t.Errorf("GET %s = %d %v, want %d with a detail containing %q", tt.path, status, body, tt.status, tt.detail)
			}
		})
	}
}

func TestServerPages(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	fake.Lock()
	for i := range 25 {
		fake.Nodes = append(fake.Nodes, scptest.Node{ID: fmt.Sprintf("n%d", i), State: "RUNNING"})
	}
	fake.FailPage[1] = http.StatusBadGateway
	fake.Unlock()

	tests := []struct {
		path   string
		status int
		ids    int
	}{
		{"/v1/gpu-nodes", 200, 20}, // default size 20, page 0
		{"/v1/gpu-nodes?size=20&page=1", 502, 0},
		{"/v1/gpu-nodes?size=20&page=1", 200, 5}, // FailPage is used up
		{"/v1/gpu-nodes?size=10&page=3", 200, 0},
	}
	for _, tt := range tests {
		status, body := send(t, fake, tt.path, nil)
		if status != tt.status {
			t.Fatalf("GET %s = %d %v, want %d", tt.path, status, body, tt.status)
		}
		if status != 200 {
			continue
		}
		nodes, ok := body["gpu_nodes"].([]any)
		if !ok || len(nodes) != tt.ids || body["count"] != float64(25) {
			t.Errorf("GET %s = %v, want %d nodes and count 25", tt.path, body, tt.ids)
		}
	}
	status, body := send(t, fake, "/v1/gpu-nodes/n7", nil)
	if status != 200 || body["id"] != "n7" || body["state"] != "RUNNING" {
		t.Errorf("GET /v1/gpu-nodes/n7 = %d %v", status, body)
	}
	fake.Lock()
	defer fake.Unlock()
	if fake.Requests != 5 {
		t.Errorf("Requests = %d, want 5", fake.Requests)
	}
}
