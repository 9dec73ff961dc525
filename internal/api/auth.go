package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/registryd/registryd/internal/registry"
)

// Authenticator verifies a bearer token. *auth.Verifier implements it. Its
// error text is shown to the caller, so it must never contain the token.
type Authenticator interface {
	Verify(token string) (registry.Principal, error)
}

// Heartbeats records that a node acted. *heartbeat.Recorder implements it.
type Heartbeats interface {
	Record(pk int64)
}

const (
	principalKey ctxKey = iota + 100
	actingNodeKey
)

func principalFrom(ctx context.Context) registry.Principal {
	if st := stateOf(ctx); st != nil && st.authed {
		return st.principal
	}
	p, _ := ctx.Value(principalKey).(registry.Principal)
	return p
}

// actingNode is the node named by an allowed Node-Id header, or nil.
func actingNode(ctx context.Context) *int64 {
	if st := stateOf(ctx); st != nil && st.acting != 0 {
		pk := st.acting
		return &pk
	}
	pk, _ := ctx.Value(actingNodeKey).(*int64)
	return pk
}

// actor is who performs this request's write, for the audit log.
func actor(r *http.Request) registry.Actor {
	return registry.Actor{
		Principal:  principalFrom(r.Context()),
		ActingNode: actingNode(r.Context()),
		RequestID:  requestID(r.Context()),

		ClientRequestID: clientRequestID(r.Context()),
	}
}

// unauthorized is a 401 with the challenge RFC 6750 asks for.
type unauthorized struct {
	detail  string
	invalid bool // a token was sent and refused
}

func (e *unauthorized) Error() string { return e.detail }

