package client

import (
	"bytes"
	"encoding/json"

	"github.com/registryd/registryd/client/internal/oapi"
)

// The API's documents, as openapi.yaml describes them (generated). A
// nullable field is a pointer: nil is null.
type (
	// Node is a worker node as every response carries it.
	Node = oapi.Node
	// NodeCreate is the writable fields of a new node: the first six
	// required (HardwareGeneration and GPUMem may be nil: null), the
	// topology (GPUModel, GPUUUID, Fabric, Labels) optional.
	NodeCreate = oapi.NodeCreate
	// NodeUpdate is a full update (PUT): the six writable fields, and the
	// topology fields, which stay as they are when nil (Labels replaces the
	// node's own labels). The read-only fields are best left nil (they may
	// echo what was read).
	NodeUpdate = oapi.NodeUpdate
	// NodeLabels are a node's labels, key to value.
	NodeLabels = oapi.NodeLabels
	// FabricListFilter selects the nodes ListFabrics counts.
	FabricListFilter = oapi.FabricListFilter
	// FabricCapacity is what one fabric holds of the nodes selected.
	FabricCapacity = oapi.FabricCapacity
	// NodeFilter selects nodes for ListNodes; nil members do not filter.
	NodeFilter = oapi.NodeFilter
	// NodeClaim asks for Count free nodes for Job.
	NodeClaim = oapi.NodeClaim
	// ClaimResult is what a claim took.
	ClaimResult = oapi.ClaimResult
	// NodeRelease gives a job's nodes back (all of them when Nodes is nil).
	NodeRelease = oapi.NodeRelease
	// ReleaseResult is what a release gave back, and what it could not.
	ReleaseResult = oapi.ReleaseResult
	// NotReleased is a node a release named that the job does not hold.
	NotReleased = oapi.NotReleased
	// NodeRenew renews every lease of Job for LeaseSeconds from now.
	NodeRenew = oapi.NodeRenew
	// RenewResult is every node the job holds after a renewal.
	RenewResult = oapi.RenewResult
	// NodeCordon cordons Nodes, or the nodes the filters match, for Reason.
	NodeCordon = oapi.NodeCordon
	// CordonResult is what a cordon did.
	CordonResult = oapi.CordonResult
	// NodeUncordon uncordons Nodes.
	NodeUncordon = oapi.NodeUncordon
	// UncordonResult is what an uncordon did.
	UncordonResult = oapi.UncordonResult
	// NotDone is a node a cordon or uncordon named but did not act on.
	NotDone = oapi.NotDone
	// NodeStateFilter is the state filter of list and cordon: see States.
	NodeStateFilter = oapi.NodeStateFilter
	// NodeEvent is the data of a node event on the watch stream.
	NodeEvent = oapi.NodeEvent
	// NodeEventKind says what happened to the node of a NodeEvent.
	NodeEventKind = oapi.NodeEventKind
	// LeaseRenewal is the data of a renewed event: one renewal of a job's
	// leases, with the new lease_expires_at and each node's new version.
	LeaseRenewal = oapi.LeaseRenewal
	// NodeVersion is a node's pk and its version after a change.
	NodeVersion = oapi.NodeVersion
	// WatchReset is the data of a reset event: re-list the nodes.
	WatchReset = oapi.WatchReset
	// WatchBookmark is the data of a bookmark event: where the stream stands.
	WatchBookmark = oapi.WatchBookmark
	// Source is where a node came from.
	Source = oapi.Source
	// NodeState is a node's lifecycle state.
	NodeState = oapi.NodeState

	// Hardware is a hardware generation.
	Hardware = oapi.Hardware
	// HardwareCreate names a new hardware generation.
	HardwareCreate = oapi.HardwareCreate
	// HardwareUpdate renames a hardware generation (PUT).
	HardwareUpdate = oapi.HardwareUpdate
	// HardwarePatch is a merge patch of a hardware generation.
	HardwarePatch = oapi.HardwarePatch
	// HardwareFilter selects hardware generations by name.
	HardwareFilter = oapi.HardwareFilter

	// AuditFilter selects audit log entries.
	AuditFilter = oapi.AuditFilter
	// AuditTargetType is the kind of row an audit entry is about.
	AuditTargetType = oapi.AuditFilterTargetType
	// AuditAction is what an audit entry records was done (AuditFilter.Action).
	AuditAction = oapi.AuditFilterAction
	// AuditRole is the role an audit entry was written with (AuditFilter.Role).
	AuditRole = oapi.AuditFilterRole
	// AuditEntry is one write, as the audit log recorded it.
	AuditEntry = oapi.AuditEntry
	// RevokeRequest names what to revoke: Sub or JTI.
	RevokeRequest = oapi.RevokeRequest
	// Revocation is a stored revocation.
	Revocation = oapi.Revocation
	// RenewedToken is an agent token's renewal (RenewToken).
	RenewedToken = oapi.RenewedToken

	// Ping is the answer of Ping: the server's time.
	Ping = oapi.Ping
	// Health is the answer of Healthz.
	Health = oapi.Health
	// Ready is the answer of Readyz.
	Ready = oapi.Ready
	// FieldError names a bad field of a refused request.
	FieldError = oapi.FieldError
)

