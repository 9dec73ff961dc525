package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// revocationJSON is a stored revocation on the wire.
type revocationJSON struct {
	Sub           string     `json:"sub,omitempty"`
	RevokedBefore *time.Time `json:"revoked_before,omitempty"`
	JTI           string     `json:"jti,omitempty"`
	Until         *time.Time `json:"until,omitempty"`
}

// revokeTokens stops tokens before they expire: {"sub": NAME} every token
// of a principal issued until now, {"jti": ID} one token (with "until",
// its expiry, when known). Every replica refuses them within seconds.
func (s *Server) revokeTokens(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	var rev registry.Revocation
	sub, jti := f.string("sub", false), f.string("jti", false)
	rev.Sub, rev.JTI = sub.Value, jti.Value
	if u := f.time("until"); u.Set && !u.Null {
		rev.Until = &u.Value
	}
	// An empty string is as good as absent for the rule below, but a
	// client that sent one meant something: say which field.
	if sub.Set && sub.Value == "" {
		f.errs.Add("sub", "must not be empty")
	}
	if jti.Set && jti.Value == "" {
		f.errs.Add("jti", "must not be empty")
	}
	if !f.errs.Has("sub") && !f.errs.Has("jti") {
		f.check(rev.Normalize(time.Now()))
	}
	if err := f.err(); err != nil {
		return err
	}
	out, err := s.store.RevokeTokens(r.Context(), actor(r), rev)
	if err != nil {
		return err
	}
	j := revocationJSON{Sub: out.Sub, JTI: out.JTI}
	if out.Sub != "" {
		b := out.Before.UTC()
		j.RevokedBefore = &b
	}
	if out.Until != nil {
		u := out.Until.UTC()
		j.Until = &u
	}
	return writeJSON(w, http.StatusOK, j)
}

// TokenRenewer mints the renewal of a valid token: POST /v1/tokens/renew.
// *auth.Renewer is one.
type TokenRenewer interface {
	// Renew returns a fresh token in place of token, which the request
	// presented and authenticate accepted. A refusal that is the token's
	// fault is a *registry.Error of kind registry.ErrForbidden.
	Renew(token string) (registry.RenewedToken, error)
}

// renewedTokenJSON is a renewal on the wire.
type renewedTokenJSON struct {
	Token   string    `json:"token"`
	ID      string    `json:"id"`
	Lineage string    `json:"lineage"`
	Expires time.Time `json:"expires"`
}

// renewToken is POST /v1/tokens/renew: an agent exchanges its token, while
// still valid, for a fresh one with the same subject, addresses and
// lifetime, so that no human needs to hand it another (see
// auth.Verifier.Renewal). The body is empty or {}.
func (s *Server) renewToken(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, true)
	if err != nil {
		return err
	}
	if err := newFields(obj).err(); err != nil {
		return err
	}
	if p := principalFrom(r.Context()); p.Role != registry.RoleAgent {
		return &registry.Error{Kind: registry.ErrForbidden, Code: registry.CodeNotRenewable,
			Message: "only agent tokens are renewed; role " + string(p.Role) + " tokens are minted again with registryd token"}
	}
	if s.renewer == nil {
		return &registry.Error{Kind: registry.ErrForbidden, Code: registry.CodeNotRenewable,
			Message: "this server signs no tokens (only REGISTRY_JWT_PUBLIC_KEYS is set): renew tokens with their issuer"}
	}
	token, err := parseBearer(r.Header.Values("Authorization"))
	if err != nil {
		return err
	}
	out, err := s.renewer.Renew(token)
	if err == nil {
		s.logger.InfoContext(r.Context(), "token renewed", "sub", principalFrom(r.Context()).Sub,
			"lineage", out.Lineage, "id", out.ID, "expires", out.Expires.UTC().Format(time.RFC3339))
	}
	if err != nil {
		if !errors.Is(err, registry.ErrForbidden) && !errors.Is(err, registry.ErrUnavailable) {
			s.logger.ErrorContext(r.Context(), "token renewal failed", "err", err)
		}
		return err
	}
	return writeJSON(w, http.StatusOK, renewedTokenJSON{Token: out.Token, ID: out.ID, Lineage: out.Lineage, Expires: out.Expires.UTC()})
}
