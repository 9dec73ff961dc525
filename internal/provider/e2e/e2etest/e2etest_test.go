package e2etest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
)

func get(t *testing.T, s *e2etest.Server, path string, query url.Values) (int, map[string]any) {
	t.Helper()
	q := url.Values{
		"apikey": {s.APIKey}, "project_id": {s.ProjectID}, "location": {s.Location},
	}
	for k, v := range query {
		q[k] = v
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL+path+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// keys lists every object key path in v, looking into the first element of
// lists; null leaves are kept, so nullable fields count.
func keys(v any, prefix string, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			out[prefix+"."+k] = true
			keys(x, prefix+"."+k, out)
		}
	case []any:
		if len(v) > 0 {
			keys(v[0], prefix+"[]", out)
		}
	}
}

// TestClusterShape checks that the fake's cluster has every field the
// seed's example has.
func TestClusterShape(t *testing.T) {
	t.Parallel()
	seed, err := os.ReadFile("../testdata/cluster_seed.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(seed, &want); err != nil {
		t.Fatal(err)
	}
	s := e2etest.New(t)
	s.Lock()
	s.Clusters = []e2etest.Cluster{{
		ID: 101, Name: "training-cluster-010125103045", Status: "Running", CPU: 8, MemoryGB: 32,
		Workers: []e2etest.Worker{{ID: 1, Name: "w1", PrivateIP: "10.0.0.1", Status: "Running"}},
	}}
	s.Unlock()
	status, got := get(t, s, "/distributed_jobs_v2/cluster/101/", nil)
	if status != http.StatusOK {
		t.Fatalf("status %d: %v", status, got)
	}
	wantKeys, gotKeys := map[string]bool{}, map[string]bool{}
	keys(want["data"], "", wantKeys)
	keys(got["data"], "", gotKeys)
	for k := range wantKeys {
		if !gotKeys[k] {
			t.Errorf("the fake's cluster lacks %s", k)
		}
	}
	for _, k := range []string{".worker_nodes[].id", ".worker_nodes[].name", ".worker_nodes[].private_ip", ".worker_nodes[].status"} {
		if !gotKeys[k] {
			t.Errorf("the fake's cluster lacks %s", k)
		}
	}
	if got["message"] != "Success" || got["code"] != 200.0 {
		t.Errorf("envelope %v", got)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	s := e2etest.New(t)
	s.Lock()
	for _, id := range []int{1, 2, 3, 4, 5} {
		s.Clusters = append(s.Clusters, e2etest.Cluster{ID: id, Status: "Running"})
	}
	s.Unlock()
	var ids []float64
	for _, page := range []string{"1", "2", "3"} {
		status, body := get(t, s, "/myaccount/api/v1/gpu/distributed_jobs_v2/cluster/",
			url.Values{"page_no": {page}, "per_page": {"2"}})
		if status != http.StatusOK {
			t.Fatalf("page %s: status %d: %v", page, status, body)
		}
		for _, c := range body["data"].([]any) {
			ids = append(ids, c.(map[string]any)["id"].(float64))
		}
	}
	if want := []float64{1, 2, 3, 4, 5}; !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
}

func TestRejects(t *testing.T) {
	t.Parallel()
	s := e2etest.New(t)
	for _, tc := range []struct {
		name       string
		path       string
		query      url.Values
		wantStatus int
		wantText   string
	}{
		{"bad key", "/distributed_jobs_v2/cluster/", url.Values{"apikey": {"x"}, "page_no": {"1"}, "per_page": {"2"}}, 401, "invalid API key"},
		{"bad project", "/distributed_jobs_v2/cluster/", url.Values{"project_id": {"2"}, "page_no": {"1"}, "per_page": {"2"}}, 400, "project"},
		{"no paging", "/distributed_jobs_v2/cluster/", nil, 400, "page_no"},
		{"unknown cluster", "/distributed_jobs_v2/cluster/9/", nil, 404, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := get(t, s, tc.path, tc.query)
			raw, _ := json.Marshal(body)
			if status != tc.wantStatus || !strings.Contains(string(raw), tc.wantText) || body["code"] != float64(tc.wantStatus) {
				t.Errorf("status %d, body %s; want %d with %q", status, raw, tc.wantStatus, tc.wantText)
			}
		})
	}
}
