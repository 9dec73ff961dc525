package registry

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on field values. They are generous for real fleets and small enough
// that nothing downstream (indexes, logs, UIs) has to cope with absurd input.
const (
	MaxIndex           = math.MaxInt32
	MaxDriverVersion   = 128
	MaxHardwareNameLen = 100
)

// Node is one schedulable unit of the fleet: a GPU of a host, or a CPU-only
// host. Field meanings follow the Nodes API.
//
// Its JSON encoding is the node's one document: API responses, the watch
// stream, the audit log and the change log all carry it, so a new field is one edit here (and one column in the
// store, one property in openapi.yaml; a test holds the three together).
// Times are in UTC as the store hands nodes out (see UTC).
type Node struct {
	PK                 int64  `json:"pk"`
	IP                 string `json:"ip"` // canonical text form
	Index              int    `json:"index"`
	CPUMem             int64  `json:"cpu_mem"`
	DriverVersion      string `json:"driver_version"`
	HardwareGeneration *int64 `json:"hardware_generation"`
	GPUMem             *int64 `json:"gpu_mem"`
	// GPUModel is the GPU's product name (NVIDIA H100 80GB HBM3), as the
	// agent or the import reports it; nil for CPU-only hosts or unknown.
	GPUModel *string `json:"gpu_model"`
	// GPUUUID is the GPU's own id as its driver reports it (GPU-…); nil
	// when unknown.
	GPUUUID *string `json:"gpu_uuid"`
	// Fabric is the interconnect domain (RDMA, InfiniBand) the host is
	// wired into: nodes of one fabric can run one multi-host job. Nodes of
	// one host share it. nil when unknown.
	Fabric *string `json:"fabric"`
	// Labels are the node's labels; keys under ReservedDomain belong to
	// its provider's import.
	Labels     Labels     `json:"labels"`
	LastSeen   *time.Time `json:"last_seen"`   // server-managed
	CurrentJob *int64     `json:"current_job"` // server-managed
	// LeaseExpiresAt is when the claim on the node ends by itself, for a
	// claim made with a lease; nil otherwise. Server-managed.
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	// Owner is the principal of the agent that registered the node; nil for
	// nodes an admin created. Server-managed.
	Owner *string `json:"owner"`
	// Source is where the node came from: api, scp or e2e. Server-managed.
	Source string `json:"source"`
	// Schedulable is false while the node's provider reports it stopped
	// or gone; such nodes are never claimed. Server-managed.
	Schedulable bool `json:"schedulable"`
	// State is the node's lifecycle state, derived from the fields (and
	// Lost) by DeriveState. Server-managed.
	State State `json:"state"`
	// CordonReason is why an admin cordoned the node; nil while it is not
	// cordoned. Server-managed (cordon, uncordon).
	CordonReason *string `json:"cordon_reason"`
	// Lost is set by the lifecycle sweeper while a node that has an agent
	// or has heartbeated has not been seen for the node TTL. The document
	// shows it as State.
	Lost bool `json:"-"`
	// ExternalID and ProviderState are what the sync worker knows of an
	// imported node's host; nil for nodes registered through the API.
	ExternalID    *string   `json:"external_id"`
	ProviderState *string   `json:"provider_state"`
	CreatedAt     time.Time `json:"created_at"` // server-managed
	UpdatedAt     time.Time `json:"updated_at"` // server-managed
	// Version changes on every write except heartbeats; it backs ETags
	// (the number an ETag carries) and is the document's last member.
	// Server-managed: a write may echo it, and it must then be current.
	Version int64 `json:"version"`
}

// UTC returns the node with every time in UTC, as documents show them.
func (n Node) UTC() Node {
	if n.LastSeen != nil {
		t := n.LastSeen.UTC()
		n.LastSeen = &t
	}
	if n.LeaseExpiresAt != nil {
		t := n.LeaseExpiresAt.UTC()
		n.LeaseExpiresAt = &t
	}
	n.CreatedAt = n.CreatedAt.UTC()
	n.UpdatedAt = n.UpdatedAt.UTC()
	return n
}

// Spec returns the node's writable fields.
func (n Node) Spec() NodeSpec {
	return NodeSpec{
		IP:                 n.IP,
		Index:              n.Index,
		CPUMem:             n.CPUMem,
		DriverVersion:      n.DriverVersion,
		HardwareGeneration: n.HardwareGeneration,
		GPUMem:             n.GPUMem,
		GPUModel:           n.GPUModel,
		GPUUUID:            n.GPUUUID,
		Fabric:             n.Fabric,
		Labels:             n.Labels,
	}
}

// NodeSpec is the writable part of a node: what create and update take.
type NodeSpec struct {
	IP                 string
	Index              int
	CPUMem             int64
	DriverVersion      string
	HardwareGeneration *int64
	GPUMem             *int64
	GPUModel           *string
	GPUUUID            *string
	Fabric             *string
	Labels             Labels
}

