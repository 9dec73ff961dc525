// Package scp reads GPU nodes from Samsung SDS Cloud's Multi-node GPU
// Cluster API v1.2 (PROVIDERS.md, seed 003) and turns them into a
// provider.Inventory.
package scp

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

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
// count, or a GPU node id longer than provider.MaxID) it returns the error
// and an empty Inventory, never a partial one. Call errors are
// *provider.Error; cancellation returns ctx.Err().
//
// Each page is mapped as it arrives: what a pass holds is one page and
// the hosts so far, every string of them within its bound.
func (c *Client) Fetch(ctx context.Context) (provider.Inventory, error) {
	products, err := c.listProducts(ctx)
	if err != nil {
		return provider.Inventory{}, err
	}
	idx := indexProducts(products)
	var inv provider.Inventory
	err = c.listNodes(ctx, func(n *gpuNode) {
		h, reason := c.host(n, idx)
		if reason != "" {
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: n.ID.String(),
				Name: n.Name.Within(provider.MaxName), Reason: reason})
			return
		}
		inv.Hosts = append(inv.Hosts, h)
	})
	if err != nil {
		return provider.Inventory{}, err
	}
	return inv, nil
}

// Wire types: only the fields read here; the seed lists the rest. Every
// string is read with a bound (text, looseString), checked per field by
// host and product.problem.

type productList struct {
	Products []product `json:"products"`
}

type product struct {
	ID          text `json:"id"`
	Name        text `json:"name"`
	Description text `json:"description"`
	Attrs       struct {
		GPUModel    text `json:"gpu_model"`
		MemoryValue text `json:"memory_value"`
	} `json:"product_attrs"`
}

// problem says why no node of p can be described, or "".
func (p *product) problem() string {
	switch {
	case !p.Description.Fits(provider.MaxText):
		return provider.TooLong("its description", provider.MaxText)
	case !p.Attrs.GPUModel.Fits(provider.MaxGPUModel):
		return provider.TooLong("its gpu_model", provider.MaxGPUModel)
	case !p.Attrs.MemoryValue.Fits(provider.MaxWord):
		return provider.TooLong("its memory_value", provider.MaxWord)
	}
	return ""
}

type nodeList struct {
	Count    *int       `json:"count"` // "any of [integer, null]"
	GPUNodes *[]gpuNode `json:"gpu_nodes"`
}

type gpuNode struct {
	ID            text `json:"id"`
	Name          text `json:"gpu_node_name"`
	PolicyIP      text `json:"policy_ip"`
	ServerType    text `json:"server_type"`
	ProductTypeID text `json:"product_type_id"`
	State         text `json:"state"`

	FabricID   looseString `json:"cluster_fabric_id"` // "any of [string, null]"
	FabricName looseString `json:"cluster_fabric_name"`
	NodePoolID looseString `json:"node_pool_id"`
	RegionID   looseString `json:"region_id"`
}

// text is a string field, read with provider.DecodeText's bound; null
// reads as "", anything else that is not a string fails the answer.
type text struct{ provider.Text }

func (t *text) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) == 0 || b[0] != '"' {
		return &json.UnmarshalTypeError{Value: kind(b), Type: reflect.TypeFor[string]()}
	}
	v, err := provider.DecodeText(b)
	t.Text = v
	return err
}

// kind names the JSON value b begins, as json.UnmarshalTypeError does.
func kind(b []byte) string {
	switch {
	case len(b) == 0:
		return "nothing"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	}
	return "number"
}

// looseString is a string the host's identity and size do not depend on:
// null, or any JSON that is not a string, reads as "" (unknown) rather
// than failing the pass. Surrounding blanks are dropped.
type looseString struct{ provider.Text }

