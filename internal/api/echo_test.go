package api_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// cut rewrites an RFC 3339 time as a client that keeps only layout's
// precision would send it back (Go's time.RFC3339 is what ogen writes,
// JavaScript's Date keeps milliseconds).
func cut(t *testing.T, v any, layout string) string {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, v.(string))
	if err != nil {
		t.Fatal(err)
	}
	return at.Format(layout)
}

// GET → edit → PUT works for clients that write times with fewer digits
// than the server sent: an echo is the stored instant cut to the
// precision sent. And read-only fields are best left out: that works too.
func TestEchoPrecision(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	hw := b.createHardware("H100")
	stamp := "2026-01-02 03:04:05.678901+00"
	b.exec(`UPDATE nodes SET created_at = $1, updated_at = $1 WHERE pk = $2`, stamp, pk)
	b.exec(`UPDATE hardware_generations SET created_at = $1, updated_at = $1 WHERE pk = $2`, stamp, hw)

	tables := map[string]string{"nodes": "nodes", "hardware": "hardware_generations"}
	for _, res := range []struct {
		kind, path, field string
		pk                int64
	}{
		{"nodes", fmt.Sprintf("/v1/nodes/%d", pk), "driver_version", pk},
		{"hardware", fmt.Sprintf("/v1/hardware/%d", hw), "name", hw},
	} {
		reset := func(at string) {
			b.exec(`UPDATE `+tables[res.kind]+` SET created_at = $1, updated_at = $1 WHERE pk = $2`, at, res.pk)
		}
		for i, layout := range []string{time.RFC3339, "2006-01-02T15:04:05.000Z07:00", "2006-01-02T15:04:05.0Z07:00", time.RFC3339Nano} {
			for _, method := range []string{"PUT", "PATCH"} {
				reset(stamp)
				read := b.must(http.StatusOK, b.do("GET", res.path, nil)).object(t)
				edited := map[string]any{}
				for k, v := range read {
					edited[k] = v
				}
				edited["created_at"] = cut(t, read["created_at"], layout)
				edited["updated_at"] = cut(t, read["updated_at"], layout)
				edited[res.field] = fmt.Sprint("v", i, method)
				got := b.must(http.StatusOK, b.do(method, res.path, edited)).object(t)
				if got[res.field] != edited[res.field] {
					t.Errorf("%s %s with %s times: %s = %v", method, res.path, layout, res.field, got[res.field])
				}
				// Another write a second later: the same echo is stale now
				// (a node's version too: the write above moved it).
				reset("2026-01-02 03:04:06.678901+00")
				edited[res.field] = fmt.Sprint("w", i, method)
				r := b.must(http.StatusBadRequest, b.do(method, res.path, edited))
				want := []string{"created_at", "updated_at"}
				if res.kind == "nodes" {
					want = append(want, "version")
				}
				if diff := cmp.Diff(want, r.problemFields(t)); diff != "" {
					t.Errorf("%s %s with a stale %s echo: fields (-want +got):\n%s", method, res.path, layout, diff)
				}
			}
		}
	}

	// At second precision the second itself must still match; digits are
	// cut, not rounded, as clients format them.
	node := b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/nodes/%d", pk), nil)).object(t)
	b.exec(`UPDATE nodes SET created_at = $1 WHERE pk = $2`, stamp, pk)
	for _, v := range []string{"2026-01-02T03:04:06Z", "2026-01-02T03:04:04Z", "2026-01-02T03:04:05.7Z", "2026-01-02T03:04:05.679Z"} {
		node["created_at"] = v
		r := b.must(http.StatusBadRequest, b.do("PUT", fmt.Sprintf("/v1/nodes/%d", pk), node))
		if diff := cmp.Diff([]string{"created_at"}, r.problemFields(t)); diff != "" {
			t.Errorf("created_at %s: fields (-want +got):\n%s", v, diff)
		}
	}
	for _, v := range []string{"2026-01-02T03:04:05Z", "2026-01-02T05:04:05+02:00", "2026-01-02T03:04:05.6Z", "2026-01-02T03:04:05.678901000Z"} {
		node["created_at"] = v
		b.must(http.StatusOK, b.do("PUT", fmt.Sprintf("/v1/nodes/%d", pk), node))
	}

	// Read-only fields left out: the simplest GET → edit → PUT.
	put := map[string]any{}
	for _, k := range []string{"ip", "index", "cpu_mem", "driver_version", "hardware_generation", "gpu_mem"} {
		put[k] = node[k]
	}
	put["driver_version"] = "left-out"
	got := b.must(http.StatusOK, b.do("PUT", fmt.Sprintf("/v1/nodes/%d", pk), put)).object(t)
	if got["driver_version"] != "left-out" {
		t.Errorf("PUT without read-only fields: %v", got)
	}
	b.must(http.StatusOK, b.do("PUT", fmt.Sprintf("/v1/hardware/%d", hw), map[string]any{"name": "B200"}))
}

// The lifecycle's read-only fields echo like the others: the values read are
// accepted, anything else is a 400 naming the field.
func TestEchoLifecycleFields(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	b.exec(`UPDATE nodes SET current_job = 9, lease_expires_at = '2030-01-02 03:04:05.5+00', cordon_reason = 'fan' WHERE pk = $1`, pk)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	read := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	if read["state"] != "draining" || read["cordon_reason"] != "fan" || read["lease_expires_at"] != "2030-01-02T03:04:05.5Z" {
		t.Fatalf("read %v", read)
	}
	b.must(http.StatusOK, b.do("PUT", path, read))
	for field, v := range map[string]any{
		"state": "free", "cordon_reason": nil, "lease_expires_at": "2030-01-02T03:04:06Z",
	} {
		edited := map[string]any{}
		for k, v := range read {
			edited[k] = v
		}
		edited[field] = v
		r := b.must(http.StatusBadRequest, b.do("PATCH", path, edited))
		if got := r.problemFields(t); !cmp.Equal(got, []string{field}) {
			t.Errorf("echo of %s = %v: problem names %v", field, v, got)
		}
	}
	b.exec(`UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, cordon_reason = NULL WHERE pk = $1`, pk)
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"state": "free", "cordon_reason": nil, "lease_expires_at": nil}))
	b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"state": "lost"}))
}

// A node's version echoes like updated_at: the version read is accepted,
// any other is a 400 naming it, and leaving it out is always fine.
func TestEchoVersion(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	r := b.must(http.StatusOK, b.do("GET", path, nil))
	read := r.object(t)
	if tag := fmt.Sprintf(`"%v"`, read["version"]); tag != r.header.Get("ETag") {
		t.Fatalf("version %v, ETag %s: the document's version is not the ETag's", read["version"], r.header.Get("ETag"))
	}
	read["driver_version"] = "560.1"
	got := b.must(http.StatusOK, b.do("PUT", path, read)).object(t)
	if got["version"] == read["version"] {
		t.Fatalf("version %v unchanged by a write", got["version"])
	}
	for _, v := range []any{read["version"], got["version"].(float64) + 1, "3", nil} {
		r := b.must(http.StatusBadRequest, b.do("PATCH", path, map[string]any{"version": v, "driver_version": "x"}))
		if fields := r.problemFields(t); !cmp.Equal(fields, []string{"version"}) {
			t.Errorf("echo of version %v: problem names %v", v, fields)
		}
	}
	b.must(http.StatusOK, b.do("PATCH", path, map[string]any{"version": got["version"], "driver_version": "y"}))
}
