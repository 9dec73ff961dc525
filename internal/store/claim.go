package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// ClaimNodes gives c.Count free, schedulable nodes matching c.Filter to
// c.Job, all or nothing, in one transaction. Rows other claimers are
// taking are skipped (FOR UPDATE SKIP LOCKED), never waited for, and the
// row lock re-checks that a node is still free, so no node is ever given
// to two jobs. Fewer matches than asked: ErrConflict, nothing held.
//
// Alone, the transaction is two round trips (see pipeTx): BEGIN with the
// statement that picks and updates the nodes, then their change-log and
// audit rows with COMMIT; a gang claim (c.SameHost) adds a round trip per
// host it tries. Claims of nodes from anywhere may share a transaction
// with other claims and releases (see group), each still all or nothing.
// A release of c.Job on this replica waits for the claim to end (see
// jobClaims).
func (s *Store) ClaimNodes(ctx context.Context, actor registry.Actor, c registry.Claim) ([]registry.Node, error) {
	if err := c.Normalize(); err != nil {
		return nil, err
	}
	free := true
	c.Filter.Free = &free
	defer s.claims.start(c.Job).end(c.Job)
	cl := &claiming{c: c, owner: actor.Sub, caller: ctx}
	var op txOp = cl
	switch {
	case c.SameHost:
		op = &gangClaim{claiming: cl, tried: []string{}}
	case c.PerHost > 0:
		op = &hostsClaim{claiming: cl}
	}
	if err := s.run(&groupOp{txOp: op, ctx: ctx, actor: actor}); err != nil {
		return nil, err
	}
	return cl.nodes, nil
}

// claiming is a claim of c.Count nodes from anywhere, lowest pk first: one
// statement, which takes all of them or none.
type claiming struct {
	c      registry.Claim
	caller context.Context // the caller's: a gang claim stops trying hosts once it is done
	owner  string          // the claimer's principal, who must own c.Job
	owned  bool            // whether owner owns c.Job (see queueOwn)
	nodes  []registry.Node // what it took
	before []nodeBefore    // what it changed of each node it took
}

func (cl *claiming) queue(b *pgx.Batch) {
	queueOwn(b, cl.c.Job, cl.owner, &cl.owned)
	queueClaim(b, cl.c, cl.owner, cl.named(), &cl.nodes, &cl.before)
}

// named narrows a claim of named nodes to them; nil for other claims.
func (cl *claiming) named() func(*query) string {
	if cl.c.Nodes == nil {
		return nil
	}
	return func(q *query) string {
		q.add("pk = ANY(" + q.arg(cl.c.Nodes) + "::bigint[])")
		return ""
	}
}

// withdraw queues the statement that puts the nodes the claim took back
// as they were before it, version and updated_at included, so that the
// transaction commits nothing of it: no one saw the claim (it records
// nothing), so no one may see a trace of it.
func (cl *claiming) withdraw(b *pgx.Batch) {
	if len(cl.before) > 0 {
		pks := make([]int64, len(cl.before))
		expired := make([]*int64, len(cl.before))
		updated := make([]time.Time, len(cl.before))
		for i, p := range cl.before {
			pks[i], expired[i], updated[i] = p.pk, p.expiredJob, p.updatedAt
		}
		b.Queue(unclaimSQL, pks, expired, updated, cl.c.Job)
	}
	cl.nodes, cl.before = nil, nil
}

func (cl *claiming) job() int64 { return cl.c.Job }

// nodeBefore is what a claim changes of a node besides its job and lease
// (which were null: the node was free), as it was before.
type nodeBefore struct {
	pk         int64
	expiredJob *int64
	updatedAt  time.Time
}

// unclaimSQL puts nodes ($1) a claim of job $4 took in this transaction
// back as they were: no job, no lease, their expired_job ($2), updated_at
// ($3) and version before it.
const unclaimSQL = `
	UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, expired_job = u.expired_job,
		updated_at = u.updated_at, version = version - 1
	FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) AS u(pk, expired_job, updated_at)
	WHERE nodes.pk = u.pk AND nodes.current_job = $4`

// refused is the answer to a claim of a job another principal owns: in
// a group, errRunAlone (it changed nothing), alone the 403.
func (cl *claiming) refused(alone bool) error {
	if !alone {
		return errRunAlone
	}
	return jobOwnedByOther(cl.c.Job)
}

