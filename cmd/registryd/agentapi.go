package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// agentRequestTimeout bounds one request of the agent: a server that
// accepts a connection and never answers costs a pass no more.
const agentRequestTimeout = 30 * time.Second

// agentAPI is what the agent needs of the registry (agent.API), through
// the project's Go client. It translates the client's problem errors into
// the registry's sentinels, which the agent decides on.
type agentAPI struct {
	c *client.Client
}

// newAgentAPI is the client of REGISTRY_SERVER with the agent's token,
// held by a tokenKeeper: REGISTRY_TOKEN, or REGISTRY_TOKEN_FILE read for
// every request (a token rotated on disk is used from the next request
// on), or the keeper's latest renewal of either. The keeper's Run renews
// it through this client.
func newAgentAPI(cfg agentConfig, logger *slog.Logger) (agentAPI, *tokenKeeper, error) {
	configured := client.TokenSource(func(context.Context) (string, error) { return cfg.Token, nil })
	if cfg.TokenFile != "" {
		configured = client.TokenFile(cfg.TokenFile)
	}
	keeper := newTokenKeeper(configured, cfg.StatePath, logger)
	keeper.check = cfg.tokenCheck
	hc := agentHTTPClient(cfg.RootCAs)
	hc.Transport = refusals{next: cmp.Or[http.RoundTripper](hc.Transport, http.DefaultTransport), keeper: keeper}
	c, err := client.New(cfg.Server.String(), client.WithTokenSource(keeper.Token),
		client.WithUserAgent("registryd-agent"),
		client.WithHTTPClient(hc),
		// One retry for a blip (a 503 with Retry-After, a reset
		// connection); a longer outage is the agent's loop's to back off
		// from, so that it can log it and keep its pace.
		client.WithRetry(client.Retry{Attempts: 2}))
	if err != nil {
		return agentAPI{}, nil, fmt.Errorf("REGISTRY_SERVER: %w", err)
	}
	return agentAPI{c: c}, keeper, nil
}

// renewToken is the keeper's renewal: POST /v1/tokens/renew.
func (a agentAPI) renewToken(ctx context.Context) (client.RenewedToken, error) {
	ctx, cancel := context.WithTimeout(ctx, agentRequestTimeout)
	defer cancel()
	return a.c.RenewToken(ctx)
}

// refusals tells the keeper of every token the server refused (401).
type refusals struct {
	next   http.RoundTripper
	keeper *tokenKeeper
}

func (r refusals) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		if tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok {
			r.keeper.Refused(tok)
		}
	}
	return resp, err
}

// agentHTTPClient is the agent's HTTP client: each request bounded, and
// an https server's certificate checked against roots (nil: the system's).
func agentHTTPClient(roots *x509.CertPool) *http.Client {
	c := &http.Client{Timeout: agentRequestTimeout}
	if roots != nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		c.Transport = t
	}
	return c
}

// domainError maps the server's refusals to the registry's sentinels, as
// agent.API documents; every other error (no answer, 401, 429, 5xx) stays
// as it is, and means to the agent that the server cannot be used now.
func domainError(err error) error {
	var e *client.Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	kind, ok := map[int]error{
		http.StatusBadRequest:         registry.ErrInvalid,
		http.StatusForbidden:          registry.ErrForbidden,
		http.StatusNotFound:           registry.ErrNotFound,
		http.StatusConflict:           registry.ErrConflict,
		http.StatusPreconditionFailed: registry.ErrPrecondition,
	}[e.Status]
	if !ok {
		if e.Status == http.StatusUnauthorized {
			return fmt.Errorf("the registry refused the token (expired, revoked, or not an agent token?): %w", err)
		}
		return err
	}
	re := &registry.Error{Kind: kind, Message: e.Error(), ExistingPK: e.ExistingPK}
	for _, f := range e.Fields {
		re.Fields = append(re.Fields, registry.FieldError{Field: f.Field, Message: f.Message})
	}
	return re
}

