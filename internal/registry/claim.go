package registry

import (
	"slices"
	"time"
)

// MaxClaim is the most nodes one claim may take.
const MaxClaim = 1000

// Claim asks for Count free, schedulable nodes matching Filter for Job,
// all on one host when SameHost is set. It is all or nothing.
type Claim struct {
	Job      int64
	Count    int
	SameHost bool
	// PerHost, when not 0, takes the nodes in whole groups of PerHost
	// from Count/PerHost hosts, and SameFabric keeps those hosts in one
	// fabric. Placement is best fit: the fabric with the fewest hosts
	// that could hold such a group, and in it (or anywhere, without
	// SameFabric) the hosts with the fewest free matching nodes first.
	PerHost    int
	SameFabric bool
	// Nodes, when not nil, names the nodes to take, every one or none;
	// Count is their number and the placement options do not apply.
	Nodes  []int64
	Filter NodeFilter
	// Lease, when set, ends the claim on each node by itself that long
	// after it is made (see MaxLease); nil holds the nodes until released.
	Lease *time.Duration
}

// Normalize validates the claim. Claims always take free nodes, so the
// filter may not ask for busy ones, and Count replaces paging.
func (c *Claim) Normalize() error {
	var fe FieldErrors
	if c.Job <= 0 {
		fe.Add("job", "must be a positive integer (the job's pk)")
	}
	if c.Nodes == nil && (c.Count < 1 || c.Count > MaxClaim) {
		fe.Add("count", "must be between 1 and %d", MaxClaim)
	}
	switch {
	case c.Nodes != nil:
		c.normalizeNodes(&fe)
	case c.PerHost < 0 || c.PerHost > MaxClaim:
		fe.Add("per_host", "must be between 1 and %d", MaxClaim)
	case c.PerHost > 0 && c.SameHost:
		fe.Add("per_host", "takes nodes from several hosts; same_host takes them from one: give one of them (same_host is per_host equal to count)")
	case c.SameFabric && c.SameHost:
		fe.Add("same_fabric", "is implied by same_host (a host's nodes share its fabric); leave it out")
	case c.SameFabric && c.PerHost == 0:
		fe.Add("per_host", "is needed with same_fabric: how many nodes each host of the fabric gives (per_host 1 takes count nodes from count hosts)")
	case c.PerHost > 0 && !fe.Has("count") && c.Count%c.PerHost != 0:
		fe.Add("count", "must be a multiple of per_host (%d): whole groups of per_host nodes, one per host", c.PerHost)
	}
	if c.Filter.Free != nil && !*c.Filter.Free {
		fe.Add("free", "claims take free nodes only; leave it out or set it to true")
	}
	if c.Filter.CurrentJob != nil {
		fe.Add("current_job", "claims take free nodes only; it cannot be a claim filter")
	}
	if c.Filter.Limit != 0 {
		fe.Add("limit", "is a list option; a claim takes count nodes")
	}
	if c.Lease != nil {
		checkLease(&fe, *c.Lease)
	}
	for _, e := range FieldsOf(c.Filter.Normalize()) {
		if !fe.Has(e.Field) { // current_job and limit may already be refused above
			fe = append(fe, e)
		}
	}
	if len(c.Filter.State) > 0 && !fe.Has("state") && !slices.Contains(c.Filter.State, StateFree) {
		fe.Add("state", "claims take free nodes only; leave it out or make it free")
	}
	return fe.Err()
}