func (s *looseString) UnmarshalJSON(b []byte) error {
	v, err := provider.DecodeText(b)
	if err != nil {
		v = provider.Text{}
	}
	s.Text = v.TrimSpace()
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

// listNodes pages through /v1/gpu-nodes until it has read the first
// page's count, handing each node to each as it goes. The count may not
// change while paging and no id may appear twice: offset paging over a
// changing list skips or repeats nodes, and a pass must not apply what it
// cannot trust. Nor may an id be longer than provider.MaxID: a later pass
// finds a host's nodes by its id, so a host whose id cannot be kept
// cannot be kept either. The next pass tries again.
func (c *Client) listNodes(ctx context.Context, each func(*gpuNode)) error {
	var (
		read  int
		seen  = map[string]bool{}
		count *int
	)
	for page := 0; ; page++ {
		op := fmt.Sprintf("GET /v1/gpu-nodes page %d", page)
		q := url.Values{"size": {strconv.Itoa(c.pageSize)}, "page": {strconv.Itoa(page)}}
		var nl nodeList
		if err := c.get(ctx, op, "/v1/gpu-nodes", q, &nl); err != nil {
			return err
		}
		// An answer without the list is not an empty inventory: applying it
		// would remove every free node of the provider.
		if nl.GPUNodes == nil {
			return c.fail(op, "the answer has no gpu_nodes list; inventory not applied")
		}
		if page == 0 {
			count = nl.Count
		} else if !sameCount(count, nl.Count) {
			return c.fail(op, fmt.Sprintf("count changed from %s to %s while paging; inventory not applied",
				countString(count), countString(nl.Count)))
		}
		fresh := 0 // nodes with an id not seen before
		for i := range *nl.GPUNodes {
			n := &(*nl.GPUNodes)[i]
			id := n.ID.String()
			switch {
			case !n.ID.Fits(provider.MaxID):
				return c.fail(op, fmt.Sprintf("a GPU node's %s; inventory not applied", provider.TooLong("id", provider.MaxID)))
			case id != "" && seen[id]: // id-less nodes are skipped, not fatal
				return c.fail(op, fmt.Sprintf("GPU node %q listed twice (list changed while paging?); inventory not applied", id))
			case id != "":
				fresh++
			}
			seen[id] = true
			each(n)
		}
		read += len(*nl.GPUNodes)
		// Without a count only a short page ends the list, and repeated ids
		// are how a page that does not advance shows; a full page of
		// id-less nodes shows nothing, so a server answering it for every
		// page would be paged up to maxNodes. (Found by FuzzFetch.)
		if count == nil && fresh == 0 && len(*nl.GPUNodes) >= c.pageSize {
			return c.fail(op, fmt.Sprintf("a full page of %d GPU nodes without an id and no count: paging cannot be followed; inventory not applied", len(*nl.GPUNodes)))
		}
		switch {
		case count != nil && read >= *count:
			return nil
		case count == nil && len(*nl.GPUNodes) < c.pageSize:
			// No count to check against: a short page is the end.
			return nil
		case len(*nl.GPUNodes) == 0:
			return c.fail(op, fmt.Sprintf("count says %d GPU nodes but the pages held only %d; inventory incomplete, not applied",
				*count, read))
		case read > maxNodes:
			return c.fail(op, fmt.Sprintf("more than %d GPU nodes; giving up", maxNodes))
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
// nothing about which one, so such ids are not used; nor are names and
// ids longer than a node's server_type and product_type_id may be.
type productIndex struct {
	byName map[string]*product
	byID   map[string]*product // nil value: ambiguous id
}

func indexProducts(ps []product) productIndex {
	idx := productIndex{byName: map[string]*product{}, byID: map[string]*product{}}
	for i := range ps {
		p := &ps[i]
		if name := p.Name.Within(provider.MaxName); name != "" {
			if _, dup := idx.byName[name]; !dup {
				idx.byName[name] = p
			}
		}
		if id := p.ID.Within(provider.MaxID); id != "" {
			if _, dup := idx.byID[id]; dup {
				idx.byID[id] = nil
			} else {
				idx.byID[id] = p
			}
		}
	}
	return idx
}

// find takes a node whose server_type and product_type_id fit their bounds.
func (idx productIndex) find(n *gpuNode) (*product, string) {
	serverType, typeID := n.ServerType.String(), n.ProductTypeID.String()
	if p := idx.byName[serverType]; p != nil && serverType != "" {
		return p, ""
	}
	if p, ok := idx.byID[typeID]; ok && typeID != "" {
		if p == nil {
			return nil, fmt.Sprintf("unknown product: server_type %q not listed and product_type_id %q matches several products",
				serverType, typeID)
		}
		return p, ""
	}
	return nil, fmt.Sprintf("unknown product: server_type %q, product_type_id %q", serverType, typeID)
}

// tooLong is why n is skipped for a field past its bound, or "". (An id
// past its bound fails the pass in listNodes.)
func tooLong(n *gpuNode) string {
	for _, f := range []struct {
		name  string
		value provider.Text
		limit int
	}{
		{"gpu_node_name", n.Name.Text, provider.MaxName},
		{"policy_ip", n.PolicyIP.Text, provider.MaxAddress},
		{"server_type", n.ServerType.Text, provider.MaxName},
		{"product_type_id", n.ProductTypeID.Text, provider.MaxID},
		{"state", n.State.Text, provider.MaxWord},
		{"cluster_fabric_id", n.FabricID.Text, provider.MaxFabric},
	} {
		if !f.value.Fits(f.limit) {
			return provider.TooLong(f.name, f.limit)
		}
	}
	return ""
}

// host maps one GPU node, or says why it cannot become registry nodes.
func (c *Client) host(n *gpuNode, idx productIndex) (provider.Host, string) {
	if strings.TrimSpace(n.ID.String()) == "" {
		// The id is how later passes find the host again; without it
		// the host's nodes could never be updated or removed.
		return provider.Host{}, "no id"
	}
	if reason := tooLong(n); reason != "" {
		return provider.Host{}, reason
	}
	ip := strings.TrimSpace(n.PolicyIP.String())
	if ip == "" {
		return provider.Host{}, "no policy_ip"
	}
	p, reason := idx.find(n)
	if p == nil {
		return provider.Host{}, reason
	}
	if problem := p.problem(); problem != "" {
		return provider.Host{}, fmt.Sprintf("product %q: %s", p.Name.Within(provider.MaxName), problem)
	}
	memGB, ok := parseGB(p.Attrs.MemoryValue.String())
	if !ok {
		return provider.Host{}, fmt.Sprintf("product %q: memory_value %q is not a number of GB", p.Name.Within(provider.MaxName), p.Attrs.MemoryValue.String())
	}
	state := n.State.String()
	h := provider.Host{
		ExternalID:  n.ID.String(),
		Name:        n.Name.String(),
		IP:          ip,
		State:       state,
		Running:     state == "RUNNING",
		CPUMemBytes: memGB * provider.GiB,
		Fabric:      n.FabricID.String(),
	}
	h.SetLabel(LabelRegion, n.RegionID.Within(provider.MaxName))
	h.SetLabel(LabelNodePool, n.NodePoolID.Within(provider.MaxName))
	h.SetLabel(LabelFabricName, n.FabricName.Within(provider.MaxName))
	serverType := strings.TrimSpace(n.ServerType.String())
	if serverType == "" {
		serverType = p.Name.Within(provider.MaxName)
	}
	h.SetLabel(LabelServerType, serverType)
	model := strings.TrimSpace(p.Attrs.GPUModel.String())
	if model == "" || strings.EqualFold(model, "NONE") {
		return h, "" // CPU-only host
	}
	spec, ok := gpuFromDescription(p.Description.String(), model)
	if !ok {
		spec, ok = c.tableSpec(model)
	}
	if !ok {
		return provider.Host{}, fmt.Sprintf("GPU model %q: neither product %q's description nor the GPU table gives its memory and count",
			model, p.Name.Within(provider.MaxName))
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
