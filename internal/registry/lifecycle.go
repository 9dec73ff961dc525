package registry

import (
	"strconv"
	"time"
)

// The node lifecycle's decisions (docs/scheduling.md, "Node states"). The lifecycle
// sweeper asks the store for candidates, decides here which of them change,
// and has the store apply exactly those decisions. The store's candidate
// queries may select more than these functions accept, never fewer.

// MinNodeTTL is the shortest node TTL (REGISTRY_NODE_TTL) allowed: agents
// heartbeat every few seconds, and a TTL shorter than a couple of those
// would make healthy nodes flap between lost and found.
const MinNodeTTL = 5 * time.Second

// DefaultNodeTTL is the node TTL when none is configured.
const DefaultNodeTTL = 60 * time.Second

// Watched reports whether the registry expects to hear from the node, so
// that silence means it is lost: an agent owns it, or it has heartbeated at
// least once. Imported nodes with no agent that were never seen are not
// watched; nothing would ever report them alive.
func (n Node) Watched() bool { return n.Owner != nil || n.LastSeen != nil }

// lastHeard is when the node was last heard of: its last heartbeat, or for
// an agent's node that never heartbeated, its last write (the agent
// registering or adopting it).
func (n Node) lastHeard() time.Time {
	if n.LastSeen != nil {
		return *n.LastSeen
	}
	return n.UpdatedAt
}

// Silent reports whether a watched node has not been heard of for longer
// than ttl as of now.
func (n Node) Silent(now time.Time, ttl time.Duration) bool {
	return n.Watched() && n.lastHeard().Before(now.Add(-ttl))
}

// BecomesLost reports whether the sweeper marks n lost: it is watched,
// silent for longer than ttl, and not lost already. A gone node is marked
// too: by precedence it still shows as gone, and should its provider report
// it running again while its agent stays silent, it is lost at once rather
// than free (and claimable) until the next sweep.
func (n Node) BecomesLost(now time.Time, ttl time.Duration) bool {
	return !n.Lost && n.Silent(now, ttl)
}

// BecomesFound reports whether the sweeper clears n's lost mark: it is lost
// and has heartbeated within ttl. Only a heartbeat finds a node; a node that
// was never seen stays lost until its agent is heard.
func (n Node) BecomesFound(now time.Time, ttl time.Duration) bool {
	return n.Lost && n.LastSeen != nil && !n.LastSeen.Before(now.Add(-ttl))
}

// LeaseExpired reports whether n's claim was made with a lease that has run
// out as of now (lease_expires_at <= now). Claims without a lease never
// expire.
func (n Node) LeaseExpired(now time.Time) bool {
	return n.CurrentJob != nil && n.LeaseExpiresAt != nil && !now.Before(*n.LeaseExpiresAt)
}

// Released is n as a release (by its job, or by the registry when its lease
// expired) leaves it: no job, no lease. Whatever else it was stays, so a
// draining node becomes cordoned, never free.
func (n Node) Released() Node {
	n.CurrentJob, n.LeaseExpiresAt = nil, nil
	n.State = n.DeriveState()
	return n
}

// Sweep is what one pass of the sweeper decides: the pks of the nodes to
// mark lost, to mark found, and whose leases to end.
type Sweep struct {
	Lost, Found, Expired []int64
}

// Empty reports whether the sweep changes nothing.
func (s Sweep) Empty() bool { return len(s.Lost)+len(s.Found)+len(s.Expired) == 0 }

// DecideSweep applies the lifecycle's rules to candidate nodes as of now:
// each is checked for every transition, in the order given, and a node may
// both become lost and have its lease expire in the same pass.
func DecideSweep(candidates []Node, now time.Time, ttl time.Duration) Sweep {
	var s Sweep
	for _, n := range candidates {
		if n.BecomesLost(now, ttl) {
			s.Lost = append(s.Lost, n.PK)
		}
		if n.BecomesFound(now, ttl) {
			s.Found = append(s.Found, n.PK)
		}
		if n.LeaseExpired(now) {
			s.Expired = append(s.Expired, n.PK)
		}
	}
	return s
}

// LeaseExpiredReason is what a release reports for a node whose lease for
// job ran out and which the registry released by itself.
func LeaseExpiredReason(job int64) string {
	return "the lease of job " + strconv.FormatInt(job, 10) + " expired; the registry released the node"
}

// The principals the sweeper writes the audit log as (role system): lost
// and found marks as the lifecycle, expiries as the lease.
const (
	LifecyclePrincipal = "system:lifecycle"
	LeasePrincipal     = "system:lease"
)
