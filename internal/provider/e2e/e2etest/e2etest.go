// Package e2etest is a fake E2E Networks TIR API for tests: the training
// cluster list and get calls with the seed's JSON shapes, the provider's
// credential checks and failures to order.
//
// The server answers at its root and under /myaccount/api/v1/gpu, so a
// client's Endpoint may be either s.URL or s.URL+"/myaccount/api/v1/gpu".
package e2etest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The credentials New presets.
const (
	TestAPIKey    = "e2e-test-apikey-7f3a9c"
	TestToken     = "e2e-test-token-4b81d2"
	TestProjectID = "10001"
	TestLocation  = "Delhi"
)

const (
	basePath    = "/myaccount/api/v1/gpu"
	clusterPath = "/distributed_jobs_v2/cluster/"
)

// Worker is one worker_nodes entry.
type Worker struct {
	ID        any    // int or string; nil is sent as null
	Name      string // "" is sent as ""
	PrivateIP string // "" is sent as ""
	Status    string // "" is sent as ""
}

// Cluster is one training cluster. Status is sent as given: set it to
// "Running" for a schedulable cluster.
type Cluster struct {
	ID           int
	Name, Status string
	// The SKU's specs, per node; GPUMemoryGB is the node's total (640 for
	// 8 × H100 80 GB). GPUCardType "" is sent as null.
	CPU, GPU, MemoryGB, GPUMemoryGB int
	GPUCardType                     string
	Workers                         []Worker
	NoOfNodes                       int // 0 → len(Workers)
	// SKUName is sku_details.specs.name; "" means one made of the specs,
	// like "GDC3.8xH100-640GB" or "C3.32GB".
	SKUName string
	// Location is sku_details.plan.location; "" means the server's.
	Location string
}

// Server is the fake. Change its exported fields between Lock and Unlock
// once it is serving.
type Server struct {
	*httptest.Server

	// Every request must carry these; New presets the Test* constants.
	APIKey, Token, ProjectID, Location string

	Clusters []Cluster

	// Failures by list page (page_no). FailPage answers that status with
	// the error envelope once, RetryAfter answers 429 with Retry-After once;
	// each entry is removed when used. DelayPage holds every answer for that
	// page back (until the client gives up), MalformedPage truncates every
	// answer for that page; delete the entry to stop them.
	FailPage      map[int]int
	RetryAfter    map[int]int
	DelayPage     map[int]time.Duration
	MalformedPage map[int]bool

	// FloodNameBytes, when positive, makes every list page a full one of
	// new Running clusters (one 8 × H100 worker each) whose names are
	// that many bytes long: a hostile provider whose list never ends
	// (Clusters is not read). The answer is written as it goes, never
	// held whole.
	FloodNameBytes int

	// Requests counts every request received, good or bad.
	Requests int

	mu sync.Mutex
}

// New starts a fake with the test credentials, no clusters and no failures;
// it is closed when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		APIKey:        TestAPIKey,
		Token:         TestToken,
		ProjectID:     TestProjectID,
		Location:      TestLocation,
		FailPage:      map[int]int{},
		RetryAfter:    map[int]int{},
		DelayPage:     map[int]time.Duration{},
		MalformedPage: map[int]bool{},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// Lock stops the server's handlers while a test changes its fields.
func (s *Server) Lock() { s.mu.Lock() }

