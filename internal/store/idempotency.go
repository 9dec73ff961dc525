package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// ReserveKey reserves principal's key for the request requestID, to run
// for at most lease, its answer kept for keep: created reports that the
// caller is to run it (a record whose keep ran out is replaced). When the
// key is taken, rec is its record as it stands.
func (s *Store) ReserveKey(ctx context.Context, principal, key string, fingerprint []byte, requestID string, lease, keep time.Duration) (rec registry.KeyRecord, created bool, err error) {
	err = s.db.QueryRow(ctx, `
		INSERT INTO idempotency_keys AS k (principal, key, fingerprint, request_id, running_until, keep_until)
		VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 millisecond', now() + $6::bigint * interval '1 millisecond')
		ON CONFLICT (principal, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, request_id = EXCLUDED.request_id,
			running_until = EXCLUDED.running_until, status = NULL, content_type = NULL, body = NULL,
			created_at = now(), keep_until = EXCLUDED.keep_until
		WHERE k.keep_until < now()
		RETURNING true`, principal, key, fingerprint, requestID, lease.Milliseconds(), keep.Milliseconds()).Scan(&created)
	if err == nil {
		return registry.KeyRecord{Fingerprint: fingerprint, RequestID: requestID, Running: true}, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return registry.KeyRecord{}, false, fmt.Errorf("store: reserve idempotency key: %w", translate(err))
	}
	// Taken: read it in a statement of its own (the insert above waited for
	// a reservation under way, but its snapshot predates it).
	var status *int
	var contentType *string
	err = s.db.QueryRow(ctx, `
		SELECT fingerprint, request_id, coalesce(running_until > now(), false), running_until IS NULL, status, content_type, body, created_at
		FROM idempotency_keys WHERE principal = $1 AND key = $2`, principal, key).Scan(
		&rec.Fingerprint, &rec.RequestID, &rec.Running, &rec.Done, &status, &contentType, &rec.Body, &rec.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) { // pruned in between: reserve again
		return s.ReserveKey(ctx, principal, key, fingerprint, requestID, lease, keep)
	}
	if err != nil {
		return registry.KeyRecord{}, false, fmt.Errorf("store: read idempotency key: %w", translate(err))
	}
	if status != nil {
		rec.Status = *status
	}
	if contentType != nil {
		rec.ContentType = *contentType
	}
	return rec, false, nil
}

// TakeOverKey gives principal's key, whose runner lost (its lease ran
// out without an answer), to the request requestID for lease. ok is false
// when the runner is not lost or another took it over first.
func (s *Store) TakeOverKey(ctx context.Context, principal, key, lostRequestID, requestID string, lease time.Duration) (ok bool, err error) {
	tag, err := s.db.Exec(ctx, `
		UPDATE idempotency_keys SET request_id = $4, running_until = now() + $5::bigint * interval '1 millisecond'
		WHERE principal = $1 AND key = $2 AND request_id = $3 AND running_until <= now()`,
		principal, key, lostRequestID, requestID, lease.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("store: take over idempotency key: %w", translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// CompleteKey keeps the answer of the request requestID that ran with
// principal's key. It keeps nothing when another request took the key
// over (ErrConflict).
func (s *Store) CompleteKey(ctx context.Context, principal, key, requestID string, status int, contentType string, body []byte) error {
	tag, err := s.db.Exec(ctx, `
		UPDATE idempotency_keys SET running_until = NULL, status = $4, content_type = $5, body = $6
		WHERE principal = $1 AND key = $2 AND request_id = $3`,
		principal, key, requestID, status, contentType, body)
	if err != nil {
		return fmt.Errorf("store: keep idempotent answer: %w", translate(err))
	}
	if tag.RowsAffected() == 0 {
		return registry.Conflictf("idempotency key taken over by another request")
	}
	return nil
}

// EndKeyLease ends the lease of request requestID on principal's key, now:
// it waits for a transaction of the request still committing (which holds
// the key's row, registryd_hold_key) and makes any later one fail, so that
// RequestChanges after it is final.
func (s *Store) EndKeyLease(ctx context.Context, principal, key, requestID string) error {
	if _, err := s.db.Exec(ctx, `UPDATE idempotency_keys SET running_until = now()
		WHERE principal = $1 AND key = $2 AND request_id = $3 AND running_until > now()`, principal, key, requestID); err != nil {
		return fmt.Errorf("store: end idempotency lease: %w", translate(err))
	}
	return nil
}

// AbandonKey gives up the reservation of request requestID (it changed
// nothing, and kept no answer): the next request with the key runs.
func (s *Store) AbandonKey(ctx context.Context, principal, key, requestID string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM idempotency_keys WHERE principal = $1 AND key = $2 AND request_id = $3`,
		principal, key, requestID); err != nil {
		return fmt.Errorf("store: abandon idempotency key: %w", translate(err))
	}
	return nil
}

// RequestChanges returns the pks of the nodes the request requestID of
// principal changed (its audit entries, written in the transaction of
// every change), looking no further back than since.
func (s *Store) RequestChanges(ctx context.Context, principal, requestID string, since time.Time) ([]int64, error) {
	pks, err := collectRows(ctx, s.db, pgx.RowTo[int64], `
		SELECT DISTINCT target_pk FROM audit_log
		WHERE principal = $1 AND request_id = $2 AND at >= $3 AND target_pk IS NOT NULL
		ORDER BY 1`, principal, requestID, since.Add(-time.Minute))
	if err != nil {
		return nil, fmt.Errorf("store: request changes: %w", translate(err))
	}
	return pks, nil
}

// queueHolds queues, for each op that commits in this transaction (not
// withdrawn, not to run alone after) run under an Idempotency-Key, the
// check that the key is still its request's (registryd_hold_key,
// migration 00017): the last statements before the COMMIT.
func queueHolds(b *pgx.Batch, ops []*groupOp) {
	for _, op := range ops {
		if op.gone || op.alone {
			continue // it commits nothing here: withdrawn, or to run alone after
		}
		if h, ok := registry.KeyHoldFrom(op.ctx); ok {
			b.Queue(`SELECT registryd_hold_key($1, $2, $3)`, h.Principal, h.Key, h.RequestID)
		}
	}
}

// keyTakenOver is the error of a request whose key a retry took over.
func keyTakenOver() error {
	return registry.Coded(registry.ErrConflict, registry.CodeKeyTakenOver,
		"this request ran past its Idempotency-Key's lease and a retry took the key over; this one changed nothing")
}

// pruneKeysSQL deletes idempotency records whose keep ran out, a bounded
// batch at a time (see SweepLifecycle).
const pruneKeysSQL = `
	DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM idempotency_keys WHERE keep_until < now() ORDER BY keep_until LIMIT 1000))`
