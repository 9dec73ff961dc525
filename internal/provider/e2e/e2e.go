// Package e2e reads E2E Networks TIR training clusters into a provider
// inventory: one host per worker node of each cluster. It only reads.
//
// A training cluster is its workers' interconnect domain: every host of
// cluster 101 has Fabric "cluster-101", the cluster's id (which the API
// keeps for the cluster's life) and never its name.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/registryd/registryd/internal/provider"
)

const (
	providerName   = "e2e"
	listPath       = "/distributed_jobs_v2/cluster/"
	defaultPerPage = 50
	// maxPages stops a server that never sends a short page; at the default
	// page size it is half a million clusters.
	maxPages = 10000
	// maxMessage bounds how much of a provider's error text reaches logs.
	maxMessage = 500
)

// Label keys the import sets on E2E hosts, from the cluster document;
// every worker of a cluster has the same. Only the import may set keys
// under LabelPrefix.
const (
	LabelPrefix = "e2e.registryd.io/"
	// LabelLocation is sku_details.plan.location, else Config.Location:
	// the list call returns only the clusters of that location.
	LabelLocation = LabelPrefix + "location"
	LabelCluster  = LabelPrefix + "cluster" // the cluster's name
	LabelPlan     = LabelPrefix + "plan"    // sku_details.specs.name, the SKU its nodes run on
)

// Config is what a Client needs. Endpoint is the API base URL, e.g.
// https://api.e2enetworks.com/myaccount/api/v1/gpu.
type Config struct {
	Endpoint            string
	APIKey, Token       string // the apikey query parameter and the bearer token
	ProjectID, Location string
	PerPage             int // clusters per page; default 50
	Retry               provider.Retry
	// HTTPClient defaults to a client without a global timeout:
	// Retry.Timeout bounds each request.
	HTTPClient *http.Client
}

// Client reads the training clusters of one project and location.
type Client struct {
	cfg     Config
	list    url.URL // the list call without its query
	http    *http.Client
	perPage int
}

// New checks cfg and returns a Client. The endpoint must be an absolute
// http(s) URL without query, fragment or user info, and the key, token,
// project and location must be set.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Endpoint)
	switch {
	// The parse error itself is not returned: it quotes the URL.
	case err != nil || !u.IsAbs() || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		return nil, errors.New("e2e: endpoint must be an absolute http(s) URL")
	case u.User != nil:
		return nil, errors.New("e2e: endpoint must not carry user info; credentials go in APIKey and Token")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, errors.New("e2e: endpoint must not have a query or fragment")
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"API key", cfg.APIKey}, {"token", cfg.Token},
		{"project id", cfg.ProjectID}, {"location", cfg.Location},
	} {
		if strings.TrimSpace(f.value) == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("e2e: missing %s", strings.Join(missing, ", "))
	}
	if cfg.PerPage < 0 {
		return nil, fmt.Errorf("e2e: per page must not be negative, got %d", cfg.PerPage)
	}
	c := &Client{cfg: cfg, list: *u.JoinPath(listPath), http: cfg.HTTPClient, perPage: cfg.PerPage}
	if c.perPage == 0 {
		c.perPage = defaultPerPage
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	return c, nil
}

// Name is the provider's name in inventories, logs and summaries: "e2e".
func (c *Client) Name() string { return providerName }

// Fetch reads every page of clusters and maps their worker nodes to hosts.
// It is all or nothing: when any call fails after retries, an answer
// cannot be read, or a cluster's or worker's id is longer than
// provider.MaxID, it returns the error (a *provider.Error, or ctx's error)
// and no inventory.
//
// Each page is mapped as it arrives: what a pass holds is one page and
// the hosts so far, every string of them within its bound.
func (c *Client) Fetch(ctx context.Context) (provider.Inventory, error) {
	var inv provider.Inventory
	seen := make(map[string]bool)
	for page := 1; ; page++ {
		if page > maxPages {
			return provider.Inventory{}, &provider.Error{Provider: providerName, Op: op(page),
				Message: fmt.Sprintf("still full pages after %d pages; giving up", maxPages)}
		}
		got, err := c.page(ctx, page)
		if err != nil {
			return provider.Inventory{}, err
		}
		fresh := 0
		for i := range got {
			cl := &got[i]
			// Clusters created while we page shift older ones onto the next
			// page, so one may come twice; keep the first.
			if id := cl.ID.String(); id != "" {
				if seen[id] {
					continue
				}
				seen[id] = true
			}
			if err := addCluster(&inv, cl, c.cfg.Location); err != nil {
				return provider.Inventory{}, &provider.Error{Provider: providerName, Op: op(page),
					Message: err.Error() + "; inventory not applied"}
			}
			fresh++
		}
		if len(got) < c.perPage {
			break
		}
		if fresh == 0 {
			// A server that ignores page_no would otherwise be read forever,
			// or, if we stopped here, silently cut short.
			return provider.Inventory{}, &provider.Error{Provider: providerName, Op: op(page),
				Message: "page repeats clusters already read; the API seems to ignore page_no"}
		}
	}
	return inv, nil
}

