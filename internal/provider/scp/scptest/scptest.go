// Package scptest is a fake of Samsung SDS Cloud's Multi-node GPU Cluster
// API v1.2, written from the seed document (003) and PROVIDERS.md, for
// tests of the scp client and of whatever syncs from it.
//
// It checks every request as the real API would (headers, API version,
// timestamp freshness and the HMAC signature, computed here on its own
// and not with scp.Sign) and serves:
//
//	GET /v1/gpu-nodes?size=&page=          {"count": N, "gpu_nodes": [...]}
//	GET /v1/gpu-nodes/{id}                 one GPU node, or 404
//	GET /v1/gpu-nodes/products             {"products": [...]}
//	GET /v1/cluster-fabrics?size=&page=    {"count": N, "cluster_fabrics": [...]},
//	    also filtered by cluster_fabric_name, node_pool_id and state
//	GET /v1/cluster-fabrics/{id}           one cluster fabric, or 404
//
// Cluster fabrics are not stored apart: they are the nodes' topology
// grouped by fabric id, in the order of their first node, so the two
// calls always agree. Nodes without a Topology of their own get a
// generated one (Server.HostsPerFabric).
//
// Errors use the API's envelope {"errors":[{"detail": "..."}]}.
package scptest

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fixed credentials New presets; tests may change them under Lock.
const (
	AccessKey = "scptest-access-key"
	SecretKey = "scptest-secret-key"
	AccountID = "f5c8e56a4d9b49a8bd89e14758a32d53"
)

// APIVersion is the Scp-Api-Version the fake requires.
const APIVersion = "multinodegpucluster 1.2"

// MaxClockSkew is how far Scp-Timestamp may be from the fake's clock.
const MaxClockSkew = 5 * time.Minute

// Node is one GPU node.
type Node struct {
	ID, Name, PolicyIP, ServerType, ProductTypeID, State string
	// Topology nil means the generated fleet's for the node's position in
	// Server.Nodes.
	Topology *Topology
}

// Topology is where a GPU node sits, as its answers carry it. A node with
// an empty FabricID is sent with a null cluster_fabric_id (the seed makes
// it optional) and belongs to no fabric.
type Topology struct {
	FabricID, FabricName, NodePoolID, RegionID string
}

// DefaultHostsPerFabric is Server.HostsPerFabric's default.
const DefaultHostsPerFabric = 500

// DefaultRegion is Server.Region's default, the seed's example region.
const DefaultRegion = "kr-west1"

// fabricsPerPool is how many generated fabrics share a node pool.
const fabricsPerPool = 4

// Product is one GPU node product. MemoryValue and CPUValue are strings of
// GB and cores, as the API sends them.
type Product struct {
	ID, Name, Description, GPUModel, MemoryValue, CPUValue string
}

// Server is the fake API. Change its exported fields only between Lock
// and Unlock; the handler reads them under the same lock.
type Server struct {
	*httptest.Server

	// AccessKey, SecretKey and AccountID are what requests must be signed
	// with. AccountID is part of the signed message (the empty string when
	// the client has none); New presets it non-empty.
	AccessKey, SecretKey, AccountID string

	Nodes    []Node
	Products []Product

	// HostsPerFabric is how many consecutive Nodes share a generated
	// fabric: node i without a Topology is in fabric i/HostsPerFabric,
	// which has a 32-hex-digit id, a name like "cluster001" and a node
	// pool like "POOL001-krw1a" shared by 4 consecutive fabrics. 0 means
	// DefaultHostsPerFabric.
	HostsPerFabric int
	// Region is every generated fabric's region_id (an endpoint serves one
	// region); "" means DefaultRegion.
	Region string

	// ReportCount, when non-nil, is sent as "count" instead of len(Nodes):
	// an API whose count lies.
	ReportCount *int

	// Faults for GET /v1/gpu-nodes, keyed by page number. They apply only
	// after the request passed authentication.
	FailPage       map[int]int           // answer this status once (errors envelope), then normally
	FailPageAlways map[int]int           // answer this status every time (a page that stays broken)
	RetryAfter     map[int]int           // answer 429 with Retry-After: this many seconds once
	DelayPage      map[int]time.Duration // sleep this long before answering, every time
	MalformedPage  map[int]bool          // answer 200 with invalid JSON, every time

	// FloodNameBytes, when positive, makes every page of GET
	// /v1/gpu-nodes a full one of new RUNNING nodes of the first product,
	// each with a gpu_node_name that many bytes long, under a count of
	// FloodCount: a hostile provider whose inventory never ends (Nodes is
	// not read). The answer is written as it goes, never held whole.
	FloodNameBytes int

	// Hold, when set, is called (outside the lock) before a page of GET
	// /v1/gpu-nodes is answered: a test holds an import pass there.
	Hold func(r *http.Request)

	// Requests counts requests served, rejected ones included.
	Requests int

	mu sync.Mutex
	// generated caches generated topologies by fabric number for genRegion.
	generated []Topology
	genRegion string
}

