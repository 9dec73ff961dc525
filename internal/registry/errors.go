// Package registry holds the registry's vocabulary: nodes, hardware
// generations, the rules that make them valid, and the errors every other
// package speaks. It imports only the standard library.
package registry

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error the registry returns to a caller wraps one of
// these, so adapters can map them to their own vocabulary (HTTP status codes,
// exit codes) with errors.Is.
var (
	// ErrNotFound means the addressed row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict means the request collides with the current state: a taken
	// (ip, index) pair, a node that holds a job, a hardware generation in use.
	ErrConflict = errors.New("conflict")
	// ErrInvalid means the input is malformed or breaks a rule; nothing was
	// stored.
	ErrInvalid = errors.New("invalid input")
	// ErrForbidden means the principal may not do what it asked.
	ErrForbidden = errors.New("forbidden")
	// ErrPrecondition means a conditional request's condition (If-Match)
	// does not hold: the row changed since the client read it.
	ErrPrecondition = errors.New("precondition failed")
	// ErrGone means the history a request asked for no longer exists (a
	// watch resuming from an event that retention removed).
	ErrGone = errors.New("gone")
	// ErrUnavailable means a dependency (the database) cannot be reached right
	// now; the same request may succeed later.
	ErrUnavailable = errors.New("unavailable")
	// ErrBusy means the request waited for a lock another database session
	// holds (a concurrent write to the same rows, or a replica that froze
	// mid-transaction until the database ends its session) for longer than
	// the lock timeout, and gave up; nothing was changed. The same request
	// may succeed in a moment. An error matching ErrBusy matches
	// ErrUnavailable too, so callers that retry on one retry on the other.
	ErrBusy = errors.New("busy")
	// ErrLeaseLost means a leader's lease ran out or another replica took
	// it over: the work done under it was not committed.
	ErrLeaseLost = errors.New("leadership lease lost")
	// ErrTooMany means a cap on concurrent use was reached (too many watch
	// streams); the same request may succeed once others have finished.
	ErrTooMany = errors.New("too many")
)

// FieldError names one bad field of a request and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is the registry's rich error: a sentinel kind, a human message and,
// for validation failures, the fields at fault.
type Error struct {
	Kind    error        // one of the sentinel errors above
	Message string       // safe to show to a client
	Fields  []FieldError // validation failures, if any
	// ExistingPK names the row a conflict collided with, when there is one.
	ExistingPK int64
	// Code is the machine-readable reason (one of the Code constants);
	// empty: the kind's own (CodeOf).
	Code string
}

func (e *Error) Error() string {
	if len(e.Fields) == 0 {
		return e.Message
	}
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return e.Message + " (" + strings.Join(parts, "; ") + ")"
}

// Unwrap lets errors.Is match the sentinel kind.
func (e *Error) Unwrap() error { return e.Kind }

