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
	State      State
	Nodes      int64
}