func op(page int) string { return fmt.Sprintf("GET %s page %d", listPath, page) }

// page reads one page of clusters.
func (c *Client) page(ctx context.Context, page int) ([]cluster, error) {
	u := c.list
	u.RawQuery = url.Values{
		"project_id": {c.cfg.ProjectID},
		"location":   {c.cfg.Location},
		"apikey":     {c.cfg.APIKey},
		"page_no":    {strconv.Itoa(page)},
		"per_page":   {strconv.Itoa(c.perPage)},
	}.Encode()
	target := u.String()
	body, err := provider.Do(ctx, c.http, c.cfg.Retry, providerName, op(page),
		func(ctx context.Context) (*http.Request, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
			if err != nil {
				// Its message quotes the URL, apikey included.
				return nil, errors.New("cannot build the request")
			}
			req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
			req.Header.Set("Accept", "application/json")
			return req, nil
		}, c.errMessage)
	if err != nil {
		return nil, err
	}
	malformed := func(format string, args ...any) error {
		return &provider.Error{Provider: providerName, Op: op(page),
			Message: "malformed answer: " + fmt.Sprintf(format, args...)}
	}
	// The envelope first, its data only looked at: the clusters are
	// decoded from the body itself, not from a copy of their list.
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, malformed("%v", err)
	}
	// The envelope repeats the status; trust it when it disagrees with HTTP.
	if env.Code.ok && (env.Code.v < 200 || env.Code.v >= 300) {
		return nil, &provider.Error{Provider: providerName, Op: op(page),
			Message: fmt.Sprintf("answer code %v: %s", env.Code.v, c.describe(env))}
	}
	// An answer without the list is not an empty inventory: applying it
	// would remove every free node of the provider.
	switch env.Data {
	case 0, 'n':
		return nil, malformed("the answer has no data list")
	case '[':
	default:
		return nil, malformed("data is not a list")
	}
	var list struct {
		Data []cluster `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, malformed("%v", err)
	}
	return list.Data, nil
}

// errMessage turns an error answer into the provider's own words.
func (c *Client) errMessage(body []byte) string {
	var env envelope
	if json.Unmarshal(body, &env) != nil {
		return ""
	}
	return c.describe(env)
}

// describe is the envelope's message, then its errors when there are any,
// with the credentials blanked in case the provider echoes them.
func (c *Client) describe(env envelope) string {
	msg := env.Message.String()
	if msg == "" {
		msg = env.Detail.String()
	}
	if detail := errorsText(json.RawMessage(env.Errors)); detail != "" {
		if msg == "" {
			msg = detail
		} else {
			msg += ": " + detail
		}
	}
	for _, secret := range []string{c.cfg.APIKey, c.cfg.Token, url.QueryEscape(c.cfg.APIKey)} {
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "[redacted]")
		}
	}
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
	}
	return msg
}

// errorsText is the envelope's errors field when it says something: a
// non-empty string, or a non-empty object or list as compact JSON.
func errorsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return strings.TrimSpace(s)
		}
	case '{', '[':
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return ""
		}
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 {
				return ""
			}
		case []any:
			if len(v) == 0 {
				return ""
			}
		}
		var buf bytes.Buffer
		if json.Compact(&buf, raw) == nil {
			return buf.String()
		}
	}
	return ""
}

// addCluster adds cl's hosts to inv, one per addressable worker node;
// location is the one the clusters were listed for. Its error is an id
// past provider.MaxID: a host found again by an id that cannot be kept
// cannot be kept either, so the pass fails.
func addCluster(inv *provider.Inventory, cl *cluster, location string) error {
	cid, cname := cl.ID.String(), cl.Name.Within(provider.MaxName)
	switch {
	case !cl.ID.Fits(provider.MaxID):
		return errors.New("a cluster's " + provider.TooLong("id", provider.MaxID))
	case cid == "":
		inv.Skipped = append(inv.Skipped, provider.Skip{Name: cname, Reason: "cluster has no id"})
		return nil
	}
	nodes := 0
	if cl.NoOfNodes.ok && cl.NoOfNodes.v > 0 {
		nodes = int(cl.NoOfNodes.v)
	}
	if len(cl.Workers) == 0 {
		if nodes > 0 {
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: cid, Name: cname,
				Reason: fmt.Sprintf("cluster reports %d nodes but no worker details", nodes)})
		}
		return nil
	}
	if nodes > len(cl.Workers) {
		inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: cid, Name: cname,
			Reason: fmt.Sprintf("cluster reports %d nodes but details for only %d", nodes, len(cl.Workers))})
	}
	spec := cl.SKU.Specs
	problem := spec.problem()
	if problem == "" && !cl.Status.Fits(provider.MaxWord) {
		problem = "the cluster's " + provider.TooLong("status", provider.MaxWord)
	}
	var shared provider.Host // the labels every worker of cl has
	shared.SetLabel(LabelLocation, firstOf(cl.SKU.Plan.Location.Within(provider.MaxName), strings.TrimSpace(location)))
	shared.SetLabel(LabelCluster, cname)
	shared.SetLabel(LabelPlan, spec.Name.Within(provider.MaxName))
	seen := make(map[string]bool)
	for i, raw := range cl.Workers {
		w, ok := decodeWorker(raw)
		if !ok {
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: fmt.Sprintf("%s/#%d", cid, i),
				Reason: "worker entry is not an object"})
			continue
		}
		nameText := firstText(w.Name, w.NodeName, w.Hostname)
		name := nameText.Within(provider.MaxName)
		// Without an id of its own a worker is known by its name.
		widText, widLimit := w.ID.Text, provider.MaxID
		if w.ID.Empty() {
			widText, widLimit = nameText, provider.MaxName
		}
		wid := widText.String()
		switch {
		case !widText.Fits(widLimit):
			return fmt.Errorf("a worker of cluster %s: its %s", cid, provider.TooLong("id", widLimit))
		case wid == "":
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: fmt.Sprintf("%s/#%d", cid, i),
				Reason: "worker has no id or name"})
			continue
		}
		ext := cid + "/" + wid
		skip := func(reason string) {
			inv.Skipped = append(inv.Skipped, provider.Skip{ExternalID: ext, Name: name, Reason: reason})
		}
		if seen[ext] {
			skip("duplicate worker id in cluster")
			continue
		}
		seen[ext] = true
		addr := firstText(w.PrivateIP, w.IPAddress, w.IP, w.NodeIP)
		switch {
		case !nameText.Fits(provider.MaxName):
			skip("the worker's " + provider.TooLong("name", provider.MaxName))
			continue
		case !addr.Fits(provider.MaxAddress):
			skip("the worker's " + provider.TooLong("address", provider.MaxAddress))
			continue
		case addr.Empty():
			skip("worker has no address")
			continue
		case !w.Status.Fits(provider.MaxWord):
			skip("the worker's " + provider.TooLong("status", provider.MaxWord))
			continue
		case problem != "":
			skip(problem)
			continue
		}
		if name == "" {
			name = ext
		}
		status, clStatus := w.Status.String(), cl.Status.String()
		h := provider.Host{
			ExternalID:  ext,
			Name:        name,
			IP:          addr.String(),
			State:       firstOf(status, clStatus),
			Running:     clStatus == "Running" && (status == "" || status == "Running"),
			CPUMemBytes: gib(spec.Memory.v),
			Fabric:      "cluster-" + cid,
			Labels:      maps.Clone(shared.Labels),
		}
		if gpus := int(spec.GPU.v); gpus > 0 {
			h.GPUModel = spec.GPUCardType.String()
			h.GPUs = gpus
			h.GPUMemBytes = gib(spec.GPUMemory.v / spec.GPU.v)
		}
		inv.Hosts = append(inv.Hosts, h)
	}
	return nil
}

func gib(gb float64) int64 { return int64(math.Round(gb * float64(provider.GiB))) }

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// firstText is the first of vs the provider sent, long or not.
func firstText(vs ...text) provider.Text {
	for _, v := range vs {
		if !v.Empty() {
			return v.Text
		}
	}
	return provider.Text{}
}

// envelope wraps every answer, good or bad.
type envelope struct {
	Code    number      `json:"code"`
	Data    shape       `json:"data"`
	Errors  errorsField `json:"errors"`
	Message text        `json:"message"`
	Detail  text        `json:"detail"` // what a bare framework error carries instead
}

// shape is the first byte of a JSON value ('[' for a list, 'n' for null),
// read without keeping the value: 0 when it is absent.
type shape byte

func (s *shape) UnmarshalJSON(b []byte) error {
	*s = shape(b[0])
	return nil
}

// maxErrors bounds the errors field kept for a message: it is cut to
// maxMessage anyway.
const maxErrors = 4 << 10

// errorsField is the envelope's errors, kept only up to maxErrors bytes.
type errorsField json.RawMessage

func (e *errorsField) UnmarshalJSON(b []byte) error {
	if len(b) <= maxErrors {
		*e = append((*e)[:0], b...)
	}
	return nil
}

// cluster, specs, plan and worker hold the strings of an answer as text,
// bounded; addCluster checks each against its field's bound.
type cluster struct {
	ID        text   `json:"id"`
	Name      text   `json:"name"`
	Status    text   `json:"status"`
	NoOfNodes number `json:"no_of_nodes"`
	SKU       struct {
		Specs specs `json:"specs"`
		Plan  plan  `json:"plan"`
	} `json:"sku_details"`
	Workers []json.RawMessage `json:"worker_nodes"`
}

// specs is a SKU per node: gpu GPUs, memory host GB, gpu_memory GPU GB in
// total (640 for 8 × H100 80 GB).
type specs struct {
	Name        text   `json:"name"`
	CPU         number `json:"cpu"`
	GPU         number `json:"gpu"`
	Memory      number `json:"memory"`
	GPUMemory   number `json:"gpu_memory"`
	GPUCardType text   `json:"gpu_card_type"`
}

// problem says why hosts of this SKU cannot be described, or "".
func (s specs) problem() string {
	switch {
	case !s.GPU.ok:
		return "SKU without gpu count"
	case s.GPU.v < 0 || s.GPU.v != math.Trunc(s.GPU.v):
		return fmt.Sprintf("SKU reports %v GPUs", s.GPU.v)
	case s.GPU.v > 0 && s.GPUCardType.Empty():
		return "GPU SKU without gpu_card_type"
	case !s.GPUCardType.Fits(provider.MaxGPUModel):
		return "SKU's " + provider.TooLong("gpu_card_type", provider.MaxGPUModel)
	case s.GPU.v > 0 && (!s.GPUMemory.ok || s.GPUMemory.v <= 0):
		return "GPU SKU without gpu_memory"
	case !s.Memory.ok || s.Memory.v <= 0:
		return "SKU without memory"
	}
	return ""
}

// plan is the SKU's price plan, read for its location only. It describes
// the hosts without sizing them, so a plan that is not an object says
// nothing rather than failing the pass.
type plan struct {
	Location text
}

func (p *plan) UnmarshalJSON(b []byte) error {
	var v struct {
		Location text `json:"location"`
	}
	if json.Unmarshal(b, &v) != nil {
		v.Location = text{}
	}
	p.Location = v.Location
	return nil
}

// worker is a worker_nodes entry. Its fields are not documented, so each
// is read from whichever of several names is present.
type worker struct {
	ID        text `json:"id"`
	Name      text `json:"name"`
	NodeName  text `json:"node_name"`
	Hostname  text `json:"hostname"`
	PrivateIP text `json:"private_ip"`
	IPAddress text `json:"ip_address"`
	IP        text `json:"ip"`
	NodeIP    text `json:"node_ip"`
	Status    text `json:"status"`
}

func decodeWorker(raw json.RawMessage) (worker, bool) {
	var w worker
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &w) != nil {
		return worker{}, false
	}
	return w, true
}

// text is a string the provider may also send as a number (ids) or null;
// anything else reads as "". It is read with provider.DecodeText's bound
// and without surrounding blanks.
type text struct{ provider.Text }

func (t *text) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) > 0 && b[0] == '"':
		v, err := provider.DecodeText(b)
		if err != nil {
			return err
		}
		t.Text = v.TrimSpace()
	case len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')):
		t.Text = provider.TextOf(string(b[:min(len(b), provider.MaxText+1)]))
	default:
		t.Text = provider.Text{}
	}
	return nil
}

// maxNumber bounds a number's text, quotes and blanks included: a float64
// needs far less.
const maxNumber = 400

// number is a JSON number the provider may also send as a numeric string;
// null or "" leave it unset.
type number struct {
	v  float64
	ok bool
}

func (n *number) UnmarshalJSON(b []byte) error {
	if len(b) > maxNumber {
		return fmt.Errorf("a value of %d bytes is not a number", len(b))
	}
	s := string(b)
	if s == "null" {
		*n = number{}
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s = strings.TrimSpace(s); s == "" {
			*n = number{}
			return nil
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		if len(s) > 40 {
			s = strings.ToValidUTF8(s[:40], "") + "…"
		}
		return fmt.Errorf("%q is not a number", s)
	}
	*n = number{v: v, ok: true}
	return nil
}
