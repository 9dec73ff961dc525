package store

import (
	"context"
	"fmt"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// expectHeartbeats notes that an agent now owns node n and is expected to
// heartbeat: a liveness row with no last_seen, which the lifecycle sweeper
// times from the node's last write until the first heartbeat (see
// registry.Node.Silent). Nodes without an owner get none.
func (s *Store) expectHeartbeats(ctx context.Context, n registry.Node) error {
	if n.Owner == nil {
		return nil
	}
	_, err := s.db.Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, NULL) ON CONFLICT (node_pk) DO NOTHING`, n.PK)
	return err
}

// TouchNodes records heartbeats: each node's last_seen becomes the given
// time unless it already holds a later one. Missing nodes are skipped. It
// writes node_liveness only, so it never locks a node row a claim wants.
// Rows are written in pk order so that replicas flushing overlapping
// batches cannot deadlock. The same statement notifies LivenessChannel
// with the batch (registry.FormatLiveness), so that every replica's node
// cache learns the new times exactly when they commit.
func (s *Store) TouchNodes(ctx context.Context, pks []int64, seen []time.Time) error {
	_, err := s.db.Exec(ctx, `
		WITH touch AS (
			INSERT INTO node_liveness (node_pk, last_seen)
			SELECT u.pk, u.t FROM unnest($1::bigint[], $2::timestamptz[]) AS u(pk, t)
			WHERE EXISTS (SELECT 1 FROM nodes n WHERE n.pk = u.pk)
			ORDER BY u.pk
			ON CONFLICT (node_pk) DO UPDATE SET last_seen = excluded.last_seen
			WHERE node_liveness.last_seen IS NULL OR node_liveness.last_seen < excluded.last_seen
		)
		SELECT pg_notify($3, p) FROM unnest($4::text[]) AS p`,
		pks, seen, LivenessChannel, registry.FormatLiveness(pks, seen, maxPayload))
	if err != nil {
		return fmt.Errorf("store: touch nodes: %w", translate(err))
	}
	return nil
}
