package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// auditJSON is an audit entry on the wire.
type auditJSON struct {
	ID         int64           `json:"id"`
	At         time.Time       `json:"at"`
	Principal  string          `json:"principal"`
	Role       string          `json:"role"`
	ActingNode *int64          `json:"acting_node"`
	Action     string          `json:"action"`
	TargetType string          `json:"target_type"`
	TargetPK   *int64          `json:"target_pk"`
	Before     json.RawMessage `json:"before"`
	After      json.RawMessage `json:"after"`
	RequestID  string          `json:"request_id"`
	// ClientRequestID is the client's own X-Request-Id; null when it sent
	// none (or one that was not kept).
	ClientRequestID *string `json:"client_request_id"`
}

func rawOrNull(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}

// listAudit answers audit entries oldest first, a page at a time:
// {"target_type":"node","target_pk":7,"principal":"agent-1","action":"node.delete","role":"admin",
// "since":"…","after":<id>,"limit":100}.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, true)
	if err != nil {
		return err
	}
	f := newFields(obj)
	af := registry.AuditFilter{Limit: 100}
	if o := f.string("target_type", false); o.Set {
		af.TargetType = &o.Value
	}
	af.TargetPK = optPtr(f.int64("target_pk", false))
	if o := f.string("principal", false); o.Set {
		af.Principal = &o.Value
	}
	if o := f.string("action", false); o.Set {
		af.Action = &o.Value
	}
	if o := f.string("role", false); o.Set {
		af.Role = &o.Value
	}
	if o := f.time("since"); o.Set && !o.Null {
		af.Since = &o.Value
	}
	if o := f.int64("after", false); o.Set {
		af.After = o.Value
	}
	if o := f.int64("limit", false); o.Set {
		if o.Value < 1 || o.Value > registry.MaxListLimit {
			f.errs.Add("limit", "must be between 1 and %d", registry.MaxListLimit)
		} else {
			af.Limit = int(o.Value)
		}
	}
	f.check(af.Normalize())
	if err := f.err(); err != nil {
		return err
	}
	entries, err := s.store.ListAudit(r.Context(), af)
	if err != nil {
		return err
	}
	out := make([]auditJSON, len(entries))
	for i, e := range entries {
		out[i] = auditJSON{ID: e.ID, At: e.At.UTC(), Principal: e.Principal, Role: e.Role, ActingNode: e.ActingNode,
			Action: e.Action, TargetType: e.TargetType, TargetPK: e.TargetPK,
			Before: rawOrNull(e.Before), After: rawOrNull(e.After), RequestID: e.RequestID}
		if e.ClientRequestID != "" {
			out[i].ClientRequestID = &e.ClientRequestID
		}
	}
	return writeJSON(w, http.StatusOK, out)
}
