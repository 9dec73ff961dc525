package api_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/registry"
)

// A pk is spelled one way, in the path and in Node-Id alike: a positive
// int64 in plain decimal. Every other spelling is a 400 naming the pk,
// as openapi.yaml says (it declares both integer, minimum 1).
func TestPKSyntax(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	hw := b.createHardware("H100")
	own := strconv.FormatInt(pk, 10)
	bad := []string{"0", "-3", "+" + own, "0" + own, own + ".0", "1.5", "abc", "1e3", "0x1", "%2B" + own,
		"9223372036854775808", "99999999999999999999", "٣"}
	for _, v := range bad {
		for _, path := range []string{"/v1/nodes/", "/v1/hardware/"} {
			r := b.must(http.StatusBadRequest, b.do("GET", path+v, nil))
			if d := r.object(t)["detail"].(string); !strings.Contains(d, "pk must be a positive integer") || !strings.Contains(d, strconv.Quote(v)) {
				t.Errorf("GET %s%s: detail %q does not name the pk", path, v, d)
			}
		}
		if strings.HasPrefix(v, "%") {
			continue // a path escape, not a header value
		}
		r := b.must(http.StatusBadRequest, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", v))
		if d := r.object(t)["detail"].(string); !strings.Contains(d, "Node-Id header must be a node pk: a positive integer") {
			t.Errorf("Node-Id %q: detail %q", v, d)
		}
	}
	// The one spelling works in both places; the largest pk is a pk.
	b.must(http.StatusOK, b.do("GET", "/v1/nodes/"+own, nil, "Node-Id", own))
	b.must(http.StatusOK, b.do("GET", fmt.Sprintf("/v1/hardware/%d", hw), nil, "Node-Id", own))
	b.must(http.StatusNotFound, b.do("GET", "/v1/nodes/9223372036854775807", nil))
	b.must(http.StatusNotFound, b.do("GET", "/v1/nodes/ping", nil, "Node-Id", "9223372036854775807"))

	// Every pk route reads the pk the same way, after the role: a role
	// that may not write gets its 403 first, as documented.
	for _, m := range []string{"GET", "HEAD", "PUT", "PATCH", "DELETE"} {
		for _, path := range []string{"/v1/nodes/+" + own, "/v1/hardware/+" + own} {
			b.must(http.StatusBadRequest, b.do(m, path, nil))
		}
	}
	b.token = tokenFor(t, "r", registry.RoleReader)
	b.must(http.StatusForbidden, b.do("PUT", "/v1/nodes/abc", validNode()))
	b.must(http.StatusBadRequest, b.do("GET", "/v1/nodes/abc", nil))
}
