package api

import (
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
