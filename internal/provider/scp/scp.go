// Package scp reads GPU nodes from Samsung SDS Cloud's Multi-node GPU
// Cluster API v1.2 (PROVIDERS.md, seed 003) and turns them into a
// provider.Inventory.
package scp

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/provider"
)

const (
	providerName    = "scp"
	apiVersion      = "multinodegpucluster 1.2"
	clientType      = "Openapi"
	defaultPageSize = 100
	// maxNodes stops a server that keeps sending full pages (with a null
	// or absurd count) from keeping a pass busy forever.
	maxNodes = 1 << 20
)

// Label keys the import sets on SCP hosts, from the GPU node's own
// answer. Only the import may set keys under LabelPrefix.
const (
	LabelPrefix     = "scp.registryd.io/"
	LabelRegion     = LabelPrefix + "region"      // region_id
	LabelNodePool   = LabelPrefix + "node-pool"   // node_pool_id (the API gives pools no name)
	LabelFabricName = LabelPrefix + "fabric-name" // cluster_fabric_name
	LabelServerType = LabelPrefix + "server-type" // server_type, else the product's name
)

// Config is what a Client needs. Endpoint, AccessKey and SecretKey are
// required; the rest have defaults.
type Config struct {
	// Endpoint is the base URL, e.g.
	// https://multinodegpucluster.kr-west1.s.samsungsdscloud.com.
	Endpoint             string
	AccessKey, SecretKey string
	// AccountID is signed when set (as the empty string otherwise).
	AccountID string
	// GPUTable gives GPU memory and count per model where a product
	// description does not; nil means provider.DefaultGPUTable().
	GPUTable map[string]provider.GPUSpec
	// PageSize is the size parameter of GET /v1/gpu-nodes; default 100.
	PageSize int
	Retry    provider.Retry
	// HTTPClient nil means a client without a global timeout:
	// Retry.Timeout bounds each request.
	HTTPClient *http.Client
	// Now is the clock for Scp-Timestamp; nil means time.Now.
	Now func() time.Time
}

// Client lists an SCP account's GPU nodes. It is safe for concurrent use.
type Client struct {
	base      string // endpoint without a trailing slash
	accessKey string
	secretKey string
	accountID string
	gpuTable  map[string]provider.GPUSpec
	pageSize  int
	retry     provider.Retry
	http      *http.Client
	now       func() time.Time
}

// New validates cfg and returns a Client. Its errors never contain the keys.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Endpoint)
	switch {
	case cfg.Endpoint == "":
		return nil, errors.New("scp: endpoint is required")
	case err != nil:
		return nil, errors.New("scp: endpoint is not a URL")
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, errors.New("scp: endpoint must be an absolute http(s) URL")
	case u.User != nil:
		return nil, errors.New("scp: endpoint must not carry credentials")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("scp: endpoint must not have a query or fragment")
	case cfg.AccessKey == "":
		return nil, errors.New("scp: access key is required")
	case cfg.SecretKey == "":
		return nil, errors.New("scp: secret key is required")
	case cfg.PageSize < 0:
		return nil, fmt.Errorf("scp: page size %d is negative", cfg.PageSize)
	}
	c := &Client{
		base:      strings.TrimRight(u.String(), "/"),
		accessKey: cfg.AccessKey,
		secretKey: cfg.SecretKey,
		accountID: cfg.AccountID,
		gpuTable:  cfg.GPUTable,
		pageSize:  cfg.PageSize,
		retry:     cfg.Retry,
		http:      cfg.HTTPClient,
		now:       cfg.Now,
	}
	if c.gpuTable == nil {
		c.gpuTable = provider.DefaultGPUTable()
	}
	if c.pageSize == 0 {
		c.pageSize = defaultPageSize
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

// Name is the provider's name in the registry: "scp".
func (c *Client) Name() string { return providerName }

// Sign returns the Scp-Signature of a request: base64 of
// HMAC-SHA256(secretKey, method + url + timestamp + accessKey + accountID +
// "Openapi"), url being the full URL sent (scheme://host/path?query).
func Sign(method, url, timestamp, accessKey, accountID, secretKey string) string {
	mac := hmac.New(sha256.New, []byte(secretKey))
	mac.Write([]byte(method + url + timestamp + accessKey + accountID + clientType))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Fetch reads all products and all GPU nodes and maps them to hosts. It is
// all or nothing: on any failure (including fewer nodes than the API's
// count) it returns the error and an empty Inventory, never a partial one.
// Call errors are *provider.Error; cancellation returns ctx.Err().
func (c *Client) Fetch(ctx context.Context) (provider.Inventory, error) {
	products, err := c.listProducts(ctx)
	if err != nil {
		return provider.Inventory{}, err
	}
	nodes, err := c.listNodes(ctx)
	if err != nil {
		return provider.Inventory{}, err
	}
	idx := indexProducts(products)
	var inv provider.Inventory
	for _, n := range nodes {
		h, reason := c.host(n, idx)
		if reason != "" {
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: n.ID, Name: n.Name, Reason: reason})
			continue
		}
		inv.Hosts = append(inv.Hosts, h)
	}
	return inv, nil
}

