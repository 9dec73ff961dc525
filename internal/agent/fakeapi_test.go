package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// fakeAPI is the registry as an agent sees it, in memory, with the
// server's rules for agents: a node belongs to the agent that registered
// it, an imported node without owner is adopted, a taken pair is a 409
// naming the holder, a node that holds a job is not deleted, and a node
// that is not the agent's is a 403 whether or not it exists. The real
// server is exercised by cmd/registryd's end-to-end tests; this fake
// lets the agent's decisions be tested one by one, quickly.
type fakeAPI struct {
	mu       sync.Mutex
	sub      string
	nodes    map[int64]*registry.Node
	nextPK   int64
	hardware map[string]int64
	down     bool
	refuseIP map[string]bool // addresses the token is not bound to: creates there are 403
	calls    []string
	answers  int // refusals answered, for their request ids
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{sub: "agent-1", nodes: map[int64]*registry.Node{}, hardware: map[string]int64{}}
}

var errUnreachable = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

func (f *fakeAPI) call(format string, args ...any) error {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	if f.down {
		return errUnreachable
	}
	return nil
}

// requestID is what the client appends to a refusal: each answer's own,
// so the same refusal reads differently every time.
func (f *fakeAPI) requestID() string {
	f.answers++
	return fmt.Sprintf(" [request %016x]", f.answers)
}

// takeCalls returns the calls made since the last takeCalls.
func (f *fakeAPI) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeAPI) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// add stores a node as someone else made it (an admin, an import, an
// earlier life of the agent).
func (f *fakeAPI) add(n registry.Node) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextPK++
	n.PK = f.nextPK
	if n.Source == "" {
		n.Source = "api"
	}
	f.nodes[n.PK] = &n
	return n.PK
}

func (f *fakeAPI) get(pk int64) (registry.Node, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[pk]
	if !ok {
		return registry.Node{}, false
	}
	return *n, true
}

func (f *fakeAPI) remove(pk int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nodes, pk)
}

func (f *fakeAPI) setJob(pk int64, job *int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[pk].CurrentJob = job
}

func (f *fakeAPI) addHardware(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	pk := int64(100 + len(f.hardware))
	f.hardware[name] = pk
	return pk
}

// all returns every node by pk.
func (f *fakeAPI) all() map[int64]registry.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]registry.Node{}
	for pk, n := range f.nodes {
		out[pk] = *n
	}
	return out
}

func (f *fakeAPI) checkHardware(hw *int64) error {
	if hw == nil {
		return nil
	}
	for _, pk := range f.hardware {
		if pk == *hw {
			return nil
		}
	}
	return &registry.Error{Kind: registry.ErrInvalid, Message: "the request has invalid fields",
		Fields: []registry.FieldError{{Field: "hardware_generation", Message: "does not exist"}}}
}

// actAs is the server's Node-Id rule for an agent.
func (f *fakeAPI) actAs(pk int64) (*registry.Node, error) {
	n, ok := f.nodes[pk]
	if !ok || n.Owner == nil || *n.Owner != f.sub {
		return nil, registry.Errorf(registry.ErrForbidden, "agent %q may not act as node %d", f.sub, pk)
	}
	now := time.Now()
	n.LastSeen = &now
	return n, nil
}

func (f *fakeAPI) CreateNode(_ context.Context, spec registry.NodeSpec) (registry.Node, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("create %s/%d", spec.IP, spec.Index); err != nil {
		return registry.Node{}, false, err
	}
	if err := spec.Normalize(); err != nil {
		return registry.Node{}, false, err
	}
	if f.refuseIP[spec.IP] {
		return registry.Node{}, false, registry.Errorf(registry.ErrForbidden, "this token may not register nodes at %s%s", spec.IP, f.requestID())
	}
	if err := f.checkHardware(spec.HardwareGeneration); err != nil {
		return registry.Node{}, false, err
	}
	for _, n := range f.nodes {
		if n.IP != spec.IP || n.Index != spec.Index {
			continue
		}
		if n.Source != "api" && n.Owner == nil {
			owner := f.sub
			n.Owner, n.DriverVersion = &owner, spec.DriverVersion
			// As the server adopts: the agent's GPU names win, its labels
			// join, its fabric fills in.
			if spec.GPUModel != nil {
				n.GPUModel = spec.GPUModel
			}
			if spec.GPUUUID != nil {
				n.GPUUUID = spec.GPUUUID
			}
			if n.Fabric == nil {
				n.Fabric = spec.Fabric
			}
			own := registry.LabelPatch{Set: true, Values: map[string]*string{}}
			for k, v := range spec.Labels.All() {
				own.Values[k] = &v
			}
			labels, err := own.Apply(n.Labels)
			if err != nil {
				return registry.Node{}, false, err
			}
			n.Labels = labels
			return *n, true, nil
		}
		return registry.Node{}, false, &registry.Error{Kind: registry.ErrConflict, ExistingPK: n.PK,
			Message: fmt.Sprintf("a node already exists at %s index %d", spec.IP, spec.Index)}
	}
	f.nextPK++
	owner := f.sub
	n := registry.Node{PK: f.nextPK, IP: spec.IP, Index: spec.Index, CPUMem: spec.CPUMem, DriverVersion: spec.DriverVersion,
		HardwareGeneration: spec.HardwareGeneration, GPUMem: spec.GPUMem, Owner: &owner, Source: "api", Schedulable: true,
		GPUModel: spec.GPUModel, GPUUUID: spec.GPUUUID, Fabric: spec.Fabric, Labels: spec.Labels}
	f.nodes[n.PK] = &n
	return n, false, nil
}

func (f *fakeAPI) GetNodeAs(_ context.Context, pk int64) (registry.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("get %d", pk); err != nil {
		return registry.Node{}, err
	}
	n, err := f.actAs(pk)
	if err != nil {
		return registry.Node{}, err
	}
	return *n, nil
}

func (f *fakeAPI) PatchNodeAs(_ context.Context, pk int64, p registry.NodePatch) (registry.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("patch %d", pk); err != nil {
		return registry.Node{}, err
	}
	n, err := f.actAs(pk)
	if err != nil {
		return registry.Node{}, err
	}
	spec, err := p.Apply(n.Spec())
	if err != nil {
		return registry.Node{}, err
	}
	if err := f.checkHardware(spec.HardwareGeneration); err != nil {
		return registry.Node{}, err
	}
	n.CPUMem, n.DriverVersion, n.HardwareGeneration, n.GPUMem = spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem
	n.GPUModel, n.GPUUUID, n.Fabric, n.Labels = spec.GPUModel, spec.GPUUUID, spec.Fabric, spec.Labels
	return *n, nil
}

func (f *fakeAPI) DeleteNodeAs(_ context.Context, pk int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("delete %d", pk); err != nil {
		return err
	}
	n, ok := f.nodes[pk]
	if !ok || n.Owner == nil || *n.Owner != f.sub {
		return registry.Errorf(registry.ErrForbidden, "agent %q may not act as node %d", f.sub, pk)
	}
	if n.CurrentJob != nil {
		return registry.Errorf(registry.ErrConflict, "job %d holds node %d%s", *n.CurrentJob, pk, f.requestID())
	}
	delete(f.nodes, pk)
	return nil
}

func (f *fakeAPI) Ping(_ context.Context, pk int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ping %d", pk); err != nil {
		return err
	}
	_, err := f.actAs(pk)
	return err
}

func (f *fakeAPI) HardwareByName(_ context.Context, name string) (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("hardware %s", name); err != nil {
		return 0, false, err
	}
	pk, ok := f.hardware[name]
	return pk, ok, nil
}
