package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// leaseSeconds is a lease as the SQL of claims and renewals takes it:
// whole seconds, or nil for none (now() + NULL is NULL).
func leaseSeconds(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	s := int64(*d / time.Second)
	return &s
}

// RenewLeases sets the lease of every node r.Job holds with a lease that
// has not run out to r.Lease from now (the database's clock), and answers
// every node the job still holds, ordered by pk. Nodes it holds without a
// lease are answered unchanged; a lease that has run out is not renewed
// and its node not answered (the job no longer holds it, whether or not
// the sweeper has released it yet). Holding nothing: ErrNotFound. Each
// renewed node gets a new version, a node.renew audit entry and an
// updated event, in one transaction.
func (s *Store) RenewLeases(ctx context.Context, actor registry.Actor, r registry.Renewal) ([]registry.Node, error) {
	if err := r.Normalize(); err != nil {
		return nil, err
	}
	var out []registry.Node
	err := s.WithTx(ctx, func(tx *Store) error {
		// Locked in pk order, as release locks them, so the two cannot
		// deadlock.
		type held struct {
			node    registry.Node
			expired bool
		}
		scanHeld := func(row pgx.CollectableRow) (held, error) {
			var h held
			dests := nodeDests(&h.node)
			err := row.Scan(append(dests, &h.expired)...)
			h.node.State = h.node.DeriveState()
			h.node = h.node.UTC()
			return h, err
		}
		all, err := collectRows(ctx, tx.db, scanHeld, `
			SELECT `+nodeColumns+`, lease_expires_at IS NOT NULL AND lease_expires_at <= now()
			FROM nodes WHERE current_job = $1 ORDER BY pk FOR UPDATE`, r.Job)
		if err != nil {
			return err
		}
		var renew []int64
		before := map[int64]registry.Node{}
		for _, h := range all {
			switch {
			case h.expired:
			case h.node.LeaseExpiresAt == nil:
				out = append(out, h.node)
			default:
				renew = append(renew, h.node.PK)
				before[h.node.PK] = h.node
			}
		}
		if len(renew) == 0 && len(out) == 0 {
			return registry.NotFoundf("job %d holds no nodes (a lease that ran out is not renewed)", r.Job)
		}
		if len(renew) == 0 {
			return nil
		}
		renewed, err := collectRows(ctx, tx.db, scanNode, `
			UPDATE nodes SET lease_expires_at = now() + $2::bigint * interval '1 second',
				updated_at = now(), version = version + 1
			WHERE pk = ANY($1) RETURNING `+nodeColumns, renew, leaseSeconds(&r.Lease))
		if err != nil {
			return err
		}
		slices.SortFunc(renewed, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
		if err := tx.recordChanges(ctx, "updated", renewed...); err != nil {
			return err
		}
		if err := tx.auditNodes(ctx, actor, registry.ActionNodeRenew, renewed, func(n registry.Node) any { return docOfNode(before[n.PK]) }); err != nil {
			return err
		}
		out = append(out, renewed...)
		slices.SortFunc(out, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
		return nil
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, err
		}
		return nil, fmt.Errorf("store: renew: %w", translate(err))
	}
	return out, nil
}