// Wire types: only the fields read here; the seed lists the rest.

type productList struct {
	Products []product `json:"products"`
}

type product struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	Attrs       struct {
		GPUModel    string `json:"gpu_model"`
		MemoryValue string `json:"memory_value"`
		CPUValue    string `json:"cpu_value"`
	} `json:"product_attrs"`
}

type nodeList struct {
	Count    *int       `json:"count"` // "any of [integer, null]"
	GPUNodes *[]gpuNode `json:"gpu_nodes"`
}

type gpuNode struct {
	ID            string `json:"id"`
	Name          string `json:"gpu_node_name"`
	PolicyIP      string `json:"policy_ip"`
	ServerType    string `json:"server_type"`
	ProductTypeID string `json:"product_type_id"`
	State         string `json:"state"`

	FabricID   looseString `json:"cluster_fabric_id"` // "any of [string, null]"
	FabricName looseString `json:"cluster_fabric_name"`
	NodePoolID looseString `json:"node_pool_id"`
	RegionID   looseString `json:"region_id"`
}

// looseString is a string the host's identity and size do not depend on:
// null, or any JSON that is not a string, reads as "" (unknown) rather
// than failing the pass. Surrounding blanks are dropped.
type looseString string

func (s *looseString) UnmarshalJSON(b []byte) error {
	var v string
	switch {
	case len(b) < 2 || b[0] != '"':
	case bytes.IndexByte(b, '\\') < 0 && utf8.Valid(b):
		v = string(b[1 : len(b)-1]) // nothing to unescape
	case json.Unmarshal(b, &v) != nil:
		v = ""
	}
	*s = looseString(strings.TrimSpace(v))
	return nil
}

type errorBody struct {
	Errors []struct {
		Detail string `json:"detail"`
	} `json:"errors"`
}

func (c *Client) listProducts(ctx context.Context) ([]product, error) {
	const op = "GET /v1/gpu-nodes/products"
	var pl productList
	if err := c.get(ctx, op, "/v1/gpu-nodes/products", nil, &pl); err != nil {
		return nil, err
	}
	return pl.Products, nil
}

// listNodes pages through /v1/gpu-nodes until it holds the first page's
// count. The count may not change while paging and no id may appear
// twice: offset paging over a changing list skips or repeats nodes, and a
// pass must not apply what it cannot trust. The next pass tries again.
func (c *Client) listNodes(ctx context.Context) ([]gpuNode, error) {
	var (
		nodes []gpuNode
		seen  = map[string]bool{}
		count *int
	)
	for page := 0; ; page++ {
		op := fmt.Sprintf("GET /v1/gpu-nodes page %d", page)
		q := url.Values{"size": {strconv.Itoa(c.pageSize)}, "page": {strconv.Itoa(page)}}
		var nl nodeList
		if err := c.get(ctx, op, "/v1/gpu-nodes", q, &nl); err != nil {
			return nil, err
		}
		// An answer without the list is not an empty inventory: applying it
		// would remove every free node of the provider.
		if nl.GPUNodes == nil {
			return nil, c.fail(op, "the answer has no gpu_nodes list; inventory not applied")
		}
		if page == 0 {
			count = nl.Count
		} else if !sameCount(count, nl.Count) {
			return nil, c.fail(op, fmt.Sprintf("count changed from %s to %s while paging; inventory not applied",
				countString(count), countString(nl.Count)))
		}
		fresh := 0 // nodes with an id not seen before
		for _, n := range *nl.GPUNodes {
			if n.ID != "" && seen[n.ID] { // id-less nodes are skipped later, not fatal
				return nil, c.fail(op, fmt.Sprintf("GPU node %q listed twice (list changed while paging?); inventory not applied", n.ID))
			}
			if n.ID != "" {
				fresh++
			}
			seen[n.ID] = true
			nodes = append(nodes, n)
		}
		// Without a count only a short page ends the list, and repeated ids
		// are how a page that does not advance shows; a full page of
		// id-less nodes shows nothing, so a server answering it for every
		// page would be paged up to maxNodes. (Found by FuzzFetch.)
		if count == nil && fresh == 0 && len(*nl.GPUNodes) >= c.pageSize {
			return nil, c.fail(op, fmt.Sprintf("a full page of %d GPU nodes without an id and no count: paging cannot be followed; inventory not applied", len(*nl.GPUNodes)))
		}
		switch {
		case count != nil && len(nodes) >= *count:
			return nodes, nil
		case count == nil && len(*nl.GPUNodes) < c.pageSize:
			// No count to check against: a short page is the end.
			return nodes, nil
		case len(*nl.GPUNodes) == 0:
			return nil, c.fail(op, fmt.Sprintf("count says %d GPU nodes but the pages held only %d; inventory incomplete, not applied",
				*count, len(nodes)))
		case len(nodes) > maxNodes:
			return nil, c.fail(op, fmt.Sprintf("more than %d GPU nodes; giving up", maxNodes))
		}
	}
}

