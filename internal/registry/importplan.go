package registry

import (
	"context"
	"fmt"
	"strings"
)

// The sync import's decisions, node by node, as plain functions like the
// lifecycle's (lifecycle.go): the store selects the nodes a pass may touch,
// asks ImportPlan.Decide about each, and applies the writes.

// ImportKey is a node's identity within an inventory: (ip, index).
type ImportKey struct {
	IP    string
	Index int
}

// ImportPlan is one provider's pass: what its inventory wants.
type ImportPlan struct {
	Source  string                     // the provider, scp or e2e
	Want    map[ImportKey]ImportedNode // the inventory's nodes by (ip, index)
	Skipped []string                   // external ids of hosts skipped this pass
	HW      map[string]int64           // hardware generation pk by GPU model
	// HoldRemovals keeps every node the inventory no longer names as it
	// is (ImportWithheld), as the mass-removal guard decides (RemovalGuard).
	HoldRemovals bool
}

// ImportDecisionKind is what a pass does to one existing node.
type ImportDecisionKind int

const (
	ImportNothing     ImportDecisionKind = iota // another source's node the inventory does not name
	ImportUnchanged                             // holds what the provider says
	ImportUpdateNode                            // provider-owned fields differ
	ImportConflict                              // the pair belongs to another provider
	ImportKeptSkipped                           // vanished from the mapping, but its host was skipped
	ImportKeptBusy                              // vanished, holds a job, already marked gone
	ImportMarkGone                              // vanished, holds a job: mark gone
	ImportRemove                                // vanished and free
	ImportWithheld                              // would be marked gone or removed, but the pass holds removals back
)

// ImportDecision is what a pass does to one node, with what it needs.
type ImportDecision struct {
	Kind     ImportDecisionKind
	Update   ImportUpdate // for ImportUpdateNode
	Conflict string       // for ImportConflict: the line the summary reports
}

// ImportUpdate is the provider-owned fields a pass writes to node PK.
type ImportUpdate struct {
	PK          int64
	CPUMem      int64
	GPUMem      *int64
	HW          *int64
	Schedulable bool
	State       string
	ExternalID  string
	// The topology the node ends with: the provider's fabric when it
	// names one (none, when it does not and no agent owns the node); its
	// GPU model unless an agent that owns the node already
	// reported one (nvidia-smi's name is the more exact); the node's own
	// labels with the provider's reserved ones.
	GPUModel *string
	Fabric   *string
	Labels   Labels
}

// Writes reports whether the decision changes the node.
func (d ImportDecision) Writes() bool {
	return d.Kind == ImportUpdateNode || d.Kind == ImportMarkGone || d.Kind == ImportRemove
}

// Count adds a decision that writes nothing (or a final one) to res;
// writes are counted by the statements that make them.
func (d ImportDecision) Count(res *ImportResult) {
	switch d.Kind {
	case ImportUnchanged:
		res.Unchanged++
	case ImportConflict:
		res.Conflicts = append(res.Conflicts, d.Conflict)
	case ImportKeptSkipped:
		res.KeptSkipped++
	case ImportKeptBusy, ImportMarkGone:
		res.KeptBusy++
	case ImportWithheld:
		res.Withheld++
	}
}

// Decide says what the pass does to existing node n.
func (p ImportPlan) Decide(n Node) ImportDecision {
	k := ImportKey{n.IP, n.Index}
	if in, ok := p.Want[k]; ok {
		if n.Source != p.Source && n.Source != "api" {
			return ImportDecision{Kind: ImportConflict,
				Conflict: fmt.Sprintf("%s index %d is already imported from %s (node %d)", k.IP, k.Index, n.Source, n.PK)}
		}
		u := ImportUpdate{PK: n.PK, CPUMem: in.CPUMem, GPUMem: in.GPUMem, HW: HardwareOf(p.HW, in.GPUModel),
			Schedulable: in.Running, State: in.State, ExternalID: in.ExternalID,
			GPUModel: n.GPUModel, Fabric: n.Fabric, Labels: n.Labels.WithReserved(in.Labels)}
		if in.GPUModel != "" && (n.Owner == nil || n.GPUModel == nil) {
			u.GPUModel = &in.GPUModel
		}
		switch {
		case in.Fabric != "":
			u.Fabric = &in.Fabric
		case n.Owner == nil:
			// A host the provider no longer puts in a fabric is in none:
			// a stale fabric would let a gang span hosts no longer wired
			// together. An owning agent's own word stays.
			u.Fabric = nil
		}
		if u.Same(n, p.Source) {
			return ImportDecision{Kind: ImportUnchanged}
		}
		return ImportDecision{Kind: ImportUpdateNode, Update: u}
	}
	switch {
	case n.Source != p.Source:
		return ImportDecision{Kind: ImportNothing}
	case UnderAny(n.ExternalID, p.Skipped):
		return ImportDecision{Kind: ImportKeptSkipped}
	case n.CurrentJob == nil:
		return p.vanished(ImportRemove)
	case n.ProviderState == nil || *n.ProviderState != ProviderGone || n.Schedulable:
		return p.vanished(ImportMarkGone)
	}
	return ImportDecision{Kind: ImportKeptBusy}
}