// New starts a fake with the preset credentials, no nodes and no products;
// t.Cleanup closes it.
func New(t testing.TB) *Server {
	t.Helper()
	s := Start()
	t.Cleanup(s.Close)
	return s
}

// Start is New outside a test (a benchmark harness): the caller closes
// the server.
func Start() *Server {
	s := &Server{
		AccessKey:      AccessKey,
		SecretKey:      SecretKey,
		AccountID:      AccountID,
		FailPage:       map[int]int{},
		FailPageAlways: map[int]int{},
		RetryAfter:     map[int]int{},
		DelayPage:      map[int]time.Duration{},
		MalformedPage:  map[int]bool{},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Lock guards the exported fields against the handler.
func (s *Server) Lock() { s.mu.Lock() }

// Unlock releases Lock.
func (s *Server) Unlock() { s.mu.Unlock() }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.Requests++
	access, secret, account := s.AccessKey, s.SecretKey, s.AccountID
	s.mu.Unlock()

	if msg := s.authenticate(r, access, secret, account); msg != "" {
		writeError(w, http.StatusUnauthorized, msg)
		return
	}
	path := r.URL.Path
	switch {
	case path == "/v1/gpu-nodes":
		if allowGet(w, r) {
			s.listNodes(w, r)
		}
	case path == "/v1/gpu-nodes/products":
		if allowGet(w, r) {
			s.listProducts(w)
		}
	case path == "/v1/cluster-fabrics":
		if allowGet(w, r) {
			s.listFabrics(w, r)
		}
	case strings.HasPrefix(path, "/v1/cluster-fabrics/") && !strings.Contains(path[len("/v1/cluster-fabrics/"):], "/"):
		if allowGet(w, r) {
			s.showFabric(w, path[len("/v1/cluster-fabrics/"):])
		}
	case strings.HasPrefix(path, "/v1/gpu-nodes/") && !strings.Contains(path[len("/v1/gpu-nodes/"):], "/"):
		if allowGet(w, r) {
			s.showNode(w, path[len("/v1/gpu-nodes/"):])
		}
	default:
		writeError(w, http.StatusNotFound, "no such resource: "+path)
	}
}

func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet {
		return true
	}
	w.Header().Set("Allow", http.MethodGet)
	writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed (the fake serves GET only)")
	return false
}

