package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// RevocationsChannel is notified, in the revoking transaction, whenever a
// token revocation is stored: every replica reloads its list then.
const RevocationsChannel = "registry_token_revocations"

// revocationDoc is a revocation as the audit log records it.
type revocationDoc struct {
	ID            int64      `json:"id"`
	Sub           string     `json:"sub,omitempty"`
	RevokedBefore *time.Time `json:"revoked_before,omitempty"`
	JTI           string     `json:"jti,omitempty"`
	Until         *time.Time `json:"until,omitempty"`
}

func docOfRevocation(r registry.Revocation) revocationDoc {
	d := revocationDoc{ID: r.ID, Sub: r.Sub, JTI: r.JTI, Until: r.Until}
	if r.Sub != "" {
		b := r.Before.UTC()
		d.RevokedBefore = &b
	}
	if d.Until != nil {
		u := d.Until.UTC()
		d.Until = &u
	}
	return d
}

const revocationColumns = `id, coalesce(sub, ''), coalesce(revoked_before, 'epoch'), coalesce(jti, ''), until, revoked_at`

func scanRevocation(row pgx.CollectableRow) (registry.Revocation, error) {
	var r registry.Revocation
	err := row.Scan(&r.ID, &r.Sub, &r.Before, &r.JTI, &r.Until, &r.At)
	return r, err
}

// RevokeTokens stores r, audits it (action token.revoke, target type token,
// target pk the revocation's id) and notifies every replica, all in one
// transaction, and returns the revocation as stored.
//
// For a subject, Before becomes the database's clock rounded up to the
// whole second ("iat" counts whole seconds, so a token issued in the same
// second as the revocation is refused too); revoking a subject again keeps
// the later instant. For a token id, Until is when the token expires
// anyway; nil (unknown) wins over any date, since the row then stays for
// the longest lifetime a token may have. ErrInvalid when r is malformed.
func (s *Store) RevokeTokens(ctx context.Context, a registry.Actor, r registry.Revocation) (out registry.Revocation, err error) {
	if err := r.Normalize(time.Now()); err != nil {
		return registry.Revocation{}, err
	}
	err = s.WithTx(ctx, func(tx *Store) error {
		key, value := "sub", r.Sub
		if r.JTI != "" {
			key, value = "jti", r.JTI
		}
		prev, err := collectOne(ctx, tx.db, scanRevocation, `SELECT `+revocationColumns+` FROM token_revocations WHERE `+key+` = $1 FOR UPDATE`, value)
		var before any
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			before = docOfRevocation(prev)
		}
		if r.Sub != "" {
			out, err = collectOne(ctx, tx.db, scanRevocation, `
				INSERT INTO token_revocations (sub, revoked_before)
				VALUES ($1, date_trunc('second', now()) + CASE WHEN now() > date_trunc('second', now()) THEN interval '1 second' ELSE interval '0' END)
				ON CONFLICT (sub) DO UPDATE
				SET revoked_before = greatest(token_revocations.revoked_before, excluded.revoked_before), revoked_at = now()
				RETURNING `+revocationColumns, r.Sub)
		} else {
			out, err = collectOne(ctx, tx.db, scanRevocation, `
				INSERT INTO token_revocations (jti, until) VALUES ($1, $2)
				ON CONFLICT (jti) DO UPDATE
				SET until = CASE WHEN token_revocations.until IS NULL OR excluded.until IS NULL THEN NULL
				                 ELSE greatest(token_revocations.until, excluded.until) END,
				    revoked_at = now()
				RETURNING `+revocationColumns, r.JTI, r.Until)
		}
		if err != nil {
			return err
		}
		if _, err := tx.db.Exec(ctx, `SELECT pg_notify($1, '')`, RevocationsChannel); err != nil {
			return err
		}
		return tx.audit(ctx, a, registry.ActionTokenRevoke, "token", out.ID, before, docOfRevocation(out))
	})
	if err != nil {
		return registry.Revocation{}, fmt.Errorf("store: revoke tokens: %w", translate(err))
	}
	return out, nil
}

// Revocations returns every revocation in force, for a replica's
// in-memory list. The table stays small: one row per revoked subject, and
// token ids only until their tokens expire (see PruneRevocations).
func (s *Store) Revocations(ctx context.Context) ([]registry.Revocation, error) {
	rs, err := collectRows(ctx, s.db, scanRevocation, `SELECT `+revocationColumns+` FROM token_revocations`)
	if err != nil {
		return nil, fmt.Errorf("store: load revocations: %w", translate(err))
	}
	return rs, nil
}

// PruneRevocations forgets token-id revocations that no longer matter:
// those revoked before keptAfter (the caller passes now minus the longest
// lifetime a token may have, and leeway) whose token expired before
// expiredBefore, or whose expiry is unknown. A revoked token's own expiry
// is not enough: the id may be a lineage's, whose renewals outlive it by
// up to a lifetime (and none is renewed once it is revoked). Subject
// revocations stay: they also refuse that subject's tokens without "iat",
// whenever those expire.
func (s *Store) PruneRevocations(ctx context.Context, expiredBefore, keptAfter time.Time) (int64, error) {
	tag, err := s.db.Exec(ctx, `
		DELETE FROM token_revocations
		WHERE jti IS NOT NULL AND revoked_at < $2 AND (until IS NULL OR until < $1)`, expiredBefore, keptAfter)
	if err != nil {
		return 0, fmt.Errorf("store: prune revocations: %w", translate(err))
	}
	return tag.RowsAffected(), nil
}
