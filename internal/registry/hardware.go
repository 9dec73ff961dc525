package registry

import (
	"slices"
	"strings"
	"time"
)

// Sources are where nodes come from: the API, or a provider import.
var Sources = []string{"api", "scp", "e2e"}

// Hardware is a hardware generation (a GPU model such as H100): nodes point at
// one so that every node's hardware_generation names a real row.
type Hardware struct {
	PK        int64
	Name      string
	CreatedAt time.Time
	UpdatedAt time.Time
	Version   int64
	// Nodes counts the nodes that use this generation.
	Nodes int64
}

// HardwareSpec is the writable part of a hardware generation.
type HardwareSpec struct {
	Name string
}

// Normalize validates the spec. Names are compared exactly, so surrounding
// whitespace is refused rather than silently trimmed: "H100 " and "H100"
// would otherwise look alike and differ.
func (s *HardwareSpec) Normalize() error {
	var fe FieldErrors
	switch {
	case s.Name == "":
		fe.Add("name", "must not be empty")
	case strings.TrimSpace(s.Name) != s.Name:
		fe.Add("name", "must not start or end with whitespace")
	default:
		if msg := checkText(s.Name, MaxHardwareNameLen); msg != "" {
			fe.Add("name", "%s", msg)
		}
	}
	return fe.Err()
}

// HardwarePatch is a merge patch of a hardware generation.
type HardwarePatch struct {
	Name Optional[string]
}

// Apply returns s with the patch applied.
func (p HardwarePatch) Apply(s HardwareSpec) HardwareSpec {
	if p.Name.Set {
		s.Name = p.Name.Value
	}
	return s
}

// HardwareEcho holds read-only fields sent back with a hardware update.
type HardwareEcho struct {
	PK        Optional[int64]
	CreatedAt Optional[Stamp]
	UpdatedAt Optional[Stamp]
	Nodes     Optional[int64]
}

// Check names every echoed read-only field whose value differs from cur;
// times are compared at the precision the client wrote them in (Stamp).
func (e HardwareEcho) Check(cur Hardware) error {
	var fe FieldErrors
	if e.PK.Set && (e.PK.Null || e.PK.Value != cur.PK) {
		fe.Add("pk", "is read-only; it is %d for this hardware generation", cur.PK)
	}
	if e.CreatedAt.Set && !sameStamp(e.CreatedAt, cur.CreatedAt) {
		fe.Add("created_at", "is read-only; send back the value you read or leave it out")
	}
	if e.UpdatedAt.Set && !sameStamp(e.UpdatedAt, cur.UpdatedAt) {
		fe.Add("updated_at", "is read-only; the hardware generation changed since you read it, or the value was edited")
	}
	if e.Nodes.Set && (e.Nodes.Null || e.Nodes.Value != cur.Nodes) {
		fe.Add("nodes", "is read-only; %d nodes use this hardware generation now", cur.Nodes)
	}
	return fe.Err()
}

// NodeFilter selects nodes: list, claim and watch all read their filters
// into it and validate them with one Normalize, and Match is the meaning
// every reader of it (the store's SQL, the watch stream) must agree with.
// Nil fields do not filter. List results are ordered by pk and start
// after After.
type NodeFilter struct {
	// Free true is State [free]; false is every other state. With State
	// both apply (AND); a pair that no state passes is refused.
	Free *bool
	// State selects nodes in any of the listed states; nil or empty does
	// not filter.
	State              []State
	CurrentJob         *int64
	HardwareGeneration *int64
	MinGPUMem          *int64
	MinCPUMem          *int64
	IP                 *string
	Index              *int
	SeenWithin         *time.Duration
	Source             *string
	// Fabric selects the nodes of one fabric.
	Fabric *string
	// Owner selects the nodes one principal registered (their owner).
	Owner *string
	// Selector selects nodes by their labels; nil or empty does not
	// filter. Readers parse it from text with ParseSelector.
	Selector Selector
	// PK selects one node by its pk (watch's node parameter).
	PK    *int64
	After int64
	// Limit caps the number of nodes; 0 means no limit.
	Limit int
}

// MaxListLimit is the largest page a client may ask for.
const MaxListLimit = 1000

// MaxSeenWithin bounds seen_within: a century is "ever seen" already.
const MaxSeenWithin = 100 * 365 * 24 * time.Hour

