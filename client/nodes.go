package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/registryd/registryd/client/internal/oapi"
)

// Ping answers with the server's time. With AsNode it is the node's
// heartbeat: what an agent sends every interval.
func (c *Client) Ping(ctx context.Context, opts ...CallOption) (Ping, error) {
	cl := newCall(opts)
	var out Ping
	resp, err := c.raw.PingNodes(cl.ctx(ctx), &oapi.PingNodesParams{NodeID: cl.nodeID, CacheControl: cl.cacheControl}, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// HeadPing is Ping without the body (HEAD /v1/nodes/ping); with AsNode
// it is a heartbeat too.
func (c *Client) HeadPing(ctx context.Context, opts ...CallOption) error {
	cl := newCall(opts)
	resp, err := c.raw.HeadPingNodes(cl.ctx(ctx), &oapi.HeadPingNodesParams{NodeID: cl.nodeID, CacheControl: cl.cacheControl}, cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}

// ListNodes returns the nodes that match every filter of f, by pk. With
// no Limit it returns every matching node; page with Limit and After (the
// last pk received). The list is consistent unless MaxStale or NoCache
// says otherwise.
func (c *Client) ListNodes(ctx context.Context, f NodeFilter, opts ...CallOption) ([]Node, error) {
	nodes, _, err := c.listNodes(ctx, f, opts)
	return nodes, err
}

// NodeList is a list of nodes and the position in the change feed it
// reflects.
type NodeList struct {
	// Nodes are the matching nodes, by pk.
	Nodes []Node
	// EventID is the list's position: every event with an id up to it is
	// reflected in Nodes; none after when the server answered from its
	// node cache, while a list read from PostgreSQL (NoCache) may show
	// some later changes too. Watch with After set to it for the changes
	// since (WatchOptions.After); an Informer applies them by version.
	EventID int64
}

// ErrNoPosition is what ListNodesWithPosition returns when the answer
// carried no feed position (X-Event-Id): a server older than the
// contract, or something between the client and the server that drops
// the header.
var ErrNoPosition = errors.New("client: the list carried no X-Event-Id position")

// ListNodesWithPosition is ListNodes and the position the list reflects
// (its X-Event-Id), from which a watch goes on with no gap and no
// duplicate. Each page of a paged list (Limit) has a position of its
// own; for one position over the whole fleet list without Limit. An
// answer without a position is an error wrapping ErrNoPosition.
func (c *Client) ListNodesWithPosition(ctx context.Context, f NodeFilter, opts ...CallOption) (NodeList, error) {
	nodes, header, err := c.listNodes(ctx, f, opts)
	if err != nil {
		return NodeList{}, err
	}
	raw := header.Get("X-Event-Id")
	id, perr := strconv.ParseInt(raw, 10, 64)
	if raw == "" || perr != nil || id < 0 {
		return NodeList{}, fmt.Errorf("%w (got %q)", ErrNoPosition, raw)
	}
	return NodeList{Nodes: nodes, EventID: id}, nil
}

func (c *Client) listNodes(ctx context.Context, f NodeFilter, opts []CallOption) ([]Node, http.Header, error) {
	cl := newCall(opts)
	var out []Node
	resp, err := c.raw.ListNodes(cl.ctx(ctx), &oapi.ListNodesParams{CacheControl: cl.cacheControl}, f, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, cl.header, err
}

// CreateNode registers a node. An agent registering the (ip, index) of a
// node the sync worker imported with no owner adopts it instead: the
// answer is that node and adopted is true. A pair another node holds is
// an *Error with status 409 and ExistingPK naming it.
func (c *Client) CreateNode(ctx context.Context, n NodeCreate, opts ...CallOption) (node Node, adopted bool, err error) {
	cl := newCall(opts)
	resp, err := c.raw.CreateNode(cl.ctx(ctx), n, cl.editors()...)
	status, err := cl.finish(resp, err, &node, http.StatusCreated, http.StatusOK)
	return node, status == http.StatusOK, err
}

// GetNode returns the node pk. With IfNoneMatch it returns ErrNotModified
// while the node's ETag is unchanged. The read is consistent unless
// MaxStale or NoCache says otherwise.
func (c *Client) GetNode(ctx context.Context, pk int64, opts ...CallOption) (Node, error) {
	var out Node
	if err := checkPK("node", pk); err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.GetNode(cl.ctx(ctx), pk, &oapi.GetNodeParams{NodeID: cl.nodeID, IfNoneMatch: cl.ifNoneMatch, CacheControl: cl.cacheControl}, cl.editors()...)
	status, err := cl.finish(resp, err, &out, http.StatusOK, http.StatusNotModified)
	if err == nil && status == http.StatusNotModified {
		return out, ErrNotModified
	}
	return out, err
}

// HeadNode returns the ETag of node pk without its body (ErrNotModified
// with a matching IfNoneMatch).
func (c *Client) HeadNode(ctx context.Context, pk int64, opts ...CallOption) (etag string, err error) {
	if err := checkPK("node", pk); err != nil {
		return "", err
	}
	cl := newCall(opts)
	resp, err := c.raw.HeadNode(cl.ctx(ctx), pk, &oapi.HeadNodeParams{NodeID: cl.nodeID, IfNoneMatch: cl.ifNoneMatch, CacheControl: cl.cacheControl}, cl.editors()...)
	if resp != nil {
		etag = resp.Header.Get("ETag")
	}
	status, err := cl.finish(resp, err, nil, http.StatusOK, http.StatusNotModified)
	if err == nil && status == http.StatusNotModified {
		return etag, ErrNotModified
	}
	return etag, err
}

// UpdateNode replaces the six writable fields of node pk (PUT). An agent
// acts as its node: AsNode(pk).
func (c *Client) UpdateNode(ctx context.Context, pk int64, n NodeUpdate, opts ...CallOption) (Node, error) {
	var out Node
	if err := checkPK("node", pk); err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.UpdateNode(cl.ctx(ctx), pk, &oapi.UpdateNodeParams{NodeID: cl.nodeID, IfMatch: cl.ifMatch}, n, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// PatchNode changes the members p sets (a JSON merge patch). An agent
// acts as its node: AsNode(pk).
func (c *Client) PatchNode(ctx context.Context, pk int64, p NodePatch, opts ...CallOption) (Node, error) {
	var out Node
	if err := checkPK("node", pk); err != nil {
		return out, err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.PatchNodeWithBody(cl.ctx(ctx), pk, &oapi.PatchNodeParams{NodeID: cl.nodeID, IfMatch: cl.ifMatch},
		"application/merge-patch+json", bytes.NewReader(body), cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// DeleteNode deletes node pk. A node holding a job is kept (409): release
// it first, or ForceDeleteNode as an admin.
func (c *Client) DeleteNode(ctx context.Context, pk int64, opts ...CallOption) error {
	return c.deleteNode(ctx, pk, false, opts)
}

// ForceDeleteNode deletes node pk even while it holds a job (admins only).
func (c *Client) ForceDeleteNode(ctx context.Context, pk int64, opts ...CallOption) error {
	return c.deleteNode(ctx, pk, true, opts)
}

func (c *Client) deleteNode(ctx context.Context, pk int64, force bool, opts []CallOption) error {
	if err := checkPK("node", pk); err != nil {
		return err
	}
	cl := newCall(opts)
	params := &oapi.DeleteNodeParams{NodeID: cl.nodeID, IfMatch: cl.ifMatch}
	if force {
		params.Force = Ptr("true")
	}
	resp, err := c.raw.DeleteNode(cl.ctx(ctx), pk, params, cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusNoContent)
	return err
}

// ClaimNodes gives Count free nodes matching the claim's filters to its
// Job, all or none: too few is an *Error with status 409 (ErrConflict),
// and nothing is held. Never retried: claims for one job add up.
func (c *Client) ClaimNodes(ctx context.Context, claim NodeClaim, opts ...CallOption) (ClaimResult, error) {
	cl := newCall(opts)
	var out ClaimResult
	resp, err := c.raw.ClaimNodes(cl.ctx(ctx), &oapi.ClaimNodesParams{}, claim, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// ReleaseNodes gives back the nodes of r.Job (r.Nodes, or all of them).
func (c *Client) ReleaseNodes(ctx context.Context, r NodeRelease, opts ...CallOption) (ReleaseResult, error) {
	cl := newCall(opts)
	var out ReleaseResult
	resp, err := c.raw.ReleaseNodes(cl.ctx(ctx), &oapi.ReleaseNodesParams{}, r, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// RenewLeases extends every lease r.Job holds to r.LeaseSeconds from now
// and returns every node the job holds (nodes held without a lease are
// returned unchanged). A job that holds nothing, or only leases that ran
// out, is an *Error with status 404 (ErrNotFound). Renewing twice is
// harmless, so it is retried like a read.
func (c *Client) RenewLeases(ctx context.Context, r NodeRenew, opts ...CallOption) (RenewResult, error) {
	cl := newCall(opts)
	var out RenewResult
	resp, err := c.raw.RenewLeases(cl.ctx(ctx), &oapi.RenewLeasesParams{}, r, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// CordonNodes takes nodes out of scheduling (admins only): cd.Nodes, or
// the nodes cd's filters match (at most 1000, or an *Error with status
// 409). A node a job holds drains: the job keeps it, and it is cordoned,
// never free, once released. Pks that name no node come back in
// NotCordoned.
func (c *Client) CordonNodes(ctx context.Context, cd NodeCordon, opts ...CallOption) (CordonResult, error) {
	cl := newCall(opts)
	var out CordonResult
	resp, err := c.raw.CordonNodes(cl.ctx(ctx), &oapi.CordonNodesParams{}, cd, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// UncordonNodes puts u.Nodes back into scheduling (admins only). Pks that
// name no node, or a node that is not cordoned, come back in
// NotUncordoned.
func (c *Client) UncordonNodes(ctx context.Context, u NodeUncordon, opts ...CallOption) (UncordonResult, error) {
	cl := newCall(opts)
	var out UncordonResult
	resp, err := c.raw.UncordonNodes(cl.ctx(ctx), &oapi.UncordonNodesParams{}, u, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}
