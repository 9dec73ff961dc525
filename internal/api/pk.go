package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
)

// pkSyntax says what parsePK accepts, for problem details.
const pkSyntax = "a positive integer in plain decimal (digits only, no sign, no leading zero, at most 9223372036854775807)"

// parsePK reads a pk as the API spells it, in a path (/v1/nodes/{pk}) and
// in Node-Id alike: a positive int64 in plain decimal. "+24", "024", "-3",
// "0", "1.5", "abc" and numbers beyond int64 are not pks, wherever they
// appear, so the path and the header can never disagree on a value.
func parsePK(raw string) (int64, bool) {
	if raw == "" || len(raw) > 19 || raw[0] < '1' || raw[0] > '9' {
		return 0, false
	}
	for i := 1; i < len(raw); i++ {
		if raw[i] < '0' || raw[i] > '9' {
			return 0, false
		}
	}
	pk, err := strconv.ParseInt(raw, 10, 64)
	return pk, err == nil
}

// pathPK reads the {pk} of the path: anything but a pk is a 400 naming it
// (the spec declares pk a positive int64; a value a client could not have
// taken from a response is malformed, not missing).
func pathPK(r *http.Request, what string) (int64, error) {
	raw := chi.URLParam(r, "pk")
	pk, ok := parsePK(raw)
	if !ok {
		return 0, badRequest(what + " pk must be " + pkSyntax + ", not " + strconv.Quote(raw))
	}
	return pk, nil
}

// methods are the methods the router serves, in the order Allow lists them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// allowed lists the methods path supports. The {pk} routes match any
// segment, so that a malformed pk gets a 400 rather than a 404; but a
// segment that names an action (/v1/nodes/list, /v1/nodes/ping, ...) is
// that action's path, never a pk: when some method routes path to an
// action, only the actions' methods count.
func (s *Server) allowed(path string) (list []string, action bool) {
	var actions, pks []string
	for _, m := range methods {
		rctx := chi.NewRouteContext()
		if !s.router.Match(rctx, m, path) {
			continue
		}
		if rctx.URLParam("pk") != "" {
			pks = append(pks, m)
		} else {
			actions = append(actions, m)
		}
	}
	if len(actions) > 0 {
		return actions, true
	}
	return pks, false
}

// methodNotAllowed answers 405 with the Allow header RFC 9110 asks for;
// chi leaves it out when the handler is custom.
func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	allowed, _ := s.allowed(r.URL.Path)
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	s.writeError(w, r, &httpError{status: http.StatusMethodNotAllowed,
		detail: "this endpoint does not support " + r.Method + "; it allows " + strings.Join(allowed, ", ")})
}

// notAction sends a request the {pk} routes caught for an action's path
// (GET /v1/nodes/list, DELETE /v1/nodes/ping) to 405, as if those routes
// did not match it. A well-formed pk never names an action, so only a
// malformed one costs the look-up.
func (s *Server) notAction(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := parsePK(chi.URLParam(r, "pk")); !ok {
			if _, action := s.allowed(r.URL.Path); action {
				s.methodNotAllowed(w, r)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
