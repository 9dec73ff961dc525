package registry

// ImportedNode is one registry node as a provider import sees it: one GPU
// of a provider host, or a CPU-only host.
type ImportedNode struct {
	ExternalID string // the provider's id of the host
	IP         string // canonical
	Index      int
	CPUMem     int64
	GPUMem     *int64 // nil for CPU-only hosts
	GPUModel   string // hardware generation name, and gpu_model; "" for CPU-only hosts
	Fabric     string // the host's fabric; "" when the provider names none
	Labels     Labels // the provider's labels, all reserved (ProviderLabelPrefix)
	State      string // the provider's word for the host's state
	Running    bool   // only running hosts are schedulable
}

// ProviderGone is the provider_state of an imported node whose host
// vanished from the provider while the node held a job.
const ProviderGone = "gone"

// ImportResult counts what one import pass did to the nodes table.
type ImportResult struct {
	Added, Updated, Unchanged, Removed int
	// KeptBusy are nodes whose host vanished but which hold a job: kept,
	// unschedulable, removed by the first pass after their release.
	KeptBusy int
	// KeptSkipped are nodes of hosts the provider still reports but that
	// this pass skipped (no address, unknown product, …): left as they are
	// rather than removed as if the host had vanished.
	KeptSkipped int
	// Withheld are nodes the inventory no longer names that this pass
	// would have removed or marked gone but kept as they are: more than
	// the mass-removal guard allows were about to go (RemovalGuard), of
	// Total, the provider's nodes before the pass added any (counted only
	// under a guard).
	Withheld, Total int
	// Conflicts are (ip, index) pairs another provider already imported.
	Conflicts []string
	// HardwareAdded are hardware generations created for new GPU models.
	HardwareAdded []string
}
