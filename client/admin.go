package client

import (
	"context"
	"io"
	"net/http"
)

// ListAudit returns audit log entries matching f, oldest first: at most
// f.Limit (default 100); page with After (the last id received). Admins.
func (c *Client) ListAudit(ctx context.Context, f AuditFilter, opts ...CallOption) ([]AuditEntry, error) {
	cl := newCall(opts)
	var out []AuditEntry
	resp, err := c.raw.ListAudit(cl.ctx(ctx), f, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// RevokeTokens revokes every token of r.Sub issued until now, or the one
// token r.JTI (admins). Every replica refuses them within seconds.
func (c *Client) RevokeTokens(ctx context.Context, r RevokeRequest, opts ...CallOption) (Revocation, error) {
	cl := newCall(opts)
	var out Revocation
	resp, err := c.raw.RevokeTokens(cl.ctx(ctx), r, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// RenewToken exchanges the agent token the client sends, while it is
// valid, for a fresh one (POST /v1/tokens/renew). The client keeps using
// its TokenSource: storing the new token where that source reads it is
// the caller's job.
func (c *Client) RenewToken(ctx context.Context, opts ...CallOption) (RenewedToken, error) {
	cl := newCall(opts)
	var out RenewedToken
	resp, err := c.raw.RenewToken(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// Healthz is the liveness probe (no token needed).
func (c *Client) Healthz(ctx context.Context, opts ...CallOption) (Health, error) {
	cl := newCall(opts)
	var out Health
	resp, err := c.raw.Healthz(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// HeadHealthz is Healthz without the body.
func (c *Client) HeadHealthz(ctx context.Context, opts ...CallOption) error {
	cl := newCall(opts)
	resp, err := c.raw.HeadHealthz(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}

// Readyz is the readiness probe: an *Error with status 503 says why the
// server cannot serve (no token needed).
func (c *Client) Readyz(ctx context.Context, opts ...CallOption) (Ready, error) {
	cl := newCall(opts)
	var out Ready
	resp, err := c.raw.Readyz(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// HeadReadyz is Readyz without the body.
func (c *Client) HeadReadyz(ctx context.Context, opts ...CallOption) error {
	cl := newCall(opts)
	resp, err := c.raw.HeadReadyz(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}

// maxOpenAPIBytes bounds the document OpenAPI reads.
const maxOpenAPIBytes = 16 << 20

// OpenAPI returns the server's API contract, openapi.yaml.
func (c *Client) OpenAPI(ctx context.Context, opts ...CallOption) ([]byte, error) {
	cl := newCall(opts)
	resp, err := c.raw.GetOpenAPI(cl.ctx(ctx), cl.editors()...)
	if err == nil && resp.StatusCode == http.StatusOK {
		defer resp.Body.Close()
		if cl.into != nil {
			*cl.into = Response{Status: resp.StatusCode, Header: resp.Header, RequestID: resp.Header.Get("X-Request-Id"), Attempts: max(cl.attempts, 1)}
		}
		return io.ReadAll(io.LimitReader(resp.Body, maxOpenAPIBytes))
	}
	_, err = cl.finish(resp, err, nil)
	return nil, err
}

// HeadOpenAPI is OpenAPI without the body.
func (c *Client) HeadOpenAPI(ctx context.Context, opts ...CallOption) error {
	cl := newCall(opts)
	resp, err := c.raw.HeadOpenAPI(cl.ctx(ctx), cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}
