package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error is an error answer of the server: its RFC 9457 problem document
// (application/problem+json), or what could be read of an answer that was
// not one (a proxy's page, say). Use errors.As to read it, errors.Is to
// compare its status with ErrNotFound, ErrConflict and the other
// sentinels.
type Error struct {
	// Method and Path are the request's.
	Method, Path string
	// Status is the HTTP status; Title its text.
	Status int
	Title  string
	// Detail says what went wrong, for people.
	Detail string
	// Type and Instance are the problem's (about:blank, the path).
	Type, Instance string
	// Fields names the bad fields of a 400 (the first 20); FieldsOmitted
	// counts the ones not listed.
	Fields        []FieldError
	FieldsOmitted int
	// ExistingPK is the row a 409 collided with (0: none named).
	ExistingPK int64
	// Code is why, for programs (one of the Code constants, or another a
	// newer server added; empty when the answer was not a problem
	// document). Branch on it, never on Detail.
	Code string
	// RequestID is the server's id of the request (quote it when
	// reporting a 5xx); ClientRequestID the caller's own X-Request-Id as
	// the server echoed it.
	RequestID, ClientRequestID string
	// RetryAfter is what Retry-After asked for (503, 429), 0 without it.
	RetryAfter time.Duration
	// retryLater says the answer carried Retry-After (0 included).
	retryLater bool
}

// Error is one line: the request, the status, the detail and the fields.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "registryd: %s %s: %d", e.Method, e.Path, e.Status)
	if e.Title != "" {
		b.WriteString(" " + e.Title)
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	for i, f := range e.Fields {
		sep := "; "
		if i == 0 {
			sep = " ("
		}
		b.WriteString(sep + f.Field + " " + f.Message)
		if i == len(e.Fields)-1 {
			b.WriteString(")")
		}
	}
	if e.RequestID != "" {
		b.WriteString(" [request " + e.RequestID + "]")
	}
	return b.String()
}

// Is reports whether target is the sentinel of e's status.
func (e *Error) Is(target error) bool {
	s, ok := target.(statusError)
	return ok && int(s) == e.Status
}

// statusError is a sentinel matching every *Error of its status.
type statusError int

func (s statusError) Error() string {
	return "registryd: " + strconv.Itoa(int(s)) + " " + http.StatusText(int(s))
}

// Sentinels for errors.Is: errors.Is(err, client.ErrNotFound) holds for
// an *Error with status 404.
var (
	ErrBadRequest         error = statusError(http.StatusBadRequest)
	ErrUnauthorized       error = statusError(http.StatusUnauthorized)
	ErrForbidden          error = statusError(http.StatusForbidden)
	ErrNotFound           error = statusError(http.StatusNotFound)
	ErrConflict           error = statusError(http.StatusConflict)
	ErrPreconditionFailed error = statusError(http.StatusPreconditionFailed)
	ErrTooManyRequests    error = statusError(http.StatusTooManyRequests)
	ErrUnavailable        error = statusError(http.StatusServiceUnavailable)
)

