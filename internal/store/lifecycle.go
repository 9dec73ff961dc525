package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// sweepCandidates selects, with the liveness join, every node one of the
// lifecycle's rules might apply to as of $1 (now - TTL) and $2 (now): the
// domain decides which of them do. Each part is driven by an index of
// migration 00010 or 00011, so a pass reads the few nodes that may change,
// never the whole fleet. Candidate rows are locked, skipping rows someone
// else holds (a claim, a release, an edit): the sweep never waits for a
// request, and a skipped node is looked at again on the next pass. The
// small sides (silent heartbeats, unseen agents' nodes, lost nodes) are
// collected first as arrays, so the planner probes the big tables by key
// instead of hashing them whole.
var sweepCandidates = `
	WITH c AS (
		-- heartbeated, silent past the TTL, not lost yet
		SELECT n.pk FROM nodes n
		WHERE n.pk = ANY (ARRAY(SELECT node_pk FROM node_liveness WHERE last_seen < $1)) AND NOT n.lost
		UNION
		-- an agent's node that never heartbeated, untouched past the TTL
		SELECT n.pk FROM nodes n
		WHERE n.pk = ANY (ARRAY(SELECT node_pk FROM node_liveness WHERE last_seen IS NULL))
		  AND n.owner IS NOT NULL AND NOT n.lost AND n.updated_at < $1
		UNION
		-- lost, and heard of again within the TTL
		SELECT l.node_pk FROM node_liveness l
		WHERE l.node_pk = ANY (ARRAY(SELECT pk FROM nodes WHERE lost)) AND l.last_seen >= $1
		UNION
		-- a lease run out
		SELECT pk FROM nodes WHERE lease_expires_at <= $2
	)
	SELECT ` + withLiveness("n") + `
	FROM nodes n LEFT JOIN node_liveness l ON l.node_pk = n.pk
	WHERE n.pk IN (SELECT pk FROM c)
	ORDER BY n.pk
	FOR UPDATE OF n SKIP LOCKED`

// SweepLifecycle runs one pass of the lifecycle's rules (registry
// DecideSweep) with node TTL ttl, in one transaction: nodes silent past the
// TTL are marked lost, lost nodes heard of again are found, and claims whose
// lease ran out are released, each with a change-log event (lost, found,
// expired) and an audit entry (principal system:lifecycle for lost and
// found, system:lease for expiries) committed with the change. It returns
// the pks it changed. It first folds the free counts' deltas (FoldHostFree),
// in a transaction of its own, and deletes idempotency records kept long
// enough and the rows of jobs that hold nothing (see pruneJobs; at most
// 1,000 of each a pass). Callers make sure one pass runs at a time (the
// sweeper's advisory lock); the statements are guarded besides, so a
// pass that overlapped another would find nothing left to do.
func (s *Store) SweepLifecycle(ctx context.Context, ttl time.Duration) (registry.Sweep, error) {
	var done registry.Sweep
	if err := s.FoldHostFree(ctx); err != nil {
		return done, err
	}
	if _, err := s.db.Exec(ctx, pruneKeysSQL); err != nil {
		return done, fmt.Errorf("store: prune idempotency keys: %w", translate(err))
	}
	if err := s.pruneJobs(ctx); err != nil {
		return done, err
	}
	err := s.WithTx(ctx, func(tx *Store) error {
		var now time.Time
		if err := tx.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		candidates, err := collectRows(ctx, tx.db, scanNode, sweepCandidates, now.Add(-ttl), now)
		if err != nil {
			return err
		}
		decided := registry.DecideSweep(candidates, now, ttl)
		if decided.Empty() {
			return nil
		}
		byPK := make(map[int64]registry.Node, len(candidates))
		for _, n := range candidates {
			byPK[n.PK] = n
		}
		lifecycle := registry.Actor{Principal: registry.Principal{Sub: registry.LifecyclePrincipal, Role: registry.RoleSystem}}
		if done.Lost, err = tx.applySweep(ctx, lifecycle, decided.Lost, "lost", registry.ActionNodeLost,
			`lost = true`, `NOT lost`, func(n registry.Node) registry.Node { n.Lost = false; return n }); err != nil {
			return err
		}
		if done.Found, err = tx.applySweep(ctx, lifecycle, decided.Found, "found", registry.ActionNodeFound,
			`lost = false`, `lost`, func(n registry.Node) registry.Node { n.Lost = true; return n }); err != nil {
			return err
		}
		lease := registry.Actor{Principal: registry.Principal{Sub: registry.LeasePrincipal, Role: registry.RoleSystem}}
		done.Expired, err = tx.applySweep(ctx, lease, decided.Expired, "expired", registry.ActionNodeExpire,
			`expired_job = current_job, current_job = NULL, lease_expires_at = NULL`, `lease_expires_at <= now()`,
			func(n registry.Node) registry.Node {
				was := byPK[n.PK]
				n.CurrentJob, n.LeaseExpiresAt = was.CurrentJob, was.LeaseExpiresAt
				return n
			})
		return err
	})
	if err != nil {
		return registry.Sweep{}, fmt.Errorf("store: sweep: %w", translate(err))
	}
	return done, nil
}

// applySweep sets set on the nodes pks that still satisfy guard, in one
// statement, and records one change of kind and one audit entry of action
// per changed node; before rebuilds a node as it was. It returns the pks
// changed.
func (s *Store) applySweep(ctx context.Context, actor registry.Actor, pks []int64, kind, action, set, guard string,
	before func(registry.Node) registry.Node) ([]int64, error) {
	if len(pks) == 0 {
		return nil, nil
	}
	changed, err := collectRows(ctx, s.db, scanNode, `
		UPDATE nodes SET `+set+`, updated_at = now(), version = version + 1
		WHERE pk = ANY($1) AND `+guard+`
		RETURNING `+nodeColumns, pks)
	if err != nil {
		return nil, err
	}
	if len(changed) == 0 {
		return nil, nil
	}
	slices.SortFunc(changed, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	if err := s.recordChanges(ctx, kind, changed...); err != nil {
		return nil, err
	}
	if err := s.auditNodes(ctx, actor, action, changed, func(n registry.Node) any { return docOfNode(before(n)) }); err != nil {
		return nil, err
	}
	out := make([]int64, len(changed))
	for i, n := range changed {
		out[i] = n.PK
	}
	return out, nil
}

// pruneJobs deletes the rows of jobs that hold no nodes and were last
// taken over more than jobKeep ago, at most 1,000 a pass: such a job
// belongs to whoever claims it next anyway. The rows are locked first
// (skipping those a claim or release holds), and only then, in a snapshot
// taken after the locks, checked to hold nothing: a claim of the job that
// committed before is seen, one that comes after waits and creates the
// row again.
func (s *Store) pruneJobs(ctx context.Context) error {
	err := s.WithTx(ctx, func(tx *Store) error {
		jobs, err := collectRows(ctx, tx.db, pgx.RowTo[int64], `
			SELECT job FROM jobs WHERE claimed_at < now() - $1::bigint * interval '1 second'
			ORDER BY claimed_at LIMIT 1000 FOR UPDATE SKIP LOCKED`, int64(jobKeep/time.Second))
		if err != nil || len(jobs) == 0 {
			return err
		}
		_, err = tx.db.Exec(ctx, `
			DELETE FROM jobs j WHERE j.job = ANY($1)
			AND NOT EXISTS (SELECT 1 FROM nodes WHERE current_job = j.job)`, jobs)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: prune jobs: %w", translate(err))
	}
	return nil
}

// jobKeep is how long a job's row stays after it was claimed (or taken
// over) while it holds nothing.
const jobKeep = time.Hour
