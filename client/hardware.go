package client

import (
	"context"
	"net/http"

	"github.com/registryd/registryd/client/internal/oapi"
)

// ListHardware returns the hardware generations, by pk: every one, or the
// one named f.Name (an empty list when there is none).
func (c *Client) ListHardware(ctx context.Context, f HardwareFilter, opts ...CallOption) ([]Hardware, error) {
	cl := newCall(opts)
	var out []Hardware
	resp, err := c.raw.ListHardware(cl.ctx(ctx), f, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// CreateHardware creates a hardware generation (admins). A name taken is
// an *Error with status 409 and ExistingPK naming its holder.
func (c *Client) CreateHardware(ctx context.Context, h HardwareCreate, opts ...CallOption) (Hardware, error) {
	cl := newCall(opts)
	var out Hardware
	resp, err := c.raw.CreateHardware(cl.ctx(ctx), h, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusCreated)
	return out, err
}

// GetHardware returns hardware generation pk, with how many nodes use it.
// With IfNoneMatch it returns ErrNotModified while its ETag is unchanged.
func (c *Client) GetHardware(ctx context.Context, pk int64, opts ...CallOption) (Hardware, error) {
	var out Hardware
	if err := checkPK("hardware generation", pk); err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.GetHardware(cl.ctx(ctx), pk, &oapi.GetHardwareParams{IfNoneMatch: cl.ifNoneMatch}, cl.editors()...)
	status, err := cl.finish(resp, err, &out, http.StatusOK, http.StatusNotModified)
	if err == nil && status == http.StatusNotModified {
		return out, ErrNotModified
	}
	return out, err
}

// HeadHardware returns the ETag of hardware generation pk without its
// body (ErrNotModified with a matching IfNoneMatch).
func (c *Client) HeadHardware(ctx context.Context, pk int64, opts ...CallOption) (etag string, err error) {
	if err := checkPK("hardware generation", pk); err != nil {
		return "", err
	}
	cl := newCall(opts)
	resp, err := c.raw.HeadHardware(cl.ctx(ctx), pk, &oapi.HeadHardwareParams{IfNoneMatch: cl.ifNoneMatch}, cl.editors()...)
	if resp != nil {
		etag = resp.Header.Get("ETag")
	}
	status, err := cl.finish(resp, err, nil, http.StatusOK, http.StatusNotModified)
	if err == nil && status == http.StatusNotModified {
		return etag, ErrNotModified
	}
	return etag, err
}

// UpdateHardware renames hardware generation pk (PUT; admins).
func (c *Client) UpdateHardware(ctx context.Context, pk int64, h HardwareUpdate, opts ...CallOption) (Hardware, error) {
	var out Hardware
	if err := checkPK("hardware generation", pk); err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.UpdateHardware(cl.ctx(ctx), pk, &oapi.UpdateHardwareParams{IfMatch: cl.ifMatch}, h, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// PatchHardware changes the members p sets (a merge patch; admins).
func (c *Client) PatchHardware(ctx context.Context, pk int64, p HardwarePatch, opts ...CallOption) (Hardware, error) {
	var out Hardware
	if err := checkPK("hardware generation", pk); err != nil {
		return out, err
	}
	cl := newCall(opts)
	resp, err := c.raw.PatchHardwareWithApplicationMergePatchPlusJSONBody(cl.ctx(ctx), pk,
		&oapi.PatchHardwareParams{IfMatch: cl.ifMatch}, p, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}

// DeleteHardware deletes hardware generation pk (admins); one that nodes
// use is kept (409).
func (c *Client) DeleteHardware(ctx context.Context, pk int64, opts ...CallOption) error {
	if err := checkPK("hardware generation", pk); err != nil {
		return err
	}
	cl := newCall(opts)
	resp, err := c.raw.DeleteHardware(cl.ctx(ctx), pk, &oapi.DeleteHardwareParams{IfMatch: cl.ifMatch}, cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusNoContent)
	return err
}

// ListFabrics answers, per fabric, what the nodes the filters select hold:
// hosts, nodes by state, and how many hosts have each number of free
// nodes (the nodes without a fabric last, Fabric nil).
func (c *Client) ListFabrics(ctx context.Context, f FabricListFilter, opts ...CallOption) ([]FabricCapacity, error) {
	cl := newCall(opts)
	var out []FabricCapacity
	resp, err := c.raw.ListFabrics(cl.ctx(ctx), f, cl.editors()...)
	_, err = cl.finish(resp, err, &out, http.StatusOK)
	return out, err
}