// jobOwnedByOther is the 403 of a claim, renewal or release of a job
// that holds nodes another principal claimed.
func jobOwnedByOther(job int64) error {
	return registry.Coded(registry.ErrForbidden, registry.CodeJobOwnedByOther,
		"job %d holds nodes another principal claimed: choose a job id of your own", job)
}

// lockJobSQL creates job $1's row (owned by $2, NULL: no one) or locks
// it as it is. A row another transaction is inserting is waited for (a
// SELECT … FOR UPDATE would not see it), so the transactions of one job
// that begin with it are ordered, even the first.
const lockJobSQL = `INSERT INTO jobs AS j (job, owner) VALUES ($1, $2)
	ON CONFLICT (job) DO UPDATE SET owner = j.owner WHERE false`

// queueOwn queues the statements that give a claim's job to owner when
// it may have it, before the claim's own: the job's row is created, or
// locked as it is (a claim, renewal or release of the job elsewhere waits
// for this transaction, and this one for them), then, read after the
// lock, taken over when it has no owner or holds no nodes. owned is set
// to whether owner owns it then; queueClaim's statement claims nothing
// for a job owner does not own.
func queueOwn(b *pgx.Batch, job int64, owner string, owned *bool) {
	b.Queue(lockJobSQL, job, owner)
	b.Queue(`
		WITH took AS (
			UPDATE jobs SET owner = $2, claimed_at = now()
			WHERE job = $1 AND owner IS DISTINCT FROM $2
				AND (owner IS NULL OR NOT EXISTS (SELECT 1 FROM nodes WHERE current_job = $1))
			RETURNING job
		)
		SELECT EXISTS (SELECT 1 FROM took) OR EXISTS (SELECT 1 FROM jobs WHERE job = $1 AND owner = $2)`,
		job, owner).QueryRow(func(row pgx.Row) error { return row.Scan(owned) })
}

// settle keeps what the claim took. Too few: beside others it runs again
// alone; alone, a second look says how many there are. That look runs in
// the same transaction, so it finds the rows the claim locked again (SKIP
// LOCKED skips only other transactions' locks).
func (cl *claiming) settle(ctx context.Context, tx *pipeTx, b *pgx.Batch, actor registry.Actor, alone bool) (*pgx.Batch, bool, error) {
	if !cl.owned {
		return nil, false, cl.refused(alone)
	}
	if len(cl.nodes) == cl.c.Count {
		cl.record(b, actor)
		return b, true, nil
	}
	cl.nodes = nil // its update took all or none: none
	if !alone {
		return b, false, errRunAlone
	}
	if cl.c.Nodes != nil {
		var why []string
		queueWhyNot(b, cl.c.Filter, cl.c.Nodes, &why)
		if err := tx.send(ctx, b); err != nil {
			return nil, false, err
		}
		return nil, false, registry.Coded(registry.ErrConflict, registry.CodeInsufficientCapacity,
			"a claim of named nodes takes all of them or none: %s", strings.Join(why, "; "))
	}
	var pks []int64
	queuePick(b, cl.c.Filter, cl.c.Count, &pks)
	if err := tx.send(ctx, b); err != nil {
		return nil, false, err
	}
	return nil, false, shortClaim(len(pks), cl.c.Count)
}

// stateCaseSQL is a node's state in SQL, as one CASE over stateSQL.
func stateCaseSQL() string {
	var b strings.Builder
	b.WriteString("CASE")
	for _, st := range registry.States {
		b.WriteString(" WHEN " + stateSQL[st] + " THEN '" + string(st) + "'")
	}
	b.WriteString(" END")
	return b.String()
}

// queueWhyNot queues the look that says, of each named node a claim could
// not take, why: it does not exist, is not free (its state), does not
// match the claim's filters, or another claim was taking it. The reasons
// are appended to why, by pk.
func queueWhyNot(b *pgx.Batch, f registry.NodeFilter, pks []int64, why *[]string) {
	var q query
	q.where(f)
	b.Queue(`
		SELECT u.pk, n.state_row IS NOT NULL, coalesce(n.free, false), coalesce(n.matches, false), n.state_row
		FROM unnest(`+q.arg(pks)+`::bigint[]) AS u(pk)
		LEFT JOIN LATERAL (
			SELECT (`+freeSQL+`) AS free, (`+q.cond()+`) AS matches,
				`+stateCaseSQL()+` AS state_row
			FROM nodes WHERE nodes.pk = u.pk
		) n ON true
		ORDER BY u.pk`, q.args...).Query(func(rows pgx.Rows) error {
		var pk int64
		var exists, free, matches bool
		var state *string
		_, err := pgx.ForEachRow(rows, []any{&pk, &exists, &free, &matches, &state}, func() error {
			switch {
			case !exists:
				*why = append(*why, fmt.Sprintf("node %d does not exist", pk))
			case !free:
				*why = append(*why, fmt.Sprintf("node %d is %s", pk, *state))
			case !matches:
				*why = append(*why, fmt.Sprintf("node %d does not match the claim's filters", pk))
			default:
				*why = append(*why, fmt.Sprintf("node %d is free but another claim was taking it; try again", pk))
			}
			return nil
		})
		return err
	})
}

