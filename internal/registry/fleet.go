package registry

// NodeState is what a node is doing as the fleet's figures count it.
type NodeState string

// The states of a node. The fleet metric's state label takes its values
// from NodeStates (each reported, zero included), so a new state (issue
// 11's lifecycle states) is one entry there, with its rule in Node.State
// and the same rule in the store's fleet query (a store test holds the two
// together); the metrics code does not change.
const (
	NodeFree          NodeState = "free"          // schedulable and holding no job
	NodeBusy          NodeState = "busy"          // holding a job
	NodeUnschedulable NodeState = "unschedulable" // no job, but its provider reports it stopped or gone
)

// NodeStates lists every NodeState.
var NodeStates = []NodeState{NodeFree, NodeBusy, NodeUnschedulable}

// State is the node's state: busy while it holds a job (even if its
// provider stopped it meanwhile), otherwise unschedulable or free.
func (n Node) State() NodeState {
	switch {
	case n.CurrentJob != nil:
		return NodeBusy
	case !n.Schedulable:
		return NodeUnschedulable
	default:
		return NodeFree
	}
}

// FleetCount is how many nodes of one hardware generation are in one
// state. Generation is the generation's name, "" for nodes without one.
// A generation without nodes comes with State "" and Nodes 0.
type FleetCount struct {
	Generation string
	State      NodeState
	Nodes      int64
}
