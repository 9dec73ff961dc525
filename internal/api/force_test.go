package api_test

import (
	"fmt"
	"net/http"
	"testing"
)

// ?force named twice is refused rather than letting the first win: a proxy
// or client library appending its own value must not decide silently
// whether a busy node is deleted. Nothing changes on the refusal.
func TestDeleteForceTwice(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", map[string]any{"job": 7, "count": 1}))
	for _, q := range []string{"?force=true&force=false", "?force=false&force=true", "?force=true&force=true"} {
		r := b.do("DELETE", fmt.Sprintf("/v1/nodes/%d%s", pk, q), nil)
		if r.status != http.StatusBadRequest {
			t.Errorf("DELETE%s: %d, want 400: %s", q, r.status, r.body)
		}
	}
	if n := b.countNodes(); n != 1 {
		t.Fatalf("%d nodes after refused deletes, want 1", n)
	}
	b.must(http.StatusNoContent, b.do("DELETE", fmt.Sprintf("/v1/nodes/%d?force=true", pk), nil))
}
