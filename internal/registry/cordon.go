package registry

import "strings"

// MaxCordon is the most nodes one cordon or uncordon acts on: the nodes it
// lists, or the nodes its filter matches. A filter that matches more is
// refused whole (nothing is cordoned): narrow it, or cordon by pks in
// batches.
const MaxCordon = MaxClaim

// MaxCordonReasonLen bounds a cordon's reason, in characters.
const MaxCordonReasonLen = 200

// Cordon takes nodes out of scheduling for Reason: the listed Nodes, or
// (Nodes nil) every node Filter matches. Exactly one of the two is given,
// and a filter names at least one criterion, so that a cordon never takes
// the whole fleet by omission.
type Cordon struct {
	Nodes  []int64
	Filter *NodeFilter
	Reason string
}

// Normalize validates the cordon. Field names are the wire's: the filter's
// members, nodes and reason.
func (c *Cordon) Normalize() error {
	var fe FieldErrors
	switch {
	case c.Reason == "":
		fe.Add("reason", "must not be empty: say why the nodes are cordoned")
	case strings.TrimSpace(c.Reason) != c.Reason:
		fe.Add("reason", "must not start or end with whitespace")
	default:
		if msg := checkText(c.Reason, MaxCordonReasonLen); msg != "" {
			fe.Add("reason", "%s", msg)
		}
	}
	switch {
	case c.Nodes != nil && c.Filter != nil:
		fe.Add("nodes", "give either nodes or list filters, not both")
	case c.Nodes == nil && (c.Filter == nil || c.Filter.empty()):
		fe.Add("nodes", "is required, or at least one list filter (a cordon never selects every node by omission)")
	case c.Nodes != nil:
		checkPKs(&fe, c.Nodes)
	default:
		if c.Filter.After != 0 {
			fe.Add("after", "is a list option; a cordon takes every node its filters match (at most %d)", MaxCordon)
		}
		if c.Filter.Limit != 0 {
			fe.Add("limit", "is a list option; a cordon takes every node its filters match (at most %d)", MaxCordon)
		}
		for _, e := range FieldsOf(c.Filter.Normalize()) {
			if !fe.Has(e.Field) {
				fe = append(fe, e)
			}
		}
	}
	return fe.Err()
}

// Uncordon puts the listed nodes back into scheduling.
type Uncordon struct {
	Nodes []int64
}

// Normalize validates the uncordon.
func (u *Uncordon) Normalize() error {
	var fe FieldErrors
	if u.Nodes == nil {
		fe.Add("nodes", "is required")
	} else {
		checkPKs(&fe, u.Nodes)
	}
	return fe.Err()
}

// checkPKs holds a list of nodes to between 1 and MaxCordon positive pks.
func checkPKs(fe *FieldErrors, pks []int64) {
	if len(pks) == 0 || len(pks) > MaxCordon {
		fe.Add("nodes", "must list between 1 and %d node pks", MaxCordon)
		return
	}
	for _, pk := range pks {
		if pk <= 0 {
			fe.Add("nodes", "must hold positive node pks")
			return
		}
	}
}

// empty reports whether f names no criterion (paging aside).
func (f *NodeFilter) empty() bool {
	return f.Free == nil && f.CurrentJob == nil && f.HardwareGeneration == nil && f.MinGPUMem == nil &&
		f.MinCPUMem == nil && f.IP == nil && f.Index == nil && f.SeenWithin == nil && f.Source == nil &&
		f.PK == nil && len(f.State) == 0 && f.Fabric == nil && f.Owner == nil && len(f.Selector) == 0
}

// Cordoned is n cordoned for reason, and whether that changes it. A job
// that holds n keeps it, lease and all: the node drains (StateDraining)
// and is cordoned, never free, once the job releases it. A node already
// cordoned for the same reason is left as it is; for another reason it
// takes the new one.
func (n Node) Cordoned(reason string) (Node, bool) {
	if n.CordonReason != nil && *n.CordonReason == reason {
		return n, false
	}
	n.CordonReason = &reason
	n.State = n.DeriveState()
	return n, true
}

// Uncordoned is n with no cordon, and false when it was not cordoned. A
// job that holds n keeps it (a draining node is busy again).
func (n Node) Uncordoned() (Node, bool) {
	if n.CordonReason == nil {
		return n, false
	}
	n.CordonReason = nil
	n.State = n.DeriveState()
	return n, true
}

// NotDone is a node a cordon or an uncordon named but did not act on, and
// why (as NotReleased is for a release).
type NotDone struct {
	PK     int64
	Reason string
}
