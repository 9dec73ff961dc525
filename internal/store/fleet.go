package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// FleetCounts counts the nodes by hardware generation and state in one
// aggregate statement (one pass over nodes, then a join of the few groups
// with hardware_generations). Generations without nodes come with State ""
// so that their figures can go to zero. The CASE follows
// registry.Node.DeriveState.
func (s *Store) FleetCounts(ctx context.Context) ([]registry.FleetCount, error) {
	rows, err := s.db.Query(ctx, `
		SELECT coalesce(h.name, ''), coalesce(c.state, ''), coalesce(c.nodes, 0)
		FROM (
			SELECT hardware_generation,
			       CASE WHEN NOT schedulable THEN 'gone'
			            WHEN lost THEN 'lost'
			            WHEN cordon_reason IS NOT NULL AND current_job IS NOT NULL THEN 'draining'
			            WHEN cordon_reason IS NOT NULL THEN 'cordoned'
			            WHEN current_job IS NOT NULL THEN 'busy'
			            ELSE 'free' END AS state,
			       count(*) AS nodes
			FROM nodes
			GROUP BY 1, 2
		) c
		FULL JOIN hardware_generations h ON h.pk = c.hardware_generation`)
	if err != nil {
		return nil, fmt.Errorf("store: fleet counts: %w", translate(err))
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registry.FleetCount, error) {
		var c registry.FleetCount
		var state string
		err := row.Scan(&c.Generation, &state, &c.Nodes)
		c.State = registry.State(state)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: fleet counts: %w", translate(err))
	}
	return counts, nil
}
