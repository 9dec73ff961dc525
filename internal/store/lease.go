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
// the sweeper has released it yet): its pk is in expired, with the pks
// of the nodes the sweeper took back from the job when their lease ran
// out. Holding nothing: ErrNotFound, coded lease_expired when leases of
// the job ran out, job_holds_nothing otherwise. A job holding nodes
// another principal claimed: ErrForbidden (job_owned_by_other). Each
// renewed node gets a new version and a node.renew audit entry, and the
// renewal one renewed event listing them all, in one transaction, which
// first locks the job's row (see queueOwn).
func (s *Store) RenewLeases(ctx context.Context, actor registry.Actor, r registry.Renewal) (nodes []registry.Node, expired []int64, err error) {
	if err := r.Normalize(); err != nil {
		return nil, nil, err
	}
	var out []registry.Node
	err = s.WithTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, lockJobSQL, r.Job, nil); err != nil {
			return err
		}
		var owner *string
		if err := tx.db.QueryRow(ctx, `SELECT owner FROM jobs WHERE job = $1`, r.Job).Scan(&owner); err != nil {
			return err
		}
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
		if owner != nil && *owner != actor.Sub && len(all) > 0 {
			return jobOwnedByOther(r.Job)
		}
		swept, err := collectRows(ctx, tx.db, pgx.RowTo[int64], `SELECT pk FROM nodes WHERE expired_job = $1`, r.Job)
		if err != nil {
			return err
		}
		expired = swept
		var renew []int64
		before := map[int64]registry.Node{}
		for _, h := range all {
			switch {
			case h.expired:
				expired = append(expired, h.node.PK)
			case h.node.LeaseExpiresAt == nil:
				out = append(out, h.node)
			default:
				renew = append(renew, h.node.PK)
				before[h.node.PK] = h.node
			}
		}
		slices.Sort(expired)
		if len(renew) == 0 && len(out) == 0 {
			if len(expired) > 0 {
				return registry.Coded(registry.ErrNotFound, registry.CodeLeaseExpired,
					"job %d holds no nodes: its leases ran out (nodes %v); claim again", r.Job, expired)
			}
			return registry.Coded(registry.ErrNotFound, registry.CodeJobHoldsNothing, "job %d holds no nodes", r.Job)
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
		if err := tx.recordRenewal(ctx, renewed); err != nil {
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
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("store: renew: %w", translate(err))
	}
	return out, expired, nil
}