// Values of the API's enumerations.
const (
	SourceAPI = oapi.SourceAPI
	SourceSCP = oapi.SourceScp
	SourceE2E = oapi.SourceE2E

	StateGone     = oapi.NodeStateGone
	StateLost     = oapi.NodeStateLost
	StateDraining = oapi.NodeStateDraining
	StateCordoned = oapi.NodeStateCordoned
	StateBusy     = oapi.NodeStateBusy
	StateFree     = oapi.NodeStateFree

	EventCreated    = oapi.NodeEventKindCreated
	EventUpdated    = oapi.NodeEventKindUpdated
	EventDeleted    = oapi.NodeEventKindDeleted
	EventClaimed    = oapi.NodeEventKindClaimed
	EventReleased   = oapi.NodeEventKindReleased
	EventLost       = oapi.NodeEventKindLost
	EventFound      = oapi.NodeEventKindFound
	EventCordoned   = oapi.NodeEventKindCordoned
	EventUncordoned = oapi.NodeEventKindUncordoned
	EventExpired    = oapi.NodeEventKindExpired

	AuditNode     = oapi.AuditFilterTargetTypeNode
	AuditHardware = oapi.AuditFilterTargetTypeHardware
	AuditToken    = oapi.AuditFilterTargetTypeToken

	ActionNodeCreate     = oapi.AuditFilterActionNodeCreate
	ActionNodeAdopt      = oapi.AuditFilterActionNodeAdopt
	ActionNodeUpdate     = oapi.AuditFilterActionNodeUpdate
	ActionNodeDelete     = oapi.AuditFilterActionNodeDelete
	ActionNodeClaim      = oapi.AuditFilterActionNodeClaim
	ActionNodeRelease    = oapi.AuditFilterActionNodeRelease
	ActionNodeCordon     = oapi.AuditFilterActionNodeCordon
	ActionNodeUncordon   = oapi.AuditFilterActionNodeUncordon
	ActionNodeRenew      = oapi.AuditFilterActionNodeRenew
	ActionNodeLost       = oapi.AuditFilterActionNodeLost
	ActionNodeFound      = oapi.AuditFilterActionNodeFound
	ActionNodeExpire     = oapi.AuditFilterActionNodeExpire
	ActionHardwareCreate = oapi.AuditFilterActionHardwareCreate
	ActionHardwareUpdate = oapi.AuditFilterActionHardwareUpdate
	ActionHardwareDelete = oapi.AuditFilterActionHardwareDelete
	ActionTokenRevoke    = oapi.AuditFilterActionTokenRevoke

	RoleAdmin     = oapi.AuditFilterRoleAdmin
	RoleScheduler = oapi.AuditFilterRoleScheduler
	RoleAgent     = oapi.AuditFilterRoleAgent
	RoleReader    = oapi.AuditFilterRoleReader
	RoleSystem    = oapi.AuditFilterRoleSystem
)

// States is the state filter of NodeFilter and NodeCordon selecting
// nodes in any of states: client.NodeFilter{State: client.States(client.StateCordoned, client.StateDraining)}.
func States(states ...NodeState) *NodeStateFilter {
	var f NodeStateFilter
	_ = f.FromNodeStateFilter1(states) // a slice of strings always encodes
	return &f
}

// Ptr returns a pointer to v, for the optional members of filters and
// requests: client.NodeFilter{Free: client.Ptr(true)}.
func Ptr[T any](v T) *T { return &v }

// NodePatch is a JSON merge patch of a node (PATCH): nil members stay as
// they are. HardwareGeneration, GPUMem, GPUModel, GPUUUID and Fabric may
// also be cleared (Null). Labels merge: each sets its label, and a nil
// value removes one; other labels stay.
type NodePatch struct {
	IP                 *string
	Index              *int32
	CPUMem             *int64
	DriverVersion      *string
	HardwareGeneration Nullable[int64]
	GPUMem             Nullable[int64]
	GPUModel           Nullable[string]
	GPUUUID            Nullable[string]
	Fabric             Nullable[string]
	Labels             map[string]*string
}

// Nullable is a member of a merge patch that may be set to null: the zero
// value leaves it out, Null clears it, Value sets it.
type Nullable[T any] struct {
	set, null bool
	v         T
}

// Null is a Nullable that clears the member.
func Null[T any]() Nullable[T] { return Nullable[T]{set: true, null: true} }

// Value is a Nullable that sets the member to v.
func Value[T any](v T) Nullable[T] { return Nullable[T]{set: true, v: v} }

// MarshalJSON writes the patch with only the members it changes.
func (p NodePatch) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	put := func(name string, set bool, v any) {
		if set {
			m[name] = v
		}
	}
	put("ip", p.IP != nil, p.IP)
	put("index", p.Index != nil, p.Index)
	put("cpu_mem", p.CPUMem != nil, p.CPUMem)
	put("driver_version", p.DriverVersion != nil, p.DriverVersion)
	put("hardware_generation", p.HardwareGeneration.set, p.HardwareGeneration.json())
	put("gpu_mem", p.GPUMem.set, p.GPUMem.json())
	put("gpu_model", p.GPUModel.set, p.GPUModel.json())
	put("gpu_uuid", p.GPUUUID.set, p.GPUUUID.json())
	put("fabric", p.Fabric.set, p.Fabric.json())
	put("labels", p.Labels != nil, p.Labels)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func (n Nullable[T]) json() any {
	if n.null {
		return nil
	}
	return n.v
}