// Normalize validates the filter, canonicalizing IP. Every filter names an
// attribute a node can have: a value no node can have (a negative job, a
// hardware generation of 0, an unknown source) is an error, not an empty
// answer, so that a typo is not mistaken for "nothing matches".
func (f *NodeFilter) Normalize() error {
	var fe FieldErrors
	if f.CurrentJob != nil && *f.CurrentJob <= 0 {
		fe.Add("current_job", "must be a positive integer (a job's pk)")
	}
	if f.HardwareGeneration != nil && *f.HardwareGeneration <= 0 {
		fe.Add("hardware_generation", "must be the pk of a hardware generation (a positive integer)")
	}
	if f.Owner != nil {
		switch msg := CheckLabel(*f.Owner, MaxPrincipalLen); {
		case *f.Owner == "":
			fe.Add("owner", "must be a principal's name (a token's sub), not empty")
		case msg != "":
			fe.Add("owner", "%s", msg)
		}
	}
	if f.IP != nil {
		ip, err := CanonicalIPFilter(*f.IP)
		if err != nil {
			fe.Add("ip", "%s", err.Error())
		} else {
			f.IP = &ip
		}
	}
	if f.Index != nil && (*f.Index < 0 || *f.Index > MaxIndex) {
		fe.Add("index", "must be between 0 and %d", MaxIndex)
	}
	if f.MinGPUMem != nil && *f.MinGPUMem < 0 {
		fe.Add("min_gpu_mem", "must not be negative")
	}
	if f.MinCPUMem != nil && *f.MinCPUMem < 0 {
		fe.Add("min_cpu_mem", "must not be negative")
	}
	if f.SeenWithin != nil && (*f.SeenWithin < time.Second || *f.SeenWithin > MaxSeenWithin) {
		fe.Add("seen_within", "must be a number of seconds between 1 and %d", int64(MaxSeenWithin/time.Second))
	}
	if f.Source != nil && !slices.Contains(Sources, *f.Source) {
		fe.Add("source", "must be one of %s", strings.Join(Sources, ", "))
	}
	if f.Fabric != nil {
		if msg := checkText(*f.Fabric, MaxFabric); *f.Fabric == "" || msg != "" {
			fe.Add("fabric", "must be a fabric's name: 1 to %d characters of text", MaxFabric)
		}
	}
	if msg := f.Selector.check(); msg != "" {
		fe.Add("selector", "%s", msg)
	}
	if f.PK != nil && *f.PK <= 0 {
		fe.Add("node", "must be a node pk (a positive integer)")
	}
	for _, st := range f.State {
		if !st.Valid() {
			fe.Add("state", "must be one of %s", joinStates(States))
			break
		}
	}
	if f.Free != nil && len(f.State) > 0 && !fe.Has("state") &&
		!slices.ContainsFunc(f.State, func(st State) bool { return (st == StateFree) == *f.Free }) {
		fe.Add("state", "selects no node together with free: %t (free: true is state free); leave one of them out", *f.Free)
	}
	if f.After < 0 {
		fe.Add("after", "must not be negative")
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		fe.Add("limit", "must be between 1 and %d", MaxListLimit)
	}
	return fe.Err()
}

// Match reports whether n passes every filter, as of now (for SeenWithin).
// It is the filter's meaning; paging (After, Limit) is not part of it. The
// store's SQL must select exactly the nodes Match accepts. It reads the
// node's State as its document carries it (the store and the change log
// both set it), not the fields it is derived from: a document has no Lost.
func (f *NodeFilter) Match(n Node, now time.Time) bool {
	free := n.State == StateFree
	return (f.Free == nil || *f.Free == free) &&
		(f.CurrentJob == nil || n.CurrentJob != nil && *n.CurrentJob == *f.CurrentJob) &&
		(f.HardwareGeneration == nil || n.HardwareGeneration != nil && *n.HardwareGeneration == *f.HardwareGeneration) &&
		(f.MinGPUMem == nil || n.GPUMem != nil && *n.GPUMem >= *f.MinGPUMem) &&
		(f.MinCPUMem == nil || n.CPUMem >= *f.MinCPUMem) &&
		(f.IP == nil || IPMatches(*f.IP, n.IP)) &&
		(f.Index == nil || n.Index == *f.Index) &&
		(f.SeenWithin == nil || n.LastSeen != nil && !n.LastSeen.Before(now.Add(-*f.SeenWithin))) &&
		(f.Source == nil || n.Source == *f.Source) &&
		(f.PK == nil || n.PK == *f.PK) &&
		(f.Fabric == nil || n.Fabric != nil && *n.Fabric == *f.Fabric) &&
		(f.Owner == nil || n.Owner != nil && *n.Owner == *f.Owner) &&
		f.Selector.Matches(n.Labels) &&
		(len(f.State) == 0 || slices.Contains(f.State, n.State))
}

func joinStates(states []State) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
