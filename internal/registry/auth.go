package registry

import (
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Role is what a principal may do. Tokens carry it in the "role" claim.
type Role string

// The roles, from most to least trusted.
const (
	RoleAdmin     Role = "admin"     // everything, including acting as any node
	RoleScheduler Role = "scheduler" // reads, claims and releases
	RoleAgent     Role = "agent"     // reads, registers nodes and acts as its own
	RoleReader    Role = "reader"    // reads
)

// RoleSystem marks writes the registry makes on its own (the sync worker)
// in the audit log. No token can carry it.
const RoleSystem Role = "system"

// Roles lists every role a token may carry.
var Roles = []Role{RoleAdmin, RoleScheduler, RoleAgent, RoleReader}

// ParseRole returns the role named s, or false if s names none.
func ParseRole(s string) (Role, bool) {
	for _, r := range Roles {
		if string(r) == s {
			return r, true
		}
	}
	return "", false
}

// Permission is a kind of request, as the permission matrix names it.
type Permission int

// The permissions of the matrix in docs/security.md.
const (
	PermRead          Permission = iota // ping, list, retrieve nodes and hardware
	PermCreateNode                      // register a node
	PermWriteNode                       // update, patch, destroy a node (agents: only their own, acting as it)
	PermClaim                           // claim and release nodes for jobs
	PermWriteHardware                   // create, update, destroy hardware generations
	PermReadAudit                       // read the audit log
	PermRevokeTokens                    // revoke tokens before they expire
	PermCordon                          // cordon and uncordon nodes (take them out of scheduling)
)

var matrix = map[Role][]Permission{
	RoleAdmin:     {PermRead, PermCreateNode, PermWriteNode, PermClaim, PermWriteHardware, PermReadAudit, PermRevokeTokens, PermCordon},
	RoleScheduler: {PermRead, PermClaim},
	RoleAgent:     {PermRead, PermCreateNode, PermWriteNode},
	RoleReader:    {PermRead},
}

// Allows reports whether the role grants p at all. For PermWriteNode an
// agent is further limited to its own node; see Principal.MayActAs.
func (r Role) Allows(p Permission) bool {
	for _, q := range matrix[r] {
		if q == p {
			return true
		}
	}
	return false
}

// Principal is an authenticated caller: a token's subject and role.
type Principal struct {
	Sub  string
	Role Role
	// IPs, when not nil, binds an agent to its hosts: the addresses it may
	// register, adopt or move a node to (the token's "ips" claim). See
	// MayUseIP.
	IPs []netip.Prefix
	// Token is what the request's token says of itself; zero for
	// principals that came from no token.
	Token TokenInfo
}

// RenewedToken is a token's renewal (POST /v1/tokens/renew).
type RenewedToken struct {
	Token   string
	ID      string // its "jti"
	Lineage string // the "jti" of the token minted by hand it renews
	Expires time.Time
}

// TokenInfo describes the token a principal came from.
type TokenInfo struct {
	// ID is the token's "jti" ("" without one).
	ID string
	// Lineage names the token minted by hand and every renewal of it
	// (its "jti" then theirs "lid"); "" when the token has no "jti".
	Lineage string
	// Issued is its "iat" (zero without one); Expires its "exp".
	Issued, Expires time.Time
}

// MayActAs reports whether p may act on behalf of node n (the Node-Id
// header): the agent that registered it, or any admin. An agent bound to
// its hosts (IPs set) acts only as nodes at its addresses, so that when
// many hosts' agents share one subject, a leaked token cannot change or
// delete the nodes of the others.
func (p Principal) MayActAs(n Node) bool {
	switch p.Role {
	case RoleAdmin:
		return true
	case RoleAgent:
		return n.Owner != nil && *n.Owner == p.Sub && p.MayUseIP(n.IP)
	}
	return false
}

// Actor is who performs a write, as the audit log records it.
type Actor struct {
	Principal
	// ActingNode is the node named by Node-Id, if any.
	ActingNode *int64
	// RequestID is the server's own id of the request that writes.
	RequestID string
	// ClientRequestID is the X-Request-Id the client sent, when it was
	// sane; kept apart from RequestID because the client chooses it.
	ClientRequestID string
}

// AuditEntry is one row of the append-only audit log.
type AuditEntry struct {
	ID         int64
	At         time.Time
	Principal  string
	Role       string
	ActingNode *int64
	Action     string // e.g. node.create, hardware.delete
	TargetType string // node, hardware or token
	TargetPK   *int64
	Before     []byte // JSON document before the change; nil for creates
	After      []byte // JSON document after the change; nil for deletes
	RequestID  string // the server's id of the request; "" for the sync worker
	// ClientRequestID is the X-Request-Id the client sent; "" for none.
	ClientRequestID string
}

// AuditFilter selects audit entries, oldest first, after the id After.
type AuditFilter struct {
	TargetType *string
	TargetPK   *int64
	Principal  *string
	Action     *string // one of AuditActions
	Role       *string // one of AuditRoles: the writer's role when it wrote
	Since      *time.Time
	After      int64
	Limit      int // 1..MaxListLimit; 0 means MaxListLimit
}

// AuditTargetTypes are the kinds of rows the audit log records writes of.
var AuditTargetTypes = []string{"node", "hardware", "token", "provider"}

// The actions the audit log records; the store writes only these.
const (
	ActionNodeCreate     = "node.create"
	ActionNodeAdopt      = "node.adopt"
	ActionNodeUpdate     = "node.update"
	ActionNodeDelete     = "node.delete"
	ActionNodeClaim      = "node.claim"
	ActionNodeRelease    = "node.release"
	ActionNodeCordon     = "node.cordon"
	ActionNodeUncordon   = "node.uncordon"
	ActionNodeRenew      = "node.renew"
	ActionNodeLost       = "node.lost"   // the sweeper marked the node lost
	ActionNodeFound      = "node.found"  // the sweeper cleared the lost mark
	ActionNodeExpire     = "node.expire" // the registry released a claim whose lease ran out
	ActionHardwareCreate = "hardware.create"
	ActionHardwareUpdate = "hardware.update"
	ActionHardwareDelete = "hardware.delete"
	ActionTokenRevoke    = "token.revoke"
	// ActionSyncRemovalsHeld is a sync pass holding back the removal of
	// more of a provider's nodes than the mass-removal guard allows.
	ActionSyncRemovalsHeld = "sync.removals_held"
)

// AuditActions lists every action an audit entry can record.
var AuditActions = []string{
	ActionNodeCreate, ActionNodeAdopt, ActionNodeUpdate, ActionNodeDelete, ActionNodeClaim, ActionNodeRelease,
	ActionNodeCordon, ActionNodeUncordon, ActionNodeRenew,
	ActionNodeLost, ActionNodeFound, ActionNodeExpire,
	ActionHardwareCreate, ActionHardwareUpdate, ActionHardwareDelete, ActionTokenRevoke,
	ActionSyncRemovalsHeld,
}

// AuditRoles lists every role an audit entry can carry: a token's role, or
// RoleSystem for the sync worker and the command line.
var AuditRoles = []string{string(RoleAdmin), string(RoleScheduler), string(RoleAgent), string(RoleReader), string(RoleSystem)}

// Normalize validates the filter.
func (f *AuditFilter) Normalize() error {
	var fe FieldErrors
	if f.TargetType != nil && !slices.Contains(AuditTargetTypes, *f.TargetType) {
		fe.Add("target_type", "must be one of %s", strings.Join(AuditTargetTypes, ", "))
	}
	if f.TargetPK != nil && *f.TargetPK <= 0 {
		fe.Add("target_pk", "must be a positive integer (the pk of a node, a hardware generation or a token revocation)")
	}
	if f.Principal != nil {
		if msg := CheckLabel(*f.Principal, MaxPrincipalLen); msg != "" {
			fe.Add("principal", "%s", msg)
		}
	}
	if f.Action != nil && !slices.Contains(AuditActions, *f.Action) {
		fe.Add("action", "must be one of %s", strings.Join(AuditActions, ", "))
	}
	if f.Role != nil && !slices.Contains(AuditRoles, *f.Role) {
		fe.Add("role", "must be one of %s", strings.Join(AuditRoles, ", "))
	}
	if f.After < 0 {
		fe.Add("after", "must not be negative")
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		fe.Add("limit", "must be between 1 and %d", MaxListLimit)
	}
	return fe.Err()
}
