package api_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/store"
)

// A write that waits on a row lock longer than the lock timeout is a 503
// with code busy and Retry-After, nothing changed. Fault caught (tried
// once): the lock wait answered as unavailable.
func TestLockWaitIsBusy(t *testing.T) {
	t.Parallel()
	b := anotherOn(t, store.Options{LockTimeout: 200 * time.Millisecond})
	pk := b.createNode(map[string]any{"ip": "10.0.0.1", "cpu_mem": 1, "driver_version": "d"})
	_, release := b.lockRows(pk)
	defer release()
	r := b.must(http.StatusServiceUnavailable, b.do("PATCH", "/v1/nodes/"+strconv.FormatInt(pk, 10), `{"driver_version":"e"}`,
		"Content-Type", "application/merge-patch+json"))
	if code := problemCode(t, r); code != "busy" || r.header.Get("Retry-After") == "" {
		t.Errorf("a lock wait: code %q, Retry-After %q; want busy and a Retry-After", code, r.header.Get("Retry-After"))
	}
}

// An error the server did not expect (here: a table gone from under it)
// is a 500 with code internal_error that names no internals (the spec
// check refuses SQLSTATE, pgx and the like in error bodies).
func TestUnexpectedErrorIsInternal(t *testing.T) {
	b := setup(t)
	b.exec(`ALTER TABLE jobs RENAME TO jobs_moved`)
	r := b.must(http.StatusInternalServerError, b.do("POST", "/v1/nodes/claim", `{"job":1}`))
	if code := problemCode(t, r); code != "internal_error" {
		t.Errorf("an unexpected error: code %q", code)
	}
}