// record queues the change-log and audit rows of the nodes the claim took
// (see queueRecord), in pk order.
func (cl *claiming) record(b *pgx.Batch, actor registry.Actor) {
	slices.SortFunc(cl.nodes, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	queueRecord(b, actor, "claimed", registry.ActionNodeClaim, cl.nodes, func(n registry.Node) nodeDoc {
		n.CurrentJob, n.LeaseExpiresAt = nil, nil
		return docOfNode(n)
	})
}

func (cl *claiming) shares() bool { return true }
func (cl *claiming) reset()       { cl.nodes, cl.before, cl.owned = nil, nil, false }
func (cl *claiming) kind() string { return "claim" }

// shortClaim is the conflict of a claim of requested nodes whose pick
// found too few; found is what a second look, a moment later, counted.
// That look sees what other claims gave back or committed meanwhile, so it
// can count as many as were asked: the message then says so rather than
// "only 4 … 4 requested".
func shortClaim(found, requested int) error {
	if found < requested {
		return registry.Coded(registry.ErrConflict, registry.CodeInsufficientCapacity, "only %d free node(s) match and are not being claimed right now; %d requested", found, requested)
	}
	return registry.Coded(registry.ErrConflict, registry.CodeInsufficientCapacity, "fewer than %d free node(s) matched that no other claim was taking at that moment; try again", requested)
}

// queueClaim queues the statement that picks c.Count free nodes matching
// c.Filter, when owner owns c.Job (see queueOwn), (on, when not nil, narrows the match: to one host, or to one
// class of a host, and may return CTEs its conditions read) and gives
// them to c.Job; they are appended to out, and what the claim changed of
// each to before (when not nil). It
// locks up to c.Count rows that no one else is locking, lowest pk first,
// and updates them only when it locked c.Count: with fewer, it updates and
// returns nothing, and the rows it locked stay locked until the
// transaction (or its savepoint) is rolled back.
func queueClaim(b *pgx.Batch, c registry.Claim, owner string, on func(*query) string, out *[]registry.Node, before *[]nodeBefore) {
	var q query
	q.where(c.Filter)
	q.add("EXISTS (SELECT 1 FROM jobs WHERE job = " + q.arg(c.Job) + " AND owner = " + q.arg(owner) + ")")
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
			SELECT pk, expired_job, updated_at FROM nodes WHERE ` + q.cond() + ` ORDER BY pk LIMIT ` + n + ` FOR UPDATE SKIP LOCKED
		)
		UPDATE nodes SET current_job = ` + q.arg(c.Job) + `, expired_job = NULL,
			lease_expires_at = now() + ` + q.arg(leaseSeconds(c.Lease)) + `::bigint * interval '1 second',
			updated_at = now(), version = version + 1
		WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = ` + n + `
		RETURNING ` + nodeColumns + `,
			(SELECT p.expired_job FROM picked p WHERE p.pk = nodes.pk), (SELECT p.updated_at FROM picked p WHERE p.pk = nodes.pk)`
	b.Queue(sql, q.args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var n registry.Node
			var p nodeBefore
			if err := rows.Scan(append(nodeDests(&n), &p.expiredJob, &p.updatedAt)...); err != nil {
				return err
			}
			p.pk = n.PK
			n.State = n.DeriveState()
			*out = append(*out, n.UTC())
			if before != nil {
				*before = append(*before, p)
			}
		}
		return rows.Err()
	})
}

// queuePick queues the statement that locks up to n free matching nodes
// that no one else is locking, lowest pk first; their pks are appended
// to out.
func queuePick(b *pgx.Batch, f registry.NodeFilter, n int, out *[]int64) {
	var q query
	q.where(f)
	b.Queue(`SELECT pk FROM nodes WHERE `+q.cond()+` ORDER BY pk LIMIT `+q.arg(n)+` FOR UPDATE SKIP LOCKED`, q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.AppendRows(*out, rows, pgx.RowTo[int64])
		return err
	})
}
