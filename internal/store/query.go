package store

import (
	"slices"
	"strconv"
	"strings"

	"github.com/registryd/registryd/internal/registry"
)

// freeSQL is registry.StateFree in SQL, spelled exactly as the partial
// free indexes' predicate (migration 00010) so the planner uses them.
const freeSQL = "current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL"

// listQuery is the statement ListNodes runs for a normalized filter.
func listQuery(f registry.NodeFilter) (string, []any) {
	var q query
	q.where(f)
	sql := `SELECT ` + nodeColumns + ` FROM nodes WHERE ` + q.cond() + ` ORDER BY pk`
	if f.Limit > 0 {
		sql += " LIMIT " + q.arg(f.Limit)
	}
	return sql, q.args
}

// query builds a WHERE clause from a filter, values always as placeholders.
type query struct {
	conds []string
	args  []any
}

func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

func (q *query) add(cond string) { q.conds = append(q.conds, cond) }

// ipWhere selects the addresses in column that a normalized ip filter
// selects: equal to an address, or between a prefix's first and last
// address (nodes hold host addresses, ordered by value within a family),
// which the btree indexes on ip answer as a range.
func (q *query) ipWhere(column, filter string) {
	first, last, err := registry.IPRange(filter)
	if err != nil || first == last {
		q.add(column + " = " + q.arg(filter) + "::inet")
		return
	}
	q.add(column + " BETWEEN " + q.arg(first.String()) + "::inet AND " + q.arg(last.String()) + "::inet")
}

func (q *query) cond() string { return strings.Join(q.conds, " AND ") }

func (q *query) where(f registry.NodeFilter) {
	q.add("pk > " + q.arg(f.After))
	if f.Free != nil {
		// Spelled exactly as the partial indexes' predicate so the planner
		// can use them.
		if *f.Free {
			q.add(freeSQL)
		} else {
			q.add("NOT (" + freeSQL + ")")
		}
	}
	if len(f.State) > 0 {
		q.add(statesSQL(f.State))
	}
	if f.Source != nil {
		q.add("source = " + q.arg(*f.Source))
	}
	if f.CurrentJob != nil {
		q.add("current_job = " + q.arg(*f.CurrentJob))
	}
	if f.HardwareGeneration != nil {
		q.add("hardware_generation = " + q.arg(*f.HardwareGeneration))
	}
	if f.MinGPUMem != nil {
		q.add("gpu_mem >= " + q.arg(*f.MinGPUMem))
	}
	if f.MinCPUMem != nil {
		q.add("cpu_mem >= " + q.arg(*f.MinCPUMem))
	}
	if f.IP != nil {
		q.ipWhere("ip", *f.IP)
	}
	if f.Index != nil {
		q.add("gpu_index = " + q.arg(*f.Index))
	}
	if f.PK != nil {
		q.add("pk = " + q.arg(*f.PK))
	}
	if f.Owner != nil {
		q.add("owner = " + q.arg(*f.Owner))
	}
	if f.Fabric != nil {
		q.add("fabric = " + q.arg(*f.Fabric))
	}
	for _, r := range f.Selector {
		q.add(q.requirement(r))
	}
	if f.SeenWithin != nil {
		q.add("EXISTS (SELECT 1 FROM node_liveness l WHERE l.node_pk = nodes.pk AND l.last_seen >= now() - " + q.arg(*f.SeenWithin) + "::interval)")
	}
}

// requirement is a selector requirement in SQL, with Selector.Matches'
// meaning: an absent label satisfies != and notin.
func (q *query) requirement(r registry.Requirement) string {
	key := q.arg(r.Key)
	switch r.Op {
	case registry.OpEquals:
		return "labels ->> " + key + "::text = " + q.arg(r.Values[0]) + "::text"
	case registry.OpNotEquals:
		return "(labels ->> " + key + "::text) IS DISTINCT FROM " + q.arg(r.Values[0]) + "::text"
	case registry.OpIn:
		return "labels ->> " + key + "::text = ANY(" + q.arg(r.Values) + "::text[])"
	case registry.OpNotIn:
		return "NOT coalesce(labels ->> " + key + "::text = ANY(" + q.arg(r.Values) + "::text[]), false)"
	case registry.OpExists:
		return "labels ? " + key + "::text"
	default: // OpNotExists
		return "NOT labels ? " + key + "::text"
	}
}

// stateSQL is each registry.State in SQL: registry.Node.DeriveState's
// precedence spelled out, so that exactly one holds for every row. Free is
// freeSQL, the free indexes' predicate.
var stateSQL = map[registry.State]string{
	registry.StateGone:     "NOT schedulable",
	registry.StateLost:     "schedulable AND lost",
	registry.StateDraining: "schedulable AND NOT lost AND cordon_reason IS NOT NULL AND current_job IS NOT NULL",
	registry.StateCordoned: "schedulable AND NOT lost AND cordon_reason IS NOT NULL AND current_job IS NULL",
	registry.StateBusy:     "schedulable AND NOT lost AND cordon_reason IS NULL AND current_job IS NOT NULL",
	registry.StateFree:     freeSQL,
}

// statesSQL selects nodes in any of states (valid, at least one).
func statesSQL(states []registry.State) string {
	states = slices.Compact(slices.Sorted(slices.Values(states)))
	conds := make([]string, len(states))
	for i, st := range states {
		conds[i] = "(" + stateSQL[st] + ")"
	}
	if len(conds) == 1 {
		return conds[0]
	}
	return "(" + strings.Join(conds, " OR ") + ")"
}