func nodeOf(n client.Node) registry.Node {
	return registry.Node{
		PK:                 n.PK,
		IP:                 n.IP,
		Index:              int(n.Index),
		CPUMem:             n.CPUMem,
		DriverVersion:      n.DriverVersion,
		HardwareGeneration: n.HardwareGeneration,
		GPUMem:             n.GPUMem,
		GPUModel:           n.GPUModel,
		GPUUUID:            n.GPUUUID,
		Fabric:             n.Fabric,
		Labels:             labelsOf(n.Labels),
		LastSeen:           n.LastSeen,
		CurrentJob:         n.CurrentJob,
		Owner:              n.Owner,
		Source:             string(n.Source),
		Schedulable:        n.Schedulable,
		State:              registry.State(n.State),
		CordonReason:       n.CordonReason,
		LeaseExpiresAt:     n.LeaseExpiresAt,
		ExternalID:         n.ExternalID,
		ProviderState:      n.ProviderState,
		CreatedAt:          n.CreatedAt,
		UpdatedAt:          n.UpdatedAt,
	}
}

// labelsOf is the server's labels as the registry's type; the server
// only sends valid ones.
func labelsOf(m client.NodeLabels) registry.Labels {
	l, _ := registry.MakeLabels(m)
	return l
}

func (a agentAPI) CreateNode(ctx context.Context, s registry.NodeSpec) (registry.Node, bool, error) {
	var labels *client.NodeLabels
	if s.Labels.Len() > 0 {
		m := client.NodeLabels(s.Labels.Map())
		labels = &m
	}
	n, adopted, err := a.c.CreateNode(ctx, client.NodeCreate{IP: s.IP, Index: int32(s.Index), CPUMem: s.CPUMem,
		DriverVersion: s.DriverVersion, HardwareGeneration: s.HardwareGeneration, GPUMem: s.GPUMem,
		GPUModel: s.GPUModel, GPUUUID: s.GPUUUID, Fabric: s.Fabric, Labels: labels})
	if err != nil {
		return registry.Node{}, false, domainError(err)
	}
	return nodeOf(n), adopted, nil
}

func (a agentAPI) GetNodeAs(ctx context.Context, pk int64) (registry.Node, error) {
	n, err := a.c.GetNode(ctx, pk, client.AsNode(pk))
	if err != nil {
		return registry.Node{}, domainError(err)
	}
	return nodeOf(n), nil
}

func (a agentAPI) PatchNodeAs(ctx context.Context, pk int64, p registry.NodePatch) (registry.Node, error) {
	var cp client.NodePatch
	if p.IP.Set {
		cp.IP = &p.IP.Value
	}
	if p.Index.Set {
		cp.Index = client.Ptr(int32(p.Index.Value))
	}
	if p.CPUMem.Set {
		cp.CPUMem = &p.CPUMem.Value
	}
	if p.DriverVersion.Set {
		cp.DriverVersion = &p.DriverVersion.Value
	}
	cp.HardwareGeneration = nullable(p.HardwareGeneration)
	cp.GPUMem = nullable(p.GPUMem)
	cp.GPUModel = nullable(p.GPUModel)
	cp.GPUUUID = nullable(p.GPUUUID)
	cp.Fabric = nullable(p.Fabric)
	if p.Labels.Set {
		cp.Labels = p.Labels.Values
	}
	n, err := a.c.PatchNode(ctx, pk, cp, client.AsNode(pk))
	if err != nil {
		return registry.Node{}, domainError(err)
	}
	return nodeOf(n), nil
}

func nullable[T any](o registry.Optional[T]) client.Nullable[T] {
	switch {
	case !o.Set:
		return client.Nullable[T]{}
	case o.Null:
		return client.Null[T]()
	default:
		return client.Value(o.Value)
	}
}

func (a agentAPI) DeleteNodeAs(ctx context.Context, pk int64) error {
	return domainError(a.c.DeleteNode(ctx, pk, client.AsNode(pk)))
}

// Ping takes the Node-Id check from the replica's node cache as it is
// (Cache-Control: max-stale, at most 2 s behind) instead of waiting for a
// consistent read: a heartbeat of a node deleted or handed over in the
// last 2 s may be answered 200, and the next pass's is refused and set
// right; the server checks a refusal by a consistent read, so a node just
// adopted is never refused. That is the whole cost, while every heartbeat
// saves the wait.
func (a agentAPI) Ping(ctx context.Context, pk int64) error {
	_, err := a.c.Ping(ctx, client.AsNode(pk), client.MaxStale())
	return domainError(err)
}

func (a agentAPI) HardwareByName(ctx context.Context, name string) (int64, bool, error) {
	hs, err := a.c.ListHardware(ctx, client.HardwareFilter{Name: &name})
	if err != nil {
		return 0, false, domainError(err)
	}
	for _, h := range hs {
		if h.Name == name {
			return h.PK, true, nil
		}
	}
	return 0, false, nil
}
