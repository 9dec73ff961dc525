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
	CreatedAt Optional[time.Time]
	UpdatedAt Optional[time.Time]
	Nodes     Optional[int64]
}

// Check names every echoed read-only field whose value differs from cur.
func (e HardwareEcho) Check(cur Hardware) error {
	var fe FieldErrors
	if e.PK.Set && (e.PK.Null || e.PK.Value != cur.PK) {
		fe.Add("pk", "is read-only; it is %d for this hardware generation", cur.PK)
	}
	if e.CreatedAt.Set && (e.CreatedAt.Null || !e.CreatedAt.Value.Equal(cur.CreatedAt)) {
		fe.Add("created_at", "is read-only")
	}
	if e.UpdatedAt.Set && (e.UpdatedAt.Null || !e.UpdatedAt.Value.Equal(cur.UpdatedAt)) {
		fe.Add("updated_at", "is read-only; the hardware generation changed since you read it, or the value was edited")
	}
	if e.Nodes.Set && (e.Nodes.Null || e.Nodes.Value != cur.Nodes) {
		fe.Add("nodes", "is read-only; %d nodes use this hardware generation now", cur.Nodes)
	}
	return fe.Err()
}

// NodeFilter selects nodes for list. Nil fields do not filter. Results are
// ordered by pk and start after After.
type NodeFilter struct {
	Free               *bool
	CurrentJob         *int64
	HardwareGeneration *int64
	MinGPUMem          *int64
	MinCPUMem          *int64
	IP                 *string
	Index              *int
	SeenWithin         *time.Duration
	Source             *string
	After              int64
	// Limit caps the number of nodes; 0 means no limit.
	Limit int
}

// MaxListLimit is the largest page a client may ask for.
const MaxListLimit = 1000

// Normalize validates the filter, canonicalizing IP.
func (f *NodeFilter) Normalize() error {
	var fe FieldErrors
	if f.IP != nil {
		ip, err := CanonicalIP(*f.IP)
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
	if f.SeenWithin != nil && *f.SeenWithin <= 0 {
		fe.Add("seen_within", "must be a positive number of seconds")
	}
	if f.Source != nil && !slices.Contains(Sources, *f.Source) {
		fe.Add("source", "must be one of api, scp, e2e")
	}
	if f.After < 0 {
		fe.Add("after", "must not be negative")
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		fe.Add("limit", "must be between 1 and %d", MaxListLimit)
	}
	return fe.Err()
}
