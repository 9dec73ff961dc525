package registry

// State is a node's place in its lifecycle. Exactly one holds at a time;
// DeriveState picks it by precedence, in the order of States.
type State string

const (
	// StateGone: the node's provider reports its host stopped or vanished
	// (Schedulable is false).
	StateGone State = "gone"
	// StateLost: the node has an agent or has heartbeated, and has not been
	// seen for the node TTL. A heartbeat brings it back.
	StateLost State = "lost"
	// StateDraining: cordoned while a job holds it; on release it becomes
	// cordoned, never free.
	StateDraining State = "draining"
	// StateCordoned: an admin took it out of scheduling, and no job holds it.
	StateCordoned State = "cordoned"
	// StateBusy: a job holds it.
	StateBusy State = "busy"
	// StateFree: none of the above. The only state claims take.
	StateFree State = "free"
)

// States lists every state in order of precedence: the first that applies
// to a node is its state.
var States = []State{StateGone, StateLost, StateDraining, StateCordoned, StateBusy, StateFree}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// DeriveState is the node's state by precedence, from what the store keeps:
// Schedulable (the provider's word), Lost (the sweeper's), CordonReason
// (an admin's) and CurrentJob (a claim's).
func (n Node) DeriveState() State {
	switch {
	case !n.Schedulable:
		return StateGone
	case n.Lost:
		return StateLost
	case n.CordonReason != nil && n.CurrentJob != nil:
		return StateDraining
	case n.CordonReason != nil:
		return StateCordoned
	case n.CurrentJob != nil:
		return StateBusy
	default:
		return StateFree
	}
}