// Limits of the topology fields, in characters.
const (
	MaxGPUModel = MaxHardwareNameLen
	MaxGPUUUID  = 100
	MaxFabric   = 200
)

// Same reports whether s and o are the same spec.
func (s NodeSpec) Same(o NodeSpec) bool {
	return s.IP == o.IP && s.Index == o.Index && s.CPUMem == o.CPUMem &&
		s.DriverVersion == o.DriverVersion &&
		samePtr(s.HardwareGeneration, o.HardwareGeneration) && samePtr(s.GPUMem, o.GPUMem) &&
		samePtr(s.GPUModel, o.GPUModel) && samePtr(s.GPUUUID, o.GPUUUID) &&
		samePtr(s.Fabric, o.Fabric) && s.Labels == o.Labels
}

// NormalizeUpdate is Normalize for a spec that replaces old: a text field
// the update leaves as it was is not held to rules made after it was
// stored (an address no host has, a deceptive character), so that a node
// stays editable; the field must be changed to be set right. Fields that
// change are checked in full.
func (s *NodeSpec) NormalizeUpdate(old NodeSpec) error {
	err := s.Normalize()
	if err == nil {
		return nil
	}
	var kept FieldErrors
	for _, f := range FieldsOf(err) {
		unchanged := false
		switch f.Field {
		case "ip":
			unchanged = s.IP == old.IP
		case "driver_version":
			unchanged = s.DriverVersion == old.DriverVersion
		case "gpu_model":
			unchanged = samePtr(s.GPUModel, old.GPUModel)
		case "gpu_uuid":
			unchanged = samePtr(s.GPUUUID, old.GPUUUID)
		case "fabric":
			unchanged = samePtr(s.Fabric, old.Fabric)
		}
		if !unchanged {
			kept.Add(f.Field, "%s", f.Message)
		}
	}
	return kept.Err()
}

func samePtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Normalize validates the spec and rewrites IP to its canonical form. The
// error, if any, is an ErrInvalid *Error naming every bad field.
func (s *NodeSpec) Normalize() error {
	var fe FieldErrors
	if ip, err := CanonicalIP(s.IP); err != nil {
		fe.Add("ip", "%s", err.Error())
	} else {
		s.IP = ip
	}
	if s.Index < 0 || s.Index > MaxIndex {
		fe.Add("index", "must be between 0 and %d", MaxIndex)
	}
	if s.CPUMem < 0 {
		fe.Add("cpu_mem", "must not be negative")
	}
	if msg := checkText(s.DriverVersion, MaxDriverVersion); msg != "" {
		fe.Add("driver_version", "%s", msg)
	}
	if s.HardwareGeneration != nil && *s.HardwareGeneration <= 0 {
		fe.Add("hardware_generation", "must be the pk of a hardware generation (a positive integer) or null")
	}
	if s.GPUMem != nil && *s.GPUMem < 0 {
		fe.Add("gpu_mem", "must not be negative")
	}
	checkName(&fe, "gpu_model", s.GPUModel, MaxGPUModel)
	checkName(&fe, "gpu_uuid", s.GPUUUID, MaxGPUUUID)
	checkName(&fe, "fabric", s.Fabric, MaxFabric)
	return fe.Err()
}

// checkName holds an optional name to non-empty text without surrounding
// blanks: null, not "", says a node has none.
func checkName(fe *FieldErrors, field string, v *string, max int) {
	switch {
	case v == nil:
	case *v == "":
		fe.Add(field, "must not be empty; send null when there is none")
	case strings.TrimSpace(*v) != *v:
		fe.Add(field, "must not start or end with whitespace")
	default:
		if msg := checkText(*v, max); msg != "" {
			fe.Add(field, "%s", msg)
		}
	}
}

// CanonicalIP parses an IPv4 or IPv6 address and returns its canonical text
// (RFC 5952 for IPv6). IPv4-mapped IPv6 addresses become plain IPv4 so one host
// has one identity. Zones and prefixes are refused: a node is one host.
func CanonicalIP(s string) (string, error) {
	if s == "" {
		return "", errText("must be an IPv4 or IPv6 address")
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return "", errText("must be an IPv4 or IPv6 address")
	}
	if addr.Zone() != "" {
		return "", errText("must not carry an IPv6 zone")
	}
	addr = addr.Unmap()
	switch {
	case addr.IsUnspecified():
		return "", errText("must be a host's address, not the unspecified address " + addr.String())
	case addr.IsMulticast():
		return "", errText("must be a host's address, not a multicast one")
	case addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "", errText("must be a host's address, not the broadcast address")
	}
	return addr.String(), nil
}