func sameCount(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func countString(n *int) string {
	if n == nil {
		return "null"
	}
	return strconv.Itoa(*n)
}

func (c *Client) fail(op, msg string) error {
	return &provider.Error{Provider: providerName, Op: op, Message: msg}
}

// get sends a signed GET, retried by provider.Do, and decodes the JSON
// answer into v.
func (c *Client) get(ctx context.Context, op, path string, query url.Values, v any) error {
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	// lastSig lets errMessage scrub a signature the server might echo. Do
	// calls newReq and errMessage in turn on one goroutine.
	var lastSig string
	newReq := func(ctx context.Context) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return nil, errors.New("building the request failed")
		}
		ts := strconv.FormatInt(c.now().UnixMilli(), 10)
		// Sign the URL as net/http will put it on the wire.
		lastSig = Sign(req.Method, req.URL.String(), ts, c.accessKey, c.accountID, c.secretKey)
		req.Header.Set("Scp-Accesskey", c.accessKey)
		req.Header.Set("Scp-Signature", lastSig)
		req.Header.Set("Scp-Timestamp", ts)
		req.Header.Set("Scp-ClientType", clientType)
		req.Header.Set("Scp-Api-Version", apiVersion)
		req.Header.Set("Accept-Language", "en-US")
		req.Header.Set("Accept", "application/json")
		return req, nil
	}
	errMessage := func(body []byte) string {
		// Scrub before cutting, so no part of a secret survives the cut.
		msg := []rune(c.scrub(errorMessage(body), lastSig))
		if len(msg) > 300 {
			return string(msg[:300]) + "…"
		}
		return string(msg)
	}
	body, err := provider.Do(ctx, c.http, c.retry, providerName, op, newReq, errMessage)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return c.fail(op, "decoding the answer: "+err.Error())
	}
	return nil
}

// errorMessage reads the API's {"errors":[{"detail": …}]} envelope; ""
// lets provider.Do fall back to the status text.
func errorMessage(body []byte) string {
	var eb errorBody
	if json.Unmarshal(body, &eb) != nil {
		return ""
	}
	var details []string
	for _, e := range eb.Errors {
		if d := strings.TrimSpace(e.Detail); d != "" {
			details = append(details, d)
		}
	}
	return strings.Join(details, "; ")
}

// scrub removes credentials from a server-supplied message before it
// becomes an error that gets logged.
func (c *Client) scrub(msg, sig string) string {
	for _, secret := range []string{c.secretKey, c.accessKey, sig} {
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "[redacted]")
		}
	}
	return msg
}

// productIndex finds a node's product by server_type (product name), else
// by product_type_id (product id). An id shared by several products (the
// seed's example product has id "SCALE", the same as its type) says
// nothing about which one, so such ids are not used.
type productIndex struct {
	byName map[string]*product
	byID   map[string]*product // nil value: ambiguous id
}

func indexProducts(ps []product) productIndex {
	idx := productIndex{byName: map[string]*product{}, byID: map[string]*product{}}
	for i := range ps {
		p := &ps[i]
		if p.Name != "" {
			if _, dup := idx.byName[p.Name]; !dup {
				idx.byName[p.Name] = p
			}
		}
		if p.ID != "" {
			if _, dup := idx.byID[p.ID]; dup {
				idx.byID[p.ID] = nil
			} else {
				idx.byID[p.ID] = p
			}
		}
	}
	return idx
}

func (idx productIndex) find(n gpuNode) (*product, string) {
	if p := idx.byName[n.ServerType]; p != nil && n.ServerType != "" {
		return p, ""
	}
	if p, ok := idx.byID[n.ProductTypeID]; ok && n.ProductTypeID != "" {
		if p == nil {
			return nil, fmt.Sprintf("unknown product: server_type %q not listed and product_type_id %q matches several products",
				n.ServerType, n.ProductTypeID)
		}
		return p, ""
	}
	return nil, fmt.Sprintf("unknown product: server_type %q, product_type_id %q", n.ServerType, n.ProductTypeID)
}

