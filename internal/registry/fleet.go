package registry

// FleetCount is how many nodes of one hardware generation are in one
// state. Generation is the generation's name, "" for nodes without one.
// A generation without nodes comes with State "" and Nodes 0.
//
// The fleet metric's state label takes its values from States (each
// reported, zero included), so a new state is one entry there, with its
// rule in Node.DeriveState and the same rule in the store's fleet query (a
// store test holds the two together); the metrics code does not change.
type FleetCount struct {
	Generation string
	// Fabric is the nodes' fabric, "" for none.
	Fabric string
	State  State
	Nodes  int64
}

// FabricCapacity is what one fabric holds of the nodes a filter selects.
type FabricCapacity struct {
	// Fabric is nil for the nodes without one.
	Fabric *string
	// Hosts is the number of hosts (addresses) with a selected node.
	Hosts int64
	// Nodes counts the selected nodes by state; every state is present.
	Nodes map[State]int64
	// FreeHosts is, for each number of free selected nodes a host has,
	// how many hosts have it (0 included), fewest free first: what a
	// claim of whole groups can find.
	FreeHosts []FreeHosts
}

// FreeHosts is how many hosts have Free free nodes.
type FreeHosts struct {
	Free  int64
	Hosts int64
}