// errText is a plain error whose text is meant for clients.
type errText string

func (e errText) Error() string { return string(e) }

// CheckLabel returns why s is not acceptable as a short label (a principal,
// a driver version, a name), or "" when it is.
func CheckLabel(s string, max int) string { return checkText(s, max) }

// MaxPrincipalLen bounds token subjects and the names derived from them.
const MaxPrincipalLen = 200

// checkText returns why s is not acceptable as a short label, or "".
func checkText(s string, max int) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	if utf8.RuneCountInString(s) > max {
		return "must be at most " + strconv.Itoa(max) + " characters"
	}
	for _, r := range s {
		switch {
		case unicode.IsControl(r):
			return "must not contain control characters"
		case deceptive(r):
			return fmt.Sprintf("must not contain invisible format characters (U+%04X)", r)
		}
	}
	return ""
}

// deceptive reports the format characters that make text read otherwise
// than it is: the bidirectional controls, which reorder what is shown
// (U+202E turns text around), the zero-width space and the byte order
// mark, which hide in it. Joiners (U+200C, U+200D, which some scripts and
// emoji need) and the soft hyphen stay allowed.
func deceptive(r rune) bool {
	switch {
	case r == 0x061C, r == 0x200B, r == 0x200E, r == 0x200F, r == 0xFEFF:
		return true
	case 0x202A <= r && r <= 0x202E, 0x2066 <= r && r <= 0x2069:
		return true
	}
	return false
}

// Optional is a field of a partial update: absent (Set false), explicitly
// null (Set true, Null true) or a value.
type Optional[T any] struct {
	Set   bool
	Null  bool
	Value T
}

// NodePatch is a JSON merge patch of a node's writable fields: absent fields
// stay as they are.
type NodePatch struct {
	IP                 Optional[string]
	Index              Optional[int]
	CPUMem             Optional[int64]
	DriverVersion      Optional[string]
	HardwareGeneration Optional[int64]
	GPUMem             Optional[int64]
	GPUModel           Optional[string]
	GPUUUID            Optional[string]
	Fabric             Optional[string]
	Labels             LabelPatch
}

// Apply returns s with the patch applied. Decoders refuse null for the
// non-nullable fields, so Apply only has to honour null where it clears.
// The error is an ErrInvalid *Error naming labels, whose patch may be
// refused (see LabelPatch).
func (p NodePatch) Apply(s NodeSpec) (NodeSpec, error) {
	if p.IP.Set {
		s.IP = p.IP.Value
	}
	if p.Index.Set {
		s.Index = p.Index.Value
	}
	if p.CPUMem.Set {
		s.CPUMem = p.CPUMem.Value
	}
	if p.DriverVersion.Set {
		s.DriverVersion = p.DriverVersion.Value
	}
	s.HardwareGeneration = applyNullable(p.HardwareGeneration, s.HardwareGeneration)
	s.GPUMem = applyNullable(p.GPUMem, s.GPUMem)
	s.GPUModel = applyNullable(p.GPUModel, s.GPUModel)
	s.GPUUUID = applyNullable(p.GPUUUID, s.GPUUUID)
	s.Fabric = applyNullable(p.Fabric, s.Fabric)
	labels, err := p.Labels.Apply(s.Labels)
	if err != nil {
		var fe FieldErrors
		fe.Add("labels", "%s", err.Error())
		return s, fe.Err()
	}
	s.Labels = labels
	return s, nil
}

func applyNullable[T any](o Optional[T], cur *T) *T {
	switch {
	case !o.Set:
		return cur
	case o.Null:
		return nil
	default:
		v := o.Value
		return &v
	}
}

// NodeEcho holds the read-only fields a client sent back with an update.
// Clients may echo them (GET, edit, PUT) but not change them.
type NodeEcho struct {
	PK            Optional[int64]
	LastSeen      Optional[time.Time]
	CurrentJob    Optional[int64]
	Owner         Optional[string]
	Source        Optional[string]
	Schedulable   Optional[bool]
	ExternalID    Optional[string]
	ProviderState Optional[string]
	CreatedAt     Optional[Stamp]
	UpdatedAt     Optional[Stamp]
	// The lifecycle's fields. A sweep, a cordon or a lease may change them
	// between a client's read and its write; an echo must still be a value
	// they have now, like provider_state.
	State          Optional[string]
	CordonReason   Optional[string]
	LeaseExpiresAt Optional[Stamp]
	// Version echoed must be the node's current version: a document read
	// before another write is stale, as its updated_at would be.
	Version Optional[int64]
}

// Stamp is a timestamp a client sent back, with the precision it was
// written in. Many clients write RFC 3339 with whole seconds (or
// milliseconds) whatever they read, so an echo counts as unchanged when it
// is the stored instant cut to that precision.
type Stamp struct {
	Time time.Time
	// Precision is the unit of the last digit sent: time.Second for
	// "…:05Z", time.Millisecond for "…:05.123Z", time.Nanosecond for nine
	// fractional digits or more.
	Precision time.Duration
}