// host maps one GPU node, or says why it cannot become registry nodes.
func (c *Client) host(n gpuNode, idx productIndex) (provider.Host, string) {
	if strings.TrimSpace(n.ID) == "" {
		// The id is how later passes find the host again; without it
		// the host's nodes could never be updated or removed.
		return provider.Host{}, "no id"
	}
	ip := strings.TrimSpace(n.PolicyIP)
	if ip == "" {
		return provider.Host{}, "no policy_ip"
	}
	p, reason := idx.find(n)
	if p == nil {
		return provider.Host{}, reason
	}
	memGB, ok := parseGB(p.Attrs.MemoryValue)
	if !ok {
		return provider.Host{}, fmt.Sprintf("product %q: memory_value %q is not a number of GB", p.Name, p.Attrs.MemoryValue)
	}
	h := provider.Host{
		ExternalID:  n.ID,
		Name:        n.Name,
		IP:          ip,
		State:       n.State,
		Running:     n.State == "RUNNING",
		CPUMemBytes: memGB * provider.GiB,
		Fabric:      string(n.FabricID),
	}
	h.SetLabel(LabelRegion, string(n.RegionID))
	h.SetLabel(LabelNodePool, string(n.NodePoolID))
	h.SetLabel(LabelFabricName, string(n.FabricName))
	serverType := strings.TrimSpace(n.ServerType)
	if serverType == "" {
		serverType = p.Name
	}
	h.SetLabel(LabelServerType, serverType)
	model := strings.TrimSpace(p.Attrs.GPUModel)
	if model == "" || strings.EqualFold(model, "NONE") {
		return h, "" // CPU-only host
	}
	spec, ok := gpuFromDescription(p.Description, model)
	if !ok {
		spec, ok = c.tableSpec(model)
	}
	if !ok {
		return provider.Host{}, fmt.Sprintf("GPU model %q: neither product %q's description nor the GPU table gives its memory and count",
			model, p.Name)
	}
	h.GPUModel = model
	h.GPUs = spec.Count
	h.GPUMemBytes = spec.MemGB * provider.GiB
	return h, ""
}

func (c *Client) tableSpec(model string) (provider.GPUSpec, bool) {
	if s, ok := c.gpuTable[model]; ok {
		return s, s.MemGB > 0 && s.Count > 0
	}
	for k, s := range c.gpuTable {
		if strings.EqualFold(k, model) {
			return s, s.MemGB > 0 && s.Count > 0
		}
	}
	return provider.GPUSpec{}, false
}

// parseGB reads memory_value: whole GB, tolerating a "GB"/"G" suffix.
func parseGB(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	u := strings.ToUpper(s)
	switch {
	case strings.HasSuffix(u, "GB"):
		s = s[:len(s)-2]
	case strings.HasSuffix(u, "G"):
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > 1<<33 {
		return 0, false
	}
	return n, true
}

// gpuPattern matches "B300(268GB)*8" and friends within a description such
// as "CPU 128 │ Memory 4096GB │ B300(268GB)*8 │ Disk 960GB", whatever the
// separators; "268G", spaces and "x"/"×" for "*" are accepted too.
var gpuPattern = regexp.MustCompile(`([A-Za-z0-9][A-Za-z0-9 ._-]*?)\s*\(\s*(\d+)\s*(?:GB|G|GiB)?\s*\)\s*[*x×]\s*(\d+)`)

// gpuFromDescription prefers a match naming model, else takes the first.
func gpuFromDescription(desc, model string) (provider.GPUSpec, bool) {
	var first *provider.GPUSpec
	for _, m := range gpuPattern.FindAllStringSubmatch(desc, -1) {
		mem, err1 := strconv.ParseInt(m[2], 10, 64)
		count, err2 := strconv.Atoi(m[3])
		if err1 != nil || err2 != nil || mem <= 0 || count <= 0 || mem > 1<<20 || count > 1<<10 {
			continue
		}
		s := provider.GPUSpec{MemGB: mem, Count: count}
		// "B300" or "NVIDIA B300"; not "A100" for "A10".
		words := strings.Fields(m[1])
		if strings.EqualFold(strings.TrimSpace(m[1]), model) || strings.EqualFold(words[len(words)-1], model) {
			return s, true
		}
		if first == nil {
			first = &s
		}
	}
	if first == nil {
		return provider.GPUSpec{}, false
	}
	return *first, true
}
