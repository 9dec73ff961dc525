package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// FleetCounts counts the nodes by hardware generation, fabric and state
// in one aggregate statement (one pass over nodes, then a join of the few
// groups with hardware_generations). Generations without nodes come with
// State "" so that their figures can go to zero. The state is stateSQL's
// (registry.Node.DeriveState's).
func (s *Store) FleetCounts(ctx context.Context) ([]registry.FleetCount, error) {
	rows, err := s.db.Query(ctx, `
		SELECT coalesce(h.name, ''), coalesce(c.fabric, ''), coalesce(c.state, ''), coalesce(c.nodes, 0)
		FROM (
			SELECT hardware_generation, fabric, `+stateCaseSQL()+` AS state, count(*) AS nodes
			FROM nodes
			GROUP BY 1, 2, 3
		) c
		FULL JOIN hardware_generations h ON h.pk = c.hardware_generation`)
	if err != nil {
		return nil, fmt.Errorf("store: fleet counts: %w", translate(err))
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registry.FleetCount, error) {
		var c registry.FleetCount
		var state string
		err := row.Scan(&c.Generation, &c.Fabric, &state, &c.Nodes)
		c.State = registry.State(state)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: fleet counts: %w", translate(err))
	}
	return counts, nil
}

// FabricCapacity answers, per fabric, what the nodes f selects hold: hosts,
// nodes by state, and how many hosts have each number of free nodes. One
// statement; fabrics in name order, the nodes without one last.
func (s *Store) FabricCapacity(ctx context.Context, f registry.NodeFilter) ([]registry.FabricCapacity, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	var q query
	q.where(f)
	rows, err := s.db.Query(ctx, `
		WITH n AS MATERIALIZED (
			SELECT fabric, ip, `+stateCaseSQL()+` AS state FROM nodes WHERE `+q.cond()+`
		), h AS (
			SELECT fabric, ip, count(*) FILTER (WHERE state = 'free') AS free FROM n GROUP BY 1, 2
		)
		SELECT fabric, 's', state, count(*) FROM n GROUP BY 1, 3
		UNION ALL
		SELECT fabric, 'f', free::text, count(*) FROM h GROUP BY 1, 3
		ORDER BY 1 NULLS LAST`, q.args...)
	if err != nil {
		return nil, fmt.Errorf("store: fabric capacity: %w", translate(err))
	}
	var out []registry.FabricCapacity
	var fabric *string
	var kind, key string
	var count int64
	_, err = pgx.ForEachRow(rows, []any{&fabric, &kind, &key, &count}, func() error {
		if len(out) == 0 || !samePtr(out[len(out)-1].Fabric, fabric) {
			c := registry.FabricCapacity{Nodes: map[registry.State]int64{}}
			if fabric != nil {
				name := *fabric
				c.Fabric = &name
			}
			for _, st := range registry.States {
				c.Nodes[st] = 0
			}
			out = append(out, c)
		}
		c := &out[len(out)-1]
		if kind == "s" {
			c.Nodes[registry.State(key)] = count
			return nil
		}
		free, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			return err
		}
		c.Hosts += count
		c.FreeHosts = append(c.FreeHosts, registry.FreeHosts{Free: free, Hosts: count})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: fabric capacity: %w", translate(err))
	}
	for i := range out {
		slices.SortFunc(out[i].FreeHosts, func(a, b registry.FreeHosts) int { return cmp.Compare(a.Free, b.Free) })
	}
	return out, nil
}

func samePtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
