package registry

import "time"

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
