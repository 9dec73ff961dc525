package store

import (
	"slices"
	"strings"

	"github.com/registryd/registryd/internal/registry"
)

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
