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
	p, _ := ctx.Value(principalKey).(registry.Principal)
	return p
}

// actingNode is the node named by an allowed Node-Id header, or nil.
func actingNode(ctx context.Context) *int64 {
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

// authenticate requires a valid bearer token and puts its principal in the
// request context. The token itself is never logged or echoed.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") {
			s.writeError(w, r, &unauthorized{detail: "this endpoint needs a bearer token: Authorization: Bearer <JWT>"})
			return
		}
		p, err := s.auth.Verify(strings.TrimSpace(token))
		if err != nil {
			s.writeError(w, r, &unauthorized{detail: err.Error(), invalid: true})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey, p)))
	})
}

// nodeID handles the Node-Id header: the request acts on behalf of that
// node. Only the agent that registered the node, or an admin, may; anyone
// else gets the same 403 whether or not the node exists, so Node-Id cannot
// be used to discover nodes. An allowed Node-Id is the node's heartbeat.
func (s *Server) nodeID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Get("Node-Id")
		if raw == "" {
			next.ServeHTTP(w, r)
			return
		}
		pk, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err != nil || pk <= 0 {
			s.writeError(w, r, badRequest("the Node-Id header must be a node pk (a positive integer)"))
			return
		}
		p := principalFrom(r.Context())
		refused := registry.Errorf(registry.ErrForbidden, "%s %q may not act as node %d", p.Role, p.Sub, pk)
		if p.Role != registry.RoleAdmin && p.Role != registry.RoleAgent {
			s.writeError(w, r, refused)
			return
		}
		n, err := s.store.GetNode(r.Context(), pk)
		switch {
		case errors.Is(err, registry.ErrNotFound) && p.Role == registry.RoleAdmin:
			s.writeError(w, r, registry.NotFoundf("node %d, named by Node-Id, does not exist", pk))
			return
		case errors.Is(err, registry.ErrNotFound):
			s.writeError(w, r, refused)
			return
		case err != nil:
			s.writeError(w, r, err)
			return
		case !p.MayActAs(n):
			s.writeError(w, r, refused)
			return
		}
		// The heartbeat counts only requests that succeed: a refused request
		// changes nothing, last_seen included.
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), actingNodeKey, &pk)))
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
