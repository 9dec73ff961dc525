package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// CordonNodes takes nodes out of scheduling for c.Reason: the listed ones
// (pks that name no node are reported, not failed), or every node c.Filter
// matches, at most registry.MaxCordon of them (more: ErrConflict, nothing
// cordoned). What a cordon does to each node is registry.Node.Cordoned's
// decision: a busy node keeps its job and drains. It answers every node
// now cordoned by the request, ordered by pk, including those already
// cordoned for the same reason (left unchanged: no version bump, no audit,
// no event). Nodes it changes get a new version, a node.cordon audit entry
// and a cordoned event, in one transaction.
func (s *Store) CordonNodes(ctx context.Context, actor registry.Actor, c registry.Cordon) ([]registry.Node, []registry.NotDone, error) {
	if err := c.Normalize(); err != nil {
		return nil, nil, err
	}
	var out []registry.Node
	var notDone []registry.NotDone
	err := s.WithTx(ctx, func(tx *Store) error {
		var cur []registry.Node
		var err error
		if c.Nodes != nil {
			cur, notDone, err = tx.lockListed(ctx, c.Nodes)
		} else {
			cur, err = tx.lockMatching(ctx, *c.Filter)
		}
		if err != nil {
			return err
		}
		out, err = tx.applyDecisions(ctx, actor, registry.ActionNodeCordon, "cordoned", cur, func(n registry.Node) (registry.Node, bool) {
			return n.Cordoned(c.Reason)
		})
		return err
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("store: cordon: %w", translate(err))
	}
	return out, notDone, nil
}

// UncordonNodes puts the listed nodes back into scheduling. Pks that name
// no node, or a node that is not cordoned, are reported, not failed. Each
// node uncordoned gets a new version, a node.uncordon audit entry and an
// uncordoned event, in one transaction.
func (s *Store) UncordonNodes(ctx context.Context, actor registry.Actor, u registry.Uncordon) ([]registry.Node, []registry.NotDone, error) {
	if err := u.Normalize(); err != nil {
		return nil, nil, err
	}
	var out []registry.Node
	var notDone []registry.NotDone
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, missing, err := tx.lockListed(ctx, u.Nodes)
		if err != nil {
			return err
		}
		var cordoned []registry.Node
		for _, n := range cur {
			if n.CordonReason == nil {
				missing = append(missing, registry.NotDone{PK: n.PK, Reason: "not cordoned"})
			} else {
				cordoned = append(cordoned, n)
			}
		}
		slices.SortFunc(missing, func(a, b registry.NotDone) int { return cmp.Compare(a.PK, b.PK) })
		notDone = missing
		out, err = tx.applyDecisions(ctx, actor, registry.ActionNodeUncordon, "uncordoned", cordoned, registry.Node.Uncordoned)
		return err
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("store: uncordon: %w", translate(err))
	}
	return out, notDone, nil
}

// lockListed locks the listed nodes in pk order (duplicates count once)
// and reports the pks that name no node.
func (s *Store) lockListed(ctx context.Context, pks []int64) ([]registry.Node, []registry.NotDone, error) {
	want := slices.Compact(slices.Sorted(slices.Values(pks)))
	cur, err := collectRows(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE pk = ANY($1) ORDER BY pk FOR UPDATE`, want)
	if err != nil {
		return nil, nil, err
	}
	var missing []registry.NotDone
	for _, pk := range want {
		if _, found := slices.BinarySearchFunc(cur, pk, func(n registry.Node, pk int64) int { return cmp.Compare(n.PK, pk) }); !found {
			missing = append(missing, registry.NotDone{PK: pk, Reason: "no such node"})
		}
	}
	return cur, missing, nil
}

// lockMatching locks the nodes f matches in pk order, refusing a filter
// that matches more than registry.MaxCordon.
func (s *Store) lockMatching(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	var q query
	q.where(f)
	cur, err := collectRows(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE `+q.cond()+
		` ORDER BY pk LIMIT `+strconv.Itoa(registry.MaxCordon+1)+` FOR UPDATE`, q.args...)
	if err != nil {
		return nil, err
	}
	if len(cur) > registry.MaxCordon {
		return nil, registry.Coded(registry.ErrConflict, registry.CodeTooManyMatched, "the filters match more than %d nodes, the most one cordon takes; nothing was cordoned: narrow them, or cordon by pks in batches", registry.MaxCordon)
	}
	return cur, nil
}

// applyDecisions asks decide what becomes of each locked node, writes the
// lifecycle fields of those it changes (cordon_reason, current_job,
// lease_expires_at, as decided), records their change-log events of kind
// and audits them under action. It returns every node, changed or not,
// ordered by pk.
func (s *Store) applyDecisions(ctx context.Context, actor registry.Actor, action, kind string, cur []registry.Node,
	decide func(registry.Node) (registry.Node, bool)) ([]registry.Node, error) {
	var out []registry.Node
	var (
		pks     []int64
		reasons []*string
		jobs    []*int64
		leases  []*time.Time
	)
	before := map[int64]registry.Node{}
	for _, n := range cur {
		next, changed := decide(n)
		if !changed {
			out = append(out, n)
			continue
		}
		before[n.PK] = n
		pks = append(pks, next.PK)
		reasons = append(reasons, next.CordonReason)
		jobs = append(jobs, next.CurrentJob)
		leases = append(leases, next.LeaseExpiresAt)
	}
	if len(pks) == 0 {
		return out, nil
	}
	changed, err := collectRows(ctx, s.db, scanNode, `
		UPDATE nodes n SET cordon_reason = u.reason, current_job = u.job, lease_expires_at = u.lease,
			updated_at = now(), version = n.version + 1
		FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::timestamptz[]) AS u(pk, reason, job, lease)
		WHERE n.pk = u.pk
		RETURNING `+qualified("n"), pks, reasons, jobs, leases)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(changed, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	if err := s.recordChanges(ctx, kind, changed...); err != nil {
		return nil, err
	}
	if err := s.auditNodes(ctx, actor, action, changed, func(n registry.Node) any { return docOfNode(before[n.PK]) }); err != nil {
		return nil, err
	}
	out = append(out, changed...)
	slices.SortFunc(out, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	return out, nil
}