// normalizeNodes checks a claim of named nodes: 1 to MaxClaim distinct
// pks, Count their number (0 is taken for it), no placement options.
func (c *Claim) normalizeNodes(fe *FieldErrors) {
	if len(c.Nodes) == 0 || len(c.Nodes) > MaxClaim {
		fe.Add("nodes", "must list between 1 and %d node pks", MaxClaim)
		return
	}
	seen := make(map[int64]bool, len(c.Nodes))
	for _, pk := range c.Nodes {
		switch {
		case pk <= 0:
			fe.Add("nodes", "must hold positive node pks")
			return
		case seen[pk]:
			fe.Add("nodes", "names node %d more than once", pk)
			return
		}
		seen[pk] = true
	}
	if c.Count == 0 {
		c.Count = len(c.Nodes)
	}
	if c.Count != len(c.Nodes) {
		fe.Add("count", "is the number of nodes named (%d) when nodes is given; leave it out", len(c.Nodes))
	}
	for _, o := range []struct {
		field string
		set   bool
	}{{"same_host", c.SameHost}, {"per_host", c.PerHost != 0}, {"same_fabric", c.SameFabric}} {
		if o.set {
			fe.Add(o.field, "places the nodes a claim chooses; a claim of named nodes (nodes) takes exactly those")
		}
	}
}

// Hosts is how many hosts a claim of whole groups (PerHost) takes.
func (c Claim) Hosts() int {
	if c.PerHost == 0 {
		return 0
	}
	return c.Count / c.PerHost
}

// Release gives back nodes a job holds: the listed ones, or all of them
// when Nodes is nil.
type Release struct {
	Job   int64
	Nodes []int64
}

// Normalize validates the release.
func (r *Release) Normalize() error {
	var fe FieldErrors
	if r.Job <= 0 {
		fe.Add("job", "must be a positive integer (the job's pk)")
	}
	if r.Nodes != nil && (len(r.Nodes) == 0 || len(r.Nodes) > MaxClaim) {
		fe.Add("nodes", "must list between 1 and %d node pks, or be left out to release every node of the job", MaxClaim)
	}
	for _, pk := range r.Nodes {
		if pk <= 0 {
			fe.Add("nodes", "must hold positive node pks")
			break
		}
	}
	return fe.Err()
}

// NotReleased is a node a release named but could not give back, and why.
type NotReleased struct {
	PK     int64
	Reason string
}

// Feed is where the change feed stands (docs/design.md, "A feed that
// never goes backwards").
type Feed struct {
	// Epoch is the id the feed's current epoch starts after: every id
	// handed out since the epoch began is above it. A position below it
	// belongs to an earlier epoch (before a failover, a restore or a reset
	// of the sequence), which the registry cannot vouch for.
	Epoch int64
	// Latest is the newest event id; never below Epoch or Pruned.
	Latest int64
	// Pruned is the highest id retention removed: resuming below it misses
	// events.
	Pruned int64
	// NewEpoch, from a sequencing pass, is why that pass began the epoch;
	// "" when it did not.
	NewEpoch string
}

// NewEpochReason begins the reason a watcher's reset or a follower's gap
// gives when the change feed began a new epoch: what was applied before
// may be lost, so nothing learned from it (deletions included) holds.
const NewEpochReason = "the change feed began a new epoch"

// HubStoppedReason is the gap a watch hub reports when it stops (its
// replica shutting down): expected, not a fault.
const HubStoppedReason = "the watch hub stopped"

// NodeEvent is one change of a node as watchers see it, or, for
// EventRenewed, of every node of one job whose lease a renewal moved.
type NodeEvent struct {
	ID   int64     // increases with every event, across replicas
	Kind string    // created, updated, deleted, claimed, released, ...
	At   time.Time // when the change was made
	// Node is the node after the change; for deleted, as it was; for
	// renewed, Nodes[0].
	Node Node
	// Nodes, for renewed only, is every node the renewal moved, after
	// it, by pk: they hold one job, their lease_expires_at and updated_at
	// are the same, and nothing else of them changed but the version.
	Nodes []Node
}

// EventRenewed is the kind of the one event a renewal of a job's leases
// makes (rather than one updated event per node).
const EventRenewed = "renewed"

// Position is where in the change feed a read stands: every event with an
// id up to ID is in it; with Exact, no change after ID is either, so a
// watch from ID repeats nothing the read showed.
type Position struct {
	ID    int64
	Exact bool
}
