package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// ReleaseNodes takes nodes back from r.Job: the listed ones, or all it
// holds. Listed nodes the job does not hold are reported, not failed.
// It first waits for the claims of r.Job under way on this replica (see
// jobClaims), then locks the job's row, which waits for the claims of the
// job under way on any replica (see queueOwn), so that it releases what
// they took. A job holding nodes another principal claimed is refused
// (403 job_owned_by_other) unless actor is an admin.
//
// Alone, it is two round trips (see pipeTx): BEGIN, the lock of the nodes
// and their update; then their change-log and audit rows with COMMIT. It
// may share a transaction with other claims and releases (see group).
func (s *Store) ReleaseNodes(ctx context.Context, actor registry.Actor, r registry.Release) ([]registry.Node, []registry.NotReleased, error) {
	if err := r.Normalize(); err != nil {
		return nil, nil, err
	}
	if err := s.claims.wait(ctx, r.Job); err != nil {
		return nil, nil, fmt.Errorf("store: release: %w", translate(err))
	}
	rl := &releasing{r: r, by: actor.Sub, admin: actor.Role == registry.RoleAdmin}
	if err := s.run(&groupOp{txOp: rl, ctx: ctx, actor: actor}); err != nil {
		return nil, nil, err
	}
	return rl.released, rl.notReleased, nil
}

// releasing is one release: queue sends its lock and update, settle
// decides from what they returned and records what it released. The
// update re-states on the locked rows what settle decides from them (held
// by r.Job), and the two are checked to agree.
type releasing struct {
	r           registry.Release
	by          string // the releasing principal
	admin       bool   // whether it may release any job
	holds       bool   // whether the job holds nodes after the update
	refused     bool   // whether another principal owns the job (the updates took nothing)
	released    []registry.Node
	notReleased []registry.NotReleased
	// Listed nodes (r.Nodes set): the pks asked for, sorted, and what the
	// lock found each held by.
	want          []int64
	held, expired map[int64]*int64
}

func (rl *releasing) shares() bool { return true }
func (rl *releasing) reset()       { *rl = releasing{r: rl.r, by: rl.by, admin: rl.admin} }
func (rl *releasing) kind() string { return "release" }

// settle decides the release's outcome and queues the records of what it
// released on b.
func (rl *releasing) settle(_ context.Context, _ *pipeTx, b *pgx.Batch, actor registry.Actor, alone bool) (*pgx.Batch, bool, error) {
	if rl.refused && rl.holds {
		// Its update changed nothing.
		if !alone {
			return nil, false, errRunAlone
		}
		return nil, false, jobOwnedByOther(rl.r.Job)
	}
	if err := rl.decide(); err != nil {
		return nil, false, err
	}
	if len(rl.released) == 0 {
		return b, false, nil
	}
	rl.record(b, actor)
	return b, true, nil
}

// queue queues the statements that lock the nodes to release and take
// them back from the job.
//
// The job's row is locked first, and the updates take nothing from a job
// another principal owns unless rl.admin; a last statement says whether
// the job still holds nodes (then, refused, the release is a 403).
func (rl *releasing) queue(b *pgx.Batch) {
	r := rl.r
	b.Queue(lockJobSQL, r.Job, nil)
	// The permission, re-stated in each update (evaluated after the lock).
	mayRelease := ` AND ($2::bool OR NOT EXISTS (SELECT 1 FROM jobs WHERE job = $1 AND owner <> $3::text))`
	defer func() {
		b.Queue(`SELECT EXISTS (SELECT 1 FROM nodes WHERE current_job = $1), $2::bool OR NOT EXISTS (SELECT 1 FROM jobs WHERE job = $1 AND owner <> $3::text)`,
			r.Job, rl.admin, rl.by).QueryRow(func(row pgx.Row) error {
			var may bool
			err := row.Scan(&rl.holds, &may)
			rl.refused = !may
			return err
		})
	}()
	if r.Nodes == nil {
		b.Queue(`
			WITH held AS MATERIALIZED (
				SELECT pk FROM nodes WHERE current_job = $1 ORDER BY pk FOR UPDATE
			)
			UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
			WHERE pk = ANY(ARRAY(SELECT pk FROM held)) AND current_job = $1`+mayRelease+`
			RETURNING `+nodeColumns, r.Job, rl.admin, rl.by).Query(func(rows pgx.Rows) error {
			var err error
			rl.released, err = pgx.AppendRows(rl.released, rows, scanNode)
			return err
		})
		// The nodes whose lease of this job ran out: the job thinks it
		// holds them, and is told it does not.
		b.Queue(`SELECT pk FROM nodes WHERE expired_job = $1 ORDER BY pk`, r.Job).Query(func(rows pgx.Rows) error {
			lapsed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			for _, pk := range lapsed {
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: registry.LeaseExpiredReason(r.Job)})
			}
			return err
		})
		return
	}
	rl.want = slices.Compact(slices.Sorted(slices.Values(r.Nodes)))
	rl.held, rl.expired = map[int64]*int64{}, map[int64]*int64{}
	b.Queue(`SELECT pk, current_job, expired_job FROM nodes WHERE pk = ANY($1) ORDER BY pk FOR UPDATE`, rl.want).Query(func(rows pgx.Rows) error {
		var pk int64
		var job, expiredJob *int64
		_, err := pgx.ForEachRow(rows, []any{&pk, &job, &expiredJob}, func() error {
			rl.held[pk], rl.expired[pk] = job, expiredJob
			return nil
		})
		return err
	})
	b.Queue(`
		UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
		WHERE pk = ANY($4) AND current_job = $1`+mayRelease+`
		RETURNING `+nodeColumns, r.Job, rl.admin, rl.by, rl.want).Query(func(rows pgx.Rows) error {
		var err error
		rl.released, err = pgx.AppendRows(rl.released, rows, scanNode)
		return err
	})
}

// decide finds, from what the queued statements returned, which listed
// nodes were not released and why, and checks that the update took
// exactly the nodes the lock found held by the job.
func (rl *releasing) decide() error {
	r := rl.r
	var pks []int64 // the nodes to release, as decided here
	if r.Nodes == nil {
		for _, n := range rl.released {
			pks = append(pks, n.PK)
		}
	} else {
		for _, pk := range rl.want {
			job, ok := rl.held[pk]
			switch {
			case !ok:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: "no such node"})
			case job == nil && rl.expired[pk] != nil && *rl.expired[pk] == r.Job:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: registry.LeaseExpiredReason(r.Job)})
			case job == nil:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: "not held by any job"})
			case *job != r.Job:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: fmt.Sprintf("held by job %d", *job)})
			default:
				pks = append(pks, pk)
			}
		}
	}
	slices.Sort(pks)
	slices.SortFunc(rl.released, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	if !slices.EqualFunc(pks, rl.released, func(pk int64, n registry.Node) bool { return pk == n.PK }) {
		// The rows were locked before they were updated: this cannot
		// happen unless the statements disagree.
		return fmt.Errorf("job %d holds %d of the nodes, %d were updated", r.Job, len(pks), len(rl.released))
	}
	return nil
}

// record queues the change-log and audit rows of the released nodes.
func (rl *releasing) record(b *pgx.Batch, actor registry.Actor) {
	job := rl.r.Job
	queueRecord(b, actor, "released", registry.ActionNodeRelease, rl.released, func(n registry.Node) nodeDoc {
		n.CurrentJob = &job
		return docOfNode(n)
	})
}
