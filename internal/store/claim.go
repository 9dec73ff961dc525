package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// ClaimNodes gives c.Count free, schedulable nodes matching c.Filter to
// c.Job, all or nothing, in one transaction. Rows other claimers are
// taking are skipped (FOR UPDATE SKIP LOCKED), never waited for, and the
// row lock re-checks that a node is still free, so no node is ever given
// to two jobs. Fewer matches than asked: ErrConflict, nothing held.
//
// The transaction is two round trips (see pipeTx): BEGIN with the
// statement that picks and updates the nodes, then their change-log and
// audit rows (one statement, documents made here from what the update
// returned) with COMMIT. A gang claim adds a round trip per host it tries.
//
// Claims of nodes from anywhere (not SameHost) that arrive while others
// are under way go together (see group): their statements share one
// transaction, each claim still all or nothing.
func (s *Store) ClaimNodes(ctx context.Context, actor registry.Actor, c registry.Claim) ([]registry.Node, error) {
	if err := c.Normalize(); err != nil {
		return nil, err
	}
	free := true
	c.Filter.Free = &free
	if s.group != nil {
		s.group.claimStarts(c.Job) // a release of the job waits for it
		defer s.group.claimEnds(c.Job)
		if !c.SameHost {
			op := &groupOp{ctx: ctx, actor: actor, claim: c}
			s.group.do(op, func() { op.nodes, op.err = s.claimAlone(ctx, actor, c) })
			return op.nodes, op.err
		}
	}
	return s.claimAlone(ctx, actor, c)
}

// claimAlone is ClaimNodes in a transaction of its own.
func (s *Store) claimAlone(ctx context.Context, actor registry.Actor, c registry.Claim) ([]registry.Node, error) {
	var out []registry.Node
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		var b *pgx.Batch
		var err error
		if c.SameHost {
			out, b, err = tx.claimOneHost(ctx, c)
		} else {
			out, b, err = tx.claimAny(ctx, c)
		}
		if err != nil {
			return err
		}
		slices.SortFunc(out, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
		queueClaimRecord(b, actor, out)
		return tx.commit(ctx, b)
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, err
		}
		return nil, fmt.Errorf("store: claim: %w", translate(err))
	}
	return out, nil
}

// queueClaimRecord queues the change-log and audit rows of nodes a claim
// took (see queueRecord).
func queueClaimRecord(b *pgx.Batch, actor registry.Actor, nodes []registry.Node) {
	queueRecord(b, actor, "claimed", registry.ActionNodeClaim, nodes, func(n registry.Node) nodeDoc {
		n.CurrentJob, n.LeaseExpiresAt = nil, nil
		return docOfNode(n)
	})
}

// claimAny claims c.Count nodes matching c.Filter, lowest pk first, in
// one round trip, and returns them with the batch for the next one.
func (tx *pipeTx) claimAny(ctx context.Context, c registry.Claim) ([]registry.Node, *pgx.Batch, error) {
	b := tx.batch()
	var out []registry.Node
	queueClaim(b, c, nil, &out)
	if err := tx.send(ctx, b); err != nil {
		return nil, nil, err
	}
	if len(out) == c.Count {
		return out, tx.batch(), nil
	}
	// Too few: say how many there are. The pick ran in this transaction,
	// so it finds the rows it locked again (SKIP LOCKED skips only other
	// transactions' locks).
	b = tx.batch()
	var pks []int64
	queuePick(b, c.Filter, nil, c.Count, &pks)
	if err := tx.send(ctx, b); err != nil {
		return nil, nil, err
	}
	return nil, nil, shortClaim(len(pks), c.Count)
}

// shortClaim is the conflict of a claim of requested nodes whose pick
// found too few; found is what a second look, a moment later, counted.
// That look sees what other claims gave back or committed meanwhile, so it
// can count as many as were asked: the message then says so rather than
// "only 4 … 4 requested".
func shortClaim(found, requested int) error {
	if found < requested {
		return registry.Conflictf("only %d free node(s) match and are not being claimed right now; %d requested", found, requested)
	}
	return registry.Conflictf("fewer than %d free node(s) matched that no other claim was taking at that moment; try again", requested)
}

// queueClaim queues the statement that picks c.Count free nodes matching
// c.Filter (on, when not nil, narrows the match: to one host, or to one
// class of a host, and may return CTEs its conditions read) and gives
// them to c.Job; they are appended to out. It
// locks up to c.Count rows that no one else is locking, lowest pk first,
// and updates them only when it locked c.Count: with fewer, it updates and
// returns nothing, and the rows it locked stay locked until the
// transaction (or its savepoint) is rolled back.
func queueClaim(b *pgx.Batch, c registry.Claim, on func(*query) string, out *[]registry.Node) {
	var q query
	q.where(c.Filter)
	with := ""
	if on != nil {
		if w := on(&q); w != "" {
			with = w + ", "
		}
	}
	n := q.arg(c.Count)
	// pk = ANY(ARRAY(...)) rather than pk IN (...): an index lookup per
	// picked pk whatever the planner guesses of the pick's size (a generic
	// plan does not know the LIMIT).
	sql := `
		WITH ` + with + `picked AS MATERIALIZED (
			SELECT pk FROM nodes WHERE ` + q.cond() + ` ORDER BY pk LIMIT ` + n + ` FOR UPDATE SKIP LOCKED
		)
		UPDATE nodes SET current_job = ` + q.arg(c.Job) + `, expired_job = NULL,
			lease_expires_at = now() + ` + q.arg(leaseSeconds(c.Lease)) + `::bigint * interval '1 second',
			updated_at = now(), version = version + 1
		WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = ` + n + `
		RETURNING ` + nodeColumns
	b.Queue(sql, q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.AppendRows(*out, rows, scanNode)
		return err
	})
}

// queuePick queues the statement that locks up to n free matching nodes
// that no one else is locking, lowest pk first (on as for queueClaim);
// their pks are appended to out.
func queuePick(b *pgx.Batch, f registry.NodeFilter, on func(*query), n int, out *[]int64) {
	var q query
	q.where(f)
	if on != nil {
		on(&q)
	}
	b.Queue(`SELECT pk FROM nodes WHERE `+q.cond()+` ORDER BY pk LIMIT `+q.arg(n)+` FOR UPDATE SKIP LOCKED`, q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.AppendRows(*out, rows, pgx.RowTo[int64])
		return err
	})
}
