package registry

import (
	"context"
	"time"
)

// KeyRecord is what the registry keeps of a request sent with an
// Idempotency-Key (the idempotency_keys table).
type KeyRecord struct {
	// Fingerprint is the first request's (its path and body, hashed).
	Fingerprint []byte
	// RequestID is the server's id of the request that runs (or ran) it.
	RequestID string
	// Running: the runner's lease has not run out; Done: the answer is
	// kept. Neither: the runner was lost before it kept an answer.
	Running, Done bool
	// The answer, when Done.
	Status      int
	ContentType string
	Body        []byte
	// CreatedAt is when the first request reserved the key.
	CreatedAt time.Time
}

// KeyHold names the Idempotency-Key a request runs under: the store
// commits the request's changes only while the key is still that
// request's, its lease not run out (so a retry that takes over a runner
// it believes lost can never run the operation a second time).
type KeyHold struct {
	Principal, Key, RequestID string
}

type keyHoldKey struct{}

// WithKeyHold returns ctx carrying h.
func WithKeyHold(ctx context.Context, h KeyHold) context.Context {
	return context.WithValue(ctx, keyHoldKey{}, h)
}

// KeyHoldFrom returns the KeyHold ctx carries, if any.
func KeyHoldFrom(ctx context.Context) (KeyHold, bool) {
	h, ok := ctx.Value(keyHoldKey{}).(KeyHold)
	return h, ok
}

// CodeKeyTakenOver (409): the request ran past its Idempotency-Key's lease
// and a retry took the key over; this one changed nothing.
const CodeKeyTakenOver = "idempotency_key_taken_over"
