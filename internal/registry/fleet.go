package registry

// NodeState is what a node is doing as the fleet's figures count it.
type NodeState string

// The states of a node. Every state is declared here, in NodeStates, and
// derived in one place (the store's fleet query, which follows
// Node.State); the fleet metric reports each of them, zero included, so a
// new state needs no change in the metrics code.
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
