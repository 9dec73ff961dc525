package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/registry"
)

// problem is an RFC 9457 problem details document.
type problem struct {
	Type      string                `json:"type"`
	Title     string                `json:"title"`
	Status    int                   `json:"status"`
	Detail    string                `json:"detail,omitempty"`
	Instance  string                `json:"instance,omitempty"`
	RequestID string                `json:"request_id,omitempty"`
	Errors    []registry.FieldError `json:"errors,omitempty"`
	// ErrorsOmitted counts the field errors beyond the first
	// maxListedErrors, which are not listed.
	ErrorsOmitted int   `json:"errors_omitted,omitempty"`
	ExistingPK    int64 `json:"existing_pk,omitempty"`
	// Code is the machine-readable reason (registry.Code…), on every
	// problem.
	Code string `json:"code"`
}

// A problem lists at most maxListedErrors field errors, and a field name
// (which a client chose when it is an unknown member) of at most
// maxFieldNameBytes: an error answer is never much larger than a request
// that is all mistakes would make it.
const (
	maxListedErrors   = 20
	maxFieldNameBytes = 64
)

// listFields bounds the field errors a problem carries: the first
// maxListedErrors, long names shortened, and how many were left out.
func listFields(all []registry.FieldError) (listed []registry.FieldError, omitted int) {
	n := min(len(all), maxListedErrors)
	listed = make([]registry.FieldError, n)
	for i, fe := range all[:n] {
		if len(fe.Field) > maxFieldNameBytes {
			cut := maxFieldNameBytes
			for cut > 0 && !utf8.RuneStart(fe.Field[cut]) {
				cut--
			}
			fe.Field = fe.Field[:cut] + "…"
		}
		listed[i] = fe
	}
	return listed, len(all) - n
}

// httpError is an error that already knows its HTTP status; for failures
// that belong to HTTP itself (body too large, wrong media type).
type httpError struct {
	status int
	detail string
	code   string // empty: the status's (statusCodes)
}

func (e *httpError) Error() string { return e.detail }

func badRequest(detail string) error {
	return &httpError{status: http.StatusBadRequest, detail: detail}
}

// handlerFunc is an HTTP handler that returns its failure instead of
// writing it, so every error goes through writeError.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) handle(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// writeError maps err onto a status through one table and writes it as a
// problem. Details of 5xx errors go to the log, never to the client.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problem{Type: "about:blank", Instance: r.URL.Path, RequestID: requestID(r.Context())}
	var re *registry.Error
	var he *httpError
	var ue *unauthorized
	switch {
	case errors.As(err, &ue):
		p.Status, p.Detail = http.StatusUnauthorized, ue.detail
		w.Header().Set("WWW-Authenticate", ue.challenge())
	case errors.As(err, &he):
		p.Status, p.Detail, p.Code = he.status, he.detail, he.code
	case errors.Is(err, registry.ErrInvalid):
		p.Status = http.StatusBadRequest
		p.Detail = publicMessage(err)
		p.Errors, p.ErrorsOmitted = listFields(registry.FieldsOf(err))
		if p.ErrorsOmitted > 0 {
			p.Detail += fmt.Sprintf(" (%d field errors; the first %d are listed)", len(p.Errors)+p.ErrorsOmitted, len(p.Errors))
		}
	case errors.Is(err, registry.ErrNotFound):
		p.Status, p.Detail = http.StatusNotFound, publicMessage(err)
	case errors.Is(err, registry.ErrConflict):
		p.Status, p.Detail = http.StatusConflict, publicMessage(err)
		if errors.As(err, &re) {
			p.ExistingPK = re.ExistingPK
		}
	case errors.Is(err, registry.ErrPrecondition):
		p.Status, p.Detail = http.StatusPreconditionFailed, publicMessage(err)
	case errors.Is(err, registry.ErrForbidden):
		p.Status, p.Detail = http.StatusForbidden, publicMessage(err)
	case errors.Is(err, registry.ErrTooMany):
		p.Status, p.Detail = http.StatusTooManyRequests, publicMessage(err)
		w.Header().Set("Retry-After", "5")
	case errors.Is(err, registry.ErrBusy): // before ErrUnavailable, which it matches too
		p.Status = http.StatusServiceUnavailable
		p.Detail = "the request waited too long on a lock held by another database session (a concurrent change to the same rows); nothing was changed; retry shortly"
		w.Header().Set("Retry-After", "1")
		s.logger.WarnContext(r.Context(), "lock wait timed out", "request_id", p.RequestID, "err", err)
	case errors.Is(err, registry.ErrUnavailable):
		p.Status, p.Detail = http.StatusServiceUnavailable, "the database is unavailable; retry shortly"
		w.Header().Set("Retry-After", "1")
		s.logger.WarnContext(r.Context(), "database unavailable", "request_id", p.RequestID, "err", err)
	case errors.Is(err, context.Canceled) && (r.Context().Err() != nil || clientGone(r)):
		// The client went away; nobody reads the answer.
		s.logger.DebugContext(r.Context(), "request canceled by client", "request_id", p.RequestID)
		return
	default:
		p.Status, p.Detail = http.StatusInternalServerError, "internal error; quote the request id when reporting it"
		s.logger.ErrorContext(r.Context(), "internal error", "request_id", p.RequestID,
			"method", r.Method, "path", r.URL.Path, "err", err)
	}
	p.Title = http.StatusText(p.Status)
	if p.Code == "" {
		p.Code = registry.CodeOf(err)
	}
	if p.Code == "" || p.Status == http.StatusInternalServerError {
		p.Code = statusCodes[p.Status]
	}
	if p.Code == "" { // a status of no code of ours: its text, as a code
		p.Code = strings.ReplaceAll(strings.ToLower(p.Title), " ", "_")
	}
	writeProblem(w, p)
}

// statusCodes is the code of a problem whose error has none of its own:
// HTTP's own failures (a body too large, a wrong media type) and internal
// errors.
var statusCodes = map[int]string{
	http.StatusBadRequest:            registry.CodeInvalid,
	http.StatusUnauthorized:          registry.CodeUnauthorized,
	http.StatusForbidden:             registry.CodeForbidden,
	http.StatusNotFound:              registry.CodeNotFound,
	http.StatusMethodNotAllowed:      "method_not_allowed",
	http.StatusRequestEntityTooLarge: "body_too_large",
	http.StatusUnsupportedMediaType:  "unsupported_media_type",
	http.StatusServiceUnavailable:    registry.CodeUnavailable,
	http.StatusInternalServerError:   "internal_error",
}

// publicMessage is the client-safe text of a registry error: its message
// without the wrapping context lower layers added for logs.
func publicMessage(err error) string {
	if re, ok := errors.AsType[*registry.Error](err); ok {
		return re.Message
	}
	return err.Error()
}

func writeProblem(w http.ResponseWriter, p problem) {
	writeJSONType(w, p.Status, "application/problem+json", p)
}

// problemHandler answers every request with the given status; for chi's
// NotFound and MethodNotAllowed.
func (s *Server) problemHandler(status int, detail string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &httpError{status: status, detail: detail})
	}
}

// orDiscard is l, or a logger that discards everything when l is nil.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