// vanished is the decision k for a node the inventory no longer names,
// unless the pass holds removals back.
func (p ImportPlan) vanished(k ImportDecisionKind) ImportDecision {
	if p.HoldRemovals {
		return ImportDecision{Kind: ImportWithheld}
	}
	return ImportDecision{Kind: k}
}

// RemovalGuard is the mass-removal guard of a pass: a pass that would
// take away (remove, or mark gone) more than MaxPercent of a provider's
// nodes takes away none, unless Allow, or unless it is the Passes-th pass
// in a row to find such a removal, none of them larger than the first:
// so one empty or truncated answer cannot wipe a fleet, and a removal that
// grows (a provider failing further) starts the count over. MaxPercent
// 100 turns it off.
type RemovalGuard struct {
	MaxPercent int
	Allow      bool
	Passes     int
	// Held is how many passes in a row before this one held a removal
	// back, and HeldAway how many nodes the first of them would have
	// taken away.
	Held, HeldAway int
}

// Pass is which pass in a row this one is to hold back a removal of n
// nodes: the next after Held when n is no larger than the first's, else
// the first of a new run.
func (g RemovalGuard) Pass(n int) int {
	if g.Held > 0 && n <= g.HeldAway {
		return g.Held + 1
	}
	return 1
}

// Holds reports whether a pass that would take away n of the provider's
// total nodes must hold the removals back.
func (g RemovalGuard) Holds(n, total int) bool {
	over := n > 0 && g.MaxPercent < 100 && int64(n)*100 > int64(g.MaxPercent)*int64(total)
	return over && !g.Allow && g.Pass(n) < g.Passes
}

// After is the guard of the next pass, after this one held back a
// removal of n nodes (0: held nothing).
func (g RemovalGuard) After(n int) RemovalGuard {
	next := RemovalGuard{MaxPercent: g.MaxPercent, Allow: g.Allow, Passes: g.Passes}
	if n > 0 {
		next.Held, next.HeldAway = g.Pass(n), n
		if g.Pass(n) > 1 {
			next.HeldAway = g.HeldAway
		}
	}
	return next
}

type removalGuardKey struct{}

// WithRemovalGuard has an import pass under ctx hold back its removals
// when g says they are too many (the store's ApplyImport reads it).
func WithRemovalGuard(ctx context.Context, g RemovalGuard) context.Context {
	return context.WithValue(ctx, removalGuardKey{}, g)
}

// RemovalGuardOf is the guard WithRemovalGuard put in ctx, if any.
func RemovalGuardOf(ctx context.Context) (RemovalGuard, bool) {
	g, ok := ctx.Value(removalGuardKey{}).(RemovalGuard)
	return g, ok
}

// Same reports whether cur already holds everything the provider says.
func (u ImportUpdate) Same(cur Node, source string) bool {
	return cur.Source == source && cur.CPUMem == u.CPUMem && sameInt64(cur.GPUMem, u.GPUMem) &&
		sameInt64(cur.HardwareGeneration, u.HW) && cur.Schedulable == u.Schedulable &&
		cur.ProviderState != nil && *cur.ProviderState == u.State &&
		cur.ExternalID != nil && *cur.ExternalID == u.ExternalID &&
		samePtr(cur.GPUModel, u.GPUModel) && samePtr(cur.Fabric, u.Fabric) && cur.Labels == u.Labels
}

// UnderAny reports whether id is one of ids or below one ("c" covers "c/w").
func UnderAny(id *string, ids []string) bool {
	if id == nil {
		return false
	}
	for _, k := range ids {
		if k != "" && (*id == k || strings.HasPrefix(*id, k+"/")) {
			return true
		}
	}
	return false
}

// HardwareOf is the hardware generation pk of a GPU model, nil for a
// CPU-only host (no model).
func HardwareOf(hw map[string]int64, model string) *int64 {
	if model == "" {
		return nil
	}
	pk := hw[model]
	return &pk
}

func sameInt64(a, b *int64) bool { return samePtr(a, b) }