// Codes of error answers (Error.Code). The server may add codes: treat an
// unknown one by its status.
const (
	// CodeJobOwnedByOther (403): the job holds nodes another principal
	// claimed; claim under a job id of your own.
	CodeJobOwnedByOther = "job_owned_by_other"
	// CodeInsufficientCapacity (409): fewer free nodes match the claim
	// than it asked for; nothing was taken.
	CodeInsufficientCapacity = "insufficient_capacity"
	// CodeNoSingleHost (409): no one host has the free matching nodes of
	// a same_host claim.
	CodeNoSingleHost = "no_single_host"
	// CodeNotEnoughHosts (409): fewer hosts than a per_host claim asked
	// for have per_host free matching nodes each.
	CodeNotEnoughHosts = "not_enough_hosts"
	// CodeNoFabricFit (409): no one fabric has the hosts a same_fabric
	// claim asked for; the detail says the most one fabric has.
	CodeNoFabricFit = "no_fabric_fit"
	// CodeLeaseExpired (404): the job's leases ran out; it holds nothing.
	CodeLeaseExpired = "lease_expired"
	// CodeJobHoldsNothing (404): a renewal of a job that holds nothing.
	CodeJobHoldsNothing = "job_holds_nothing"
	// CodeTooManyMatched (409): a cordon's filters match more nodes than
	// one cordon takes.
	CodeTooManyMatched = "too_many_matched"
	// CodeTokenNotRenewable (403): RenewToken with a token the server does
	// not renew (not an agent's, not bound to addresses, revoked, or a
	// server that signs no tokens).
	CodeTokenNotRenewable = "token_not_renewable"
	// CodeIdempotencyKeyReused (422): the Idempotency-Key was first used
	// with another request.
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	// CodeIdempotentAnswerLost (409): the first request with the key
	// changed nodes (named in Detail) and its answer was lost with the
	// replica that ran it.
	CodeIdempotentAnswerLost = "idempotent_answer_lost"
	// CodeIdempotencyKeyTakenOver (409): the request ran past its key's
	// lease and a retry took the key over; this one changed nothing (the
	// retry's answer is the key's).
	CodeIdempotencyKeyTakenOver = "idempotency_key_taken_over"

	CodeInvalidRequest       = "invalid_request"        // 400
	CodeUnauthorized         = "unauthorized"           // 401
	CodeForbidden            = "forbidden"              // 403: the role lacks the permission
	CodeNotFound             = "not_found"              // 404
	CodeMethodNotAllowed     = "method_not_allowed"     // 405
	CodeConflict             = "conflict"               // 409
	CodePreconditionFailed   = "precondition_failed"    // 412
	CodeBodyTooLarge         = "body_too_large"         // 413
	CodeUnsupportedMediaType = "unsupported_media_type" // 415
	CodeTooManyRequests      = "too_many_requests"      // 429
	CodeInternalError        = "internal_error"         // 500
	CodeBusy                 = "busy"                   // 503: waited too long on a lock
	CodeUnavailable          = "unavailable"            // 503
)

// problem is the wire form of a problem document.
type problem struct {
	Type          string       `json:"type"`
	Title         string       `json:"title"`
	Status        int          `json:"status"`
	Detail        string       `json:"detail"`
	Instance      string       `json:"instance"`
	RequestID     string       `json:"request_id"`
	Errors        []FieldError `json:"errors"`
	ErrorsOmitted int          `json:"errors_omitted"`
	ExistingPK    int64        `json:"existing_pk"`
	Code          string       `json:"code"`
}

// problemOf reads an error answer into an *Error. The status is the
// answer's, whatever the document says.
func problemOf(resp *http.Response) *Error {
	e := &Error{Method: resp.Request.Method, Path: resp.Request.URL.Path, Status: resp.StatusCode,
		Title: http.StatusText(resp.StatusCode), RequestID: resp.Header.Get("X-Request-Id"),
		ClientRequestID: resp.Header.Get("X-Client-Request-Id")}
	e.RetryAfter, e.retryLater = retryAfter(resp.Header, time.Now())
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var p problem
	if (ct == "application/problem+json" || ct == "application/json") && json.Unmarshal(body, &p) == nil {
		e.Type, e.Detail, e.Instance = p.Type, p.Detail, p.Instance
		if p.Title != "" {
			e.Title = p.Title
		}
		if p.RequestID != "" {
			e.RequestID = p.RequestID
		}
		e.Fields, e.FieldsOmitted, e.ExistingPK, e.Code = p.Errors, p.ErrorsOmitted, p.ExistingPK, p.Code
		return e
	}
	// Not a problem document: keep a line of it for people.
	line, _, _ := bytes.Cut(bytes.TrimSpace(body), []byte("\n"))
	if len(line) > 200 {
		line = line[:200]
	}
	e.Detail = strings.ToValidUTF8(string(line), "?")
	return e
}

// retryAfter reads Retry-After: seconds, or an HTTP date.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