// Errorf returns an error of the given sentinel kind with a formatted
// message.
func Errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// Codes are the machine-readable reasons of error answers (a problem
// document's "code"): a program branches on them, never on the message.
// The ones of a kind are what an error of that kind without a more exact
// code carries (CodeOf).
const (
	CodeInvalid      = "invalid_request"     // 400: a field or the body is wrong
	CodeUnauthorized = "unauthorized"        // 401
	CodeForbidden    = "forbidden"           // 403: the role lacks the permission
	CodeNotFound     = "not_found"           // 404
	CodeConflict     = "conflict"            // 409
	CodePrecondition = "precondition_failed" // 412: If-Match does not hold
	CodeTooMany      = "too_many_requests"   // 429
	CodeBusy         = "busy"                // 503: waited too long on a lock
	CodeUnavailable  = "unavailable"         // 503: the database cannot be reached

	// CodeJobOwnedByOther (403): the job holds nodes claimed by another
	// principal; claim under a job id of your own.
	CodeJobOwnedByOther = "job_owned_by_other"
	// CodeInsufficientCapacity (409): fewer free nodes match a claim than
	// it asked for.
	CodeInsufficientCapacity = "insufficient_capacity"
	// CodeNoSingleHost (409): no one host has the free matching nodes a
	// same_host claim asked for (more may be free across hosts).
	CodeNoSingleHost = "no_single_host"
	// CodeNotEnoughHosts (409): fewer hosts than a per_host claim asked
	// for have per_host free matching nodes each.
	CodeNotEnoughHosts = "not_enough_hosts"
	// CodeNoFabricFit (409): no one fabric has the hosts a same_fabric
	// claim asked for (more may across fabrics).
	CodeNoFabricFit = "no_fabric_fit"
	// CodeJobHoldsNothing (404): a renewal of a job that holds no nodes.
	CodeJobHoldsNothing = "job_holds_nothing"
	// CodeLeaseExpired (404): a renewal of a job whose every lease has
	// run out; the nodes are no longer the job's.
	CodeLeaseExpired = "lease_expired"
	// CodeTooManyMatched (409): a cordon's filters match more nodes than
	// one cordon takes.
	CodeTooManyMatched = "too_many_matched"
	// CodeNotRenewable (403): POST /v1/tokens/renew with a token that is
	// not renewed (not an agent's, not bound to addresses, or not signed
	// by this server).
	CodeNotRenewable = "token_not_renewable"
)

// CodeOf is the code of err as a client is told it: its own, or its
// kind's; empty for an error of no registry kind.
func CodeOf(err error) string {
	if re, ok := errors.AsType[*Error](err); ok && re.Code != "" {
		return re.Code
	}
	for _, k := range []struct {
		kind error
		code string
	}{
		{ErrInvalid, CodeInvalid}, {ErrNotFound, CodeNotFound}, {ErrConflict, CodeConflict},
		{ErrForbidden, CodeForbidden}, {ErrPrecondition, CodePrecondition},
		{ErrTooMany, CodeTooMany}, {ErrBusy, CodeBusy}, {ErrUnavailable, CodeUnavailable},
	} {
		if errors.Is(err, k.kind) {
			return k.code
		}
	}
	return ""
}

// Coded returns an error of kind with code and a formatted message.
func Coded(kind error, code, format string, args ...any) error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// NotFoundf returns an ErrNotFound error with a formatted message.
func NotFoundf(format string, args ...any) error {
	return &Error{Kind: ErrNotFound, Message: fmt.Sprintf(format, args...)}
}

// Conflictf returns an ErrConflict error with a formatted message.
func Conflictf(format string, args ...any) error {
	return &Error{Kind: ErrConflict, Message: fmt.Sprintf(format, args...)}
}

// Invalidf returns an ErrInvalid error with a formatted message.
func Invalidf(format string, args ...any) error {
	return &Error{Kind: ErrInvalid, Message: fmt.Sprintf(format, args...)}
}

// FieldErrors collects validation failures in the order they are found.
type FieldErrors []FieldError

// Add records that field is bad, with a formatted reason.
func (fe *FieldErrors) Add(field, format string, args ...any) {
	*fe = append(*fe, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Has reports whether field already has a recorded failure, so a later rule
// does not pile a second message onto a field that is already wrong.
func (fe FieldErrors) Has(field string) bool {
	for _, f := range fe {
		if f.Field == field {
			return true
		}
	}
	return false
}

// Err returns nil when nothing was recorded, otherwise an ErrInvalid *Error
// listing every field.
func (fe FieldErrors) Err() error {
	if len(fe) == 0 {
		return nil
	}
	return &Error{Kind: ErrInvalid, Message: "the request has invalid fields", Fields: fe}
}

// FieldsOf returns the field failures carried by err, if any.
func FieldsOf(err error) []FieldError {
	var e *Error
	if errors.As(err, &e) {
		return e.Fields
	}
	return nil
}