// authenticate returns why r is refused, or "". The signed URL is rebuilt
// from what arrived: the server's scheme, the Host header and the raw
// request URI.
func (s *Server) authenticate(r *http.Request, access, secret, account string) string {
	h := r.Header
	for _, name := range []string{"Scp-Accesskey", "Scp-Signature", "Scp-Timestamp", "Scp-ClientType", "Scp-Api-Version"} {
		if h.Get(name) == "" {
			return "missing header " + name
		}
	}
	if got := h.Get("Scp-ClientType"); got != "Openapi" {
		return fmt.Sprintf("Scp-ClientType must be Openapi, not %q", got)
	}
	if got := h.Get("Scp-Api-Version"); got != APIVersion {
		return fmt.Sprintf("unsupported Scp-Api-Version %q (want %q)", got, APIVersion)
	}
	if h.Get("Scp-Accesskey") != access {
		return "unknown access key"
	}
	ts := h.Get("Scp-Timestamp")
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "Scp-Timestamp is not milliseconds since the epoch"
	}
	if skew := time.Since(time.UnixMilli(ms)); skew > MaxClockSkew || skew < -MaxClockSkew {
		return "Scp-Timestamp is more than 5 minutes away from the server's clock"
	}
	sent, err := base64.StdEncoding.DecodeString(h.Get("Scp-Signature"))
	if err != nil {
		return "Scp-Signature is not base64"
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	var msg bytes.Buffer
	for _, part := range []string{r.Method, scheme, "://", r.Host, r.RequestURI, ts, h.Get("Scp-Accesskey"), account, "Openapi"} {
		msg.WriteString(part)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(msg.Bytes())
	if !hmac.Equal(sent, mac.Sum(nil)) {
		return "signature mismatch"
	}
	return ""
}

// pageParams reads a list's size (default 20, at least 1) and page
// (default 0), answering 400 itself when either is bad.
func pageParams(w http.ResponseWriter, q url.Values) (size, page int, ok bool) {
	size, err := intParam(q, "size", 20, 1)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, 0, false
	}
	page, err = intParam(q, "page", 0, 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, 0, false
	}
	return size, page, true
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	size, page, ok := pageParams(w, q)
	if !ok {
		return
	}

	s.mu.Lock()
	delay, hold := s.DelayPage[page], s.Hold
	s.mu.Unlock()
	if hold != nil {
		hold(r)
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}

	s.mu.Lock()
	if status, ok := s.FailPage[page]; ok {
		delete(s.FailPage, page)
		s.mu.Unlock()
		writeError(w, status, fmt.Sprintf("injected failure on page %d", page))
		return
	}
	if status, ok := s.FailPageAlways[page]; ok {
		s.mu.Unlock()
		writeError(w, status, fmt.Sprintf("injected failure on page %d (every time)", page))
		return
	}
	if secs, ok := s.RetryAfter[page]; ok {
		delete(s.RetryAfter, page)
		s.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		writeError(w, http.StatusTooManyRequests, "too many requests")
		return
	}
	if s.MalformedPage[page] {
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"count": 3, "gpu_nodes": [{"id": "trunc`))
		return
	}
	if s.FloodNameBytes > 0 {
		product := ""
		if len(s.Products) > 0 {
			product = s.Products[0].Name
		}
		nameBytes := s.FloodNameBytes
		s.mu.Unlock()
		flood(w, size, page, nameBytes, product)
		return
	}
	account := s.AccountID
	total := len(s.Nodes)
	count := total
	if s.ReportCount != nil {
		count = *s.ReportCount
	}
	var items []map[string]any
	if start := page * size; start < total && start >= 0 {
		for i, n := range s.Nodes[start:min(start+size, total)] {
			items = append(items, nodeJSON(n, s.topology(start+i), account))
		}
	}
	s.mu.Unlock()

	if items == nil {
		items = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": count, "gpu_nodes": items})
}

func (s *Server) showNode(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range s.Nodes {
		if n.ID == id {
			writeJSON(w, http.StatusOK, nodeJSON(n, s.topology(i), s.AccountID))
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("GPU node %s not found", id))
}

func (s *Server) listProducts(w http.ResponseWriter) {
	s.mu.Lock()
	items := make([]map[string]any, 0, len(s.Products))
	for _, p := range s.Products {
		items = append(items, productJSON(p))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"products": items})
}

func intParam(q url.Values, name string, def, lowest int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lowest {
		return 0, fmt.Errorf("query parameter %s: %q is not an integer >= %d", name, v, lowest)
	}
	return n, nil
}

// nodeJSON is a GpuNodeShowResponse: the seed's example with n's fields.
func nodeJSON(n Node, t Topology, account string) map[string]any {
	if account == "" {
		account = AccountID
	}
	var fabricID any
	if t.FabricID != "" {
		fabricID = t.FabricID
	}
	return map[string]any{
		"account_id":          account,
		"cluster_fabric_id":   fabricID,
		"cluster_fabric_name": t.FabricName,
		"created_at":          "2024-05-17T00:23:17Z",
		"created_by":          "90dddfc2b1e04edba54ba2b41539a9ac",
		"gpu_node_name":       n.Name,
		"id":                  n.ID,
		"image_id":            "IMAGE-7XFMaJpLsapKvskFMjCtmm",
		"image_version":       "RHEL 8.7 for BM",
		"init_script":         "",
		"lock_enabled":        true,
		"modified_at":         "2024-05-17T00:23:17Z",
		"modified_by":         "90dddfc2b1e04edba54ba2b41539a9ac",
		"network_id":          "ab313c43291e4b678f4bacffe10768ae",
		"node_pool_id":        t.NodePoolID,
		"os_type":             "LINUX",
		"pfs_ip":              []string{"10.252.128.2", "10.252.128.3"},
		"policy_ip":           n.PolicyIP,
		"policy_nat":          nil,
		"policy_use_nat":      false,
		"product_type_id":     n.ProductTypeID,
		"region_id":           t.RegionID,
		"root_account":        "rootaccount",
		"server_type":         n.ServerType,
		"state":               n.State,
		"time_zone":           "Asia/Seoul",
		"vpc_id":              "e58348b1bc9148e5af86500fd4ef99ca",
	}
}

// productJSON is a GpuNodeProductShowResponse.
func productJSON(p Product) map[string]any {
	return map[string]any{
		"created_at":  "2024-05-17T00:23:17Z",
		"created_by":  "90dddfc2b1e04edba54ba2b41539a9ac",
		"description": p.Description,
		"id":          p.ID,
		"modified_at": "2024-05-17T00:23:17Z",
		"modified_by": "90dddfc2b1e04edba54ba2b41539a9ac",
		"name":        p.Name,
		"product_attrs": map[string]any{
			"compute_class_type_name":  "GPU " + p.GPUModel + " Metal",
			"compute_class_type_value": "g2_metal",
			"cpu_value":                p.CPUValue,
			"disk_unit":                "GB",
			"disk_value":               "960",
			"gpu_model":                p.GPUModel,
			"memory_value":             p.MemoryValue,
		},
		"state": "AVAILABLE",
		"type":  "SCALE",
	}
}

func writeError(w http.ResponseWriter, status int, detail string) {
	writeJSON(w, status, map[string]any{"errors": []map[string]string{{"detail": detail}}})
}

// writeJSON encodes before WriteHeader so a failure cannot leave a
// half-written 200.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"errors":[{"detail":"scptest: encoding the answer failed"}]}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