// Unlock lets the handlers run again.
func (s *Server) Unlock() { s.mu.Unlock() }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, basePath)
	q := r.URL.Query()
	list := path == clusterPath
	page := 0
	if list {
		page, _ = strconv.Atoi(q.Get("page_no"))
	}

	s.mu.Lock()
	s.Requests++
	delay := s.DelayPage[page]
	s.mu.Unlock()
	if list && delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Method != http.MethodGet:
		writeError(w, http.StatusMethodNotAllowed, nil, "Method Not Allowed")
		return
	case q.Get("apikey") != s.APIKey || r.Header.Get("Authorization") != "Bearer "+s.Token:
		writeError(w, http.StatusUnauthorized, nil, "Authentication failed: invalid API key or token")
		return
	case q.Get("project_id") != s.ProjectID:
		writeError(w, http.StatusBadRequest,
			map[string]any{"project_id": []string{"You do not have access to this project."}}, "Bad Request")
		return
	case q.Get("location") != s.Location:
		writeError(w, http.StatusBadRequest,
			map[string]any{"location": []string{"Select a valid location."}}, "Bad Request")
		return
	}

	if !list {
		idText, ok := strings.CutPrefix(path, clusterPath)
		idText, ok2 := strings.CutSuffix(idText, "/")
		id, err := strconv.Atoi(idText)
		if !ok || !ok2 || err != nil {
			writeError(w, http.StatusNotFound, nil, "Not Found")
			return
		}
		for _, c := range s.Clusters {
			if c.ID == id {
				writeJSON(w, http.StatusOK, map[string]any{
					"code": 200, "data": clusterJSON(c, s.ProjectID, s.Location), "errors": map[string]any{}, "message": "Success",
				})
				return
			}
		}
		writeError(w, http.StatusNotFound, nil, "Cluster not found")
		return
	}

	perPage, err := strconv.Atoi(q.Get("per_page"))
	if page < 1 || err != nil || perPage < 1 {
		writeError(w, http.StatusBadRequest,
			map[string]any{"page_no": []string{"page_no and per_page must be positive integers."}}, "Bad Request")
		return
	}
	if secs, ok := s.RetryAfter[page]; ok {
		delete(s.RetryAfter, page)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		writeError(w, http.StatusTooManyRequests, nil, "Too Many Requests")
		return
	}
	if status, ok := s.FailPage[page]; ok {
		delete(s.FailPage, page)
		writeError(w, status, nil, http.StatusText(status))
		return
	}
	if s.MalformedPage[page] {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"code":200,"data":[{"id":1,"name":"training-clus`)
		return
	}
	if s.FloodNameBytes > 0 {
		flood(w, perPage, page, s.FloodNameBytes, s.Location)
		return
	}
	data := []any{}
	for i := (page - 1) * perPage; i < len(s.Clusters) && i < page*perPage; i++ {
		data = append(data, clusterJSON(s.Clusters[i], s.ProjectID, s.Location))
	}
	writeJSON(w, http.StatusOK, map[string]any{"code": 200, "data": data, "errors": map[string]any{}, "message": "Success"})
}

// clusterJSON is c in the seed's shape, filled with plausible values.
func clusterJSON(c Cluster, projectID, location string) map[string]any {
	nodes := c.NoOfNodes
	if nodes == 0 {
		nodes = len(c.Workers)
	}
	workers := []any{}
	for _, w := range c.Workers {
		workers = append(workers, map[string]any{
			"id": w.ID, "name": w.Name, "private_ip": w.PrivateIP, "status": w.Status,
		})
	}
	var cardType any
	skuName, series, skuType := fmt.Sprintf("C3.%dGB", c.MemoryGB), "CPU", fmt.Sprintf("C3-%dGB", c.MemoryGB)
	if c.GPUCardType != "" {
		cardType = c.GPUCardType
	}
	if c.GPU > 0 {
		skuName = fmt.Sprintf("GDC3.%dx%s-%dGB", c.GPU, c.GPUCardType, c.GPUMemoryGB)
		series, skuType = "GPU", fmt.Sprintf("GDC3-%s", c.GPUCardType)
	}
	if c.SKUName != "" {
		skuName = c.SKUName
	}
	if c.Location != "" {
		location = c.Location
	}
	project, _ := strconv.Atoi(projectID)
	created := time.Date(2025, 1, 15, 10, 30, 0, 0, time.UTC).Add(time.Duration(c.ID) * time.Hour)
	return map[string]any{
		"id":   c.ID,
		"name": c.Name,
		"created_by": map[string]any{
			"id": 1001, "name": "John Doe", "email": "user@example.com", "username": "user@example.com",
			"is_primary_contact": true, "currency": "INR", "is_suspended": false,
		},
		"no_of_nodes":        nodes,
		"created_at":         created.Format(time.RFC3339),
		"private_cloud_id":   nil,
		"private_cloud_name": nil,
		"sku_details": map[string]any{
			"specs": map[string]any{
				"sku_id": 100 + c.GPU, "name": skuName, "series": series,
				"cpu": c.CPU, "gpu": c.GPU, "memory": c.MemoryGB, "ephemeral_storage": 0,
				"gpu_memory": c.GPUMemoryGB, "is_free": false, "is_active": true,
				"local_storage_in_gb": 0, "sku_type": skuType, "gpu_card_type": cardType,
				"category": "distributed_job", "variant": "e2e", "no_of_nodes": nodes,
			},
			"plan": map[string]any{
				"sku_item_price_id": 645, "sku_type": "hourly", "committed_days": 0,
				"unit_price": 12.3, "currency": "INR", "is_active": true,
				"description": nil, "location": location,
			},
		},
		"total_gpu":              c.GPU * nodes,
		"total_cpu":              c.CPU * nodes,
		"total_memory":           fmt.Sprintf("%d GB", c.MemoryGB*nodes),
		"available_gpu":          0,
		"available_cpu":          0,
		"available_memory":       "0 GB",
		"worker_nodes":           workers,
		"has_local_storage":      false,
		"local_storage_per_node": nil,
		"status":                 c.Status,
		"image_pull_policy":      "IfNotPresent",
		"image_version": map[string]any{
			"id": 2, "version": "v2-slurm25.11-ubuntu24.04", "description": "", "tags": []string{},
			"name": "Ubuntu Slurm", "slug_name": "ubuntu-slurm", "framework": "Slurm", "is_internal": false,
		},
		"ssh_keys": []any{map[string]any{
			"pk": 1001, "label": "my-ssh-key", "ssh_key": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAB... user@example.com",
		}},
		"ssh_public_ip":   "203.0.113.10",
		"has_floating_ip": true,
		"reserve_ip":      []any{},
		"clone_data": map[string]any{
			"name": c.Name, "sku_id": 100 + c.GPU, "project_id": project, "no_of_nodes": nodes,
			"ssh_key_ids": []int{1001}, "script_added": false,
			"pfs_mount_list": []any{}, "sfs_mount_list": []any{},
			"image_version_id": 2, "lifecycle_script": "", "security_group_id": 1001,
			"sku_item_price_id": 645, "dataset_mount_list": []any{},
		},
	}
}

// writeError answers with the provider's error envelope.
func writeError(w http.ResponseWriter, status int, errs map[string]any, message string) {
	if errs == nil {
		errs = map[string]any{}
	}
	writeJSON(w, status, map[string]any{"code": status, "errors": errs, "message": message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