// Matches reports whether the stamp is t written at the stamp's precision
// (digits cut, not rounded, as clients format them).
func (s Stamp) Matches(t time.Time) bool {
	p := s.Precision
	if p <= 0 {
		p = time.Nanosecond
	}
	return t.Truncate(p).Equal(s.Time)
}

// sameStamp reports whether a non-null echo matches t.
func sameStamp(o Optional[Stamp], t time.Time) bool { return !o.Null && o.Value.Matches(t) }

// Check compares the echoed read-only fields with the stored node and names
// every field whose value differs.
//
// last_seen moves with every heartbeat, which does not change the node's
// version, so a client that read the node a moment ago holds an older value.
// An echo is accepted when it is a value the node has had: not null while the
// node has been seen, and not later than the stored time.
//
// created_at and updated_at are compared at the precision the client wrote
// them in (see Stamp): a client that keeps whole seconds still round-trips
// them. updated_at is thus no guard against a write in the same second; If-Match is.
func (e NodeEcho) Check(cur Node) error {
	var fe FieldErrors
	if e.PK.Set && (e.PK.Null || e.PK.Value != cur.PK) {
		fe.Add("pk", "is read-only; it is %d for this node", cur.PK)
	}
	if e.LastSeen.Set {
		ok := false
		switch {
		case e.LastSeen.Null:
			ok = true // a client that read the node before its first heartbeat
		case cur.LastSeen != nil:
			ok = !e.LastSeen.Value.After(*cur.LastSeen)
		}
		if !ok {
			fe.Add("last_seen", "is read-only and managed by the server; send back the value you read or leave it out")
		}
	}
	if e.CurrentJob.Set && !sameNullable(e.CurrentJob, cur.CurrentJob) {
		fe.Add("current_job", "is read-only; jobs are assigned by claims, and this node's current_job is %s", formatNullable(cur.CurrentJob))
	}
	if e.Owner.Set && !sameString(e.Owner, cur.Owner) {
		fe.Add("owner", "is read-only; it is the agent that registered the node")
	}
	if e.Source.Set && (e.Source.Null || e.Source.Value != cur.Source) {
		fe.Add("source", "is read-only; it is %s for this node", cur.Source)
	}
	if e.Schedulable.Set && e.Schedulable.Value != cur.Schedulable {
		fe.Add("schedulable", "is read-only; it follows the provider's state of the host")
	}
	if e.ExternalID.Set && !sameString(e.ExternalID, cur.ExternalID) {
		fe.Add("external_id", "is read-only; it is the provider's id of the host")
	}
	if e.ProviderState.Set && !sameString(e.ProviderState, cur.ProviderState) {
		fe.Add("provider_state", "is read-only; the provider's state may have changed since you read the node")
	}
	if e.CreatedAt.Set && !sameStamp(e.CreatedAt, cur.CreatedAt) {
		fe.Add("created_at", "is read-only; send back the value you read or leave it out")
	}
	if e.UpdatedAt.Set && !sameStamp(e.UpdatedAt, cur.UpdatedAt) {
		fe.Add("updated_at", "is read-only; the node changed since you read it, or the value was edited")
	}
	if e.State.Set && (e.State.Null || State(e.State.Value) != cur.State) {
		fe.Add("state", "is read-only; it is %s for this node now", cur.State)
	}
	if e.CordonReason.Set && !sameString(e.CordonReason, cur.CordonReason) {
		fe.Add("cordon_reason", "is read-only; cordon and uncordon set it")
	}
	if e.LeaseExpiresAt.Set {
		same := e.LeaseExpiresAt.Null && cur.LeaseExpiresAt == nil ||
			!e.LeaseExpiresAt.Null && cur.LeaseExpiresAt != nil && e.LeaseExpiresAt.Value.Matches(*cur.LeaseExpiresAt)
		if !same {
			fe.Add("lease_expires_at", "is read-only; claims and renewals set it")
		}
	}
	if e.Version.Set && e.Version.Value != cur.Version {
		fe.Add("version", "is read-only; the node is at version %d now: it changed since you read it, or the value was edited", cur.Version)
	}
	return fe.Err()
}

func sameString(o Optional[string], cur *string) bool {
	if o.Null {
		return cur == nil
	}
	return cur != nil && *cur == o.Value
}

func sameNullable(o Optional[int64], cur *int64) bool {
	if o.Null {
		return cur == nil
	}
	return cur != nil && *cur == o.Value
}

func formatNullable(v *int64) string {
	if v == nil {
		return "null"
	}
	return strconv.FormatInt(*v, 10)
}