func (e *unauthorized) challenge() string {
	if !e.invalid {
		return `Bearer realm="registryd"`
	}
	// error_description is a quoted-string: keep quotes and backslashes out.
	desc := strings.NewReplacer(`"`, "'", `\`, "").Replace(e.detail)
	return `Bearer realm="registryd", error="invalid_token", error_description="` + desc + `"`
}

// errNoBearer is the answer to a request without usable credentials: a
// challenge, not invalid_token, since no token was looked at.
var errNoBearer = &unauthorized{detail: "this endpoint needs a bearer token: Authorization: Bearer <JWT>"}

// parseBearer reads the token from the request's Authorization header
// values. More than one header is a 400 (which one would count is up to
// whichever proxy reorders them); none, or another scheme, is a 401
// challenge; credentials that are not a token68 (RFC 9110 §11.2) are an
// invalid token. The scheme is case-insensitive and may be followed by
// several spaces; nothing else is forgiven.
func parseBearer(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errNoBearer
	case 1:
	default:
		return "", badRequest("send one Authorization header, not " + strconv.Itoa(len(values)))
	}
	scheme, rest, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errNoBearer
	}
	token := strings.TrimLeft(rest, " ")
	if token == "" {
		return "", errNoBearer
	}
	if !isToken68(token) {
		return "", &unauthorized{detail: "invalid token: the credentials are not a single token (RFC 6750 b64token)", invalid: true}
	}
	return token, nil
}

// isToken68 reports whether s is 1*( ALPHA / DIGIT / "-" / "." / "_" / "~"
// / "+" / "/" ) *"=", the only credentials the Bearer scheme carries.
func isToken68(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// authenticate requires a valid bearer token and puts its principal in the
// request context. The token itself is never logged or echoed.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := parseBearer(r.Header.Values("Authorization"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		p, err := s.auth.Verify(token)
		switch {
		case errors.Is(err, registry.ErrUnavailable):
			// The token could not be checked (the revocation list is not
			// loaded yet): the token may be fine, so no invalid_token.
			s.writeError(w, r, err)
			return
		case err != nil:
			s.writeError(w, r, &unauthorized{detail: err.Error(), invalid: true})
			return
		}
		if p.Role == registry.RoleAgent {
			s.observer.AgentTokenSeen(p.Sub, p.Token)
		}
		if st := stateOf(r.Context()); st != nil {
			st.principal, st.authed = p, true
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey, p)))
	})
}

// parseNodeID reads the Node-Id header values: absent (or one empty value)
// is no node, ok false. Present, it must be one header holding a node pk
// as parsePK reads it (and as a path spells it). Two headers are refused
// rather than letting the first win.
func parseNodeID(values []string) (pk int64, ok bool, err error) {
	switch {
	case len(values) == 0 || len(values) == 1 && values[0] == "":
		return 0, false, nil
	case len(values) > 1:
		return 0, false, badRequest("send one Node-Id header, not " + strconv.Itoa(len(values)))
	}
	pk, ok = parsePK(values[0])
	if !ok {
		return 0, false, badRequest("the Node-Id header must be a node pk: " + pkSyntax)
	}
	return pk, true, nil
}

// nodeID handles the Node-Id header: the request acts on behalf of that
// node. Only the agent that registered the node, or an admin, may; anyone
// else gets the same 403 whether or not the node exists, so Node-Id cannot
// be used to discover nodes. An allowed Node-Id is the node's heartbeat.
func (s *Server) nodeID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pk, ok, err := parseNodeID(r.Header.Values("Node-Id"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		p := principalFrom(r.Context())
		// Made only when refusing: an allowed Node-Id is every heartbeat.
		refused := func() error {
			return registry.Errorf(registry.ErrForbidden, "%s %q may not act as node %d", p.Role, p.Sub, pk)
		}
		if p.Role != registry.RoleAdmin && p.Role != registry.RoleAgent {
			s.writeError(w, r, refused())
			return
		}
		n, err := s.readNode(r, pk)
		if mode, _ := readFreshness(r); mode == bounded &&
			(errors.Is(err, registry.ErrNotFound) || err == nil && !p.MayActAs(n)) {
			// max-stale buys a quick yes, never a stale no: a node created
			// or adopted a moment ago may not be in the cache yet. A
			// refusal is checked again by a consistent read.
			n, err = s.readNodeConsistent(r, pk)
		}
		switch {
		case errors.Is(err, registry.ErrNotFound) && p.Role == registry.RoleAdmin:
			s.writeError(w, r, registry.NotFoundf("node %d, named by Node-Id, does not exist", pk))
			return
		case errors.Is(err, registry.ErrNotFound):
			s.writeError(w, r, refused())
			return
		case err != nil:
			s.writeError(w, r, err)
			return
		case !p.MayActAs(n):
			s.writeError(w, r, refused())
			return
		}
		// The heartbeat counts only requests that succeed: a refused request
		// changes nothing, last_seen included.
		sw := watchStatus(w)
		if st := stateOf(r.Context()); st != nil {
			st.acting = pk
			next.ServeHTTP(sw, r)
		} else {
			next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), actingNodeKey, &pk)))
		}
		if sw.status < http.StatusBadRequest {
			s.heartbeats.Record(pk)
		}
	})
}

var permNames = map[registry.Permission]string{
	registry.PermRead:          "read the registry",
	registry.PermCreateNode:    "register nodes",
	registry.PermWriteNode:     "change or delete nodes",
	registry.PermClaim:         "claim or release nodes",
	registry.PermWriteHardware: "change hardware generations",
	registry.PermReadAudit:     "read the audit log",
	registry.PermRevokeTokens:  "revoke tokens",
	registry.PermCordon:        "cordon or uncordon nodes",
}

// require refuses principals whose role lacks perm, before the handler
// reads anything.
func (s *Server) require(perm registry.Permission) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := principalFrom(r.Context())
			if !p.Role.Allows(perm) {
				s.writeError(w, r, registry.Errorf(registry.ErrForbidden, "role %s may not %s", p.Role, permNames[perm]))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// mayWriteNode applies the agent's limit on node writes: only its own node,
// acting as it. Admins may write any node.
func mayWriteNode(r *http.Request, pk int64) error {
	p := principalFrom(r.Context())
	if p.Role == registry.RoleAdmin {
		return nil
	}
	acting := actingNode(r.Context())
	switch {
	case acting == nil:
		return registry.Errorf(registry.ErrForbidden, "an agent changes a node only acting as it: send Node-Id: %d", pk)
	case *acting != pk:
		return registry.Errorf(registry.ErrForbidden, "Node-Id names node %d, but this request changes node %d; an agent may change only the node it acts as", *acting, pk)
	}
	return nil
}

// mayUseIP applies a bound agent token's address set to the address a
// request would register, adopt or move a node to. It runs before the
// store is asked anything, so the answer is the same whether or not a node
// exists at ip.
func mayUseIP(r *http.Request, ip string) error {
	p := principalFrom(r.Context())
	if p.MayUseIP(ip) {
		return nil
	}
	return registry.Errorf(registry.ErrForbidden, "this token is bound to %s; it may not register, adopt or move a node to %s",
		registry.FormatIPSet(p.IPs), ip)
}
