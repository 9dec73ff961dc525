// Package agent is `registryd agent`: the loop that runs on a GPU host,
// discovers its GPUs, registers one node per GPU (one node for a CPU-only
// host) and keeps them alive with heartbeats.
//
// Every pass (each Interval) the agent
//
//   - finds the host's address (Config.IP, or the local address of the
//     route to the server), its memory (/proc/meminfo) and its GPUs
//     (nvidia-smi on PATH); without nvidia-smi, or when nvidia-smi finds no
//     device, the host is CPU-only: one node, index 0, gpu_mem null;
//   - maps each GPU's model to a hardware generation the server knows by
//     name (it cannot create one: that takes an admin);
//   - registers every node it does not act as yet. A registration may adopt
//     a node the cloud import created (200). When another node holds the
//     pair (409 with existing_pk), the agent takes it back only if it may
//     act as it (it is its own, from before a lost state file); otherwise it
//     reports the conflict and tries again next pass, since only an admin
//     can resolve it;
//   - updates what changed (a driver upgrade: driver_version), acting as the
//     node, and heartbeats every node (GET /v1/nodes/ping with Node-Id);
//     every Refresh it reads each node back instead, to set right what
//     someone else changed;
//   - deletes the node of a GPU that is gone. A node that holds a job
//     cannot be deleted by an agent (409): it gets no more heartbeats, so
//     it goes stale, and the agent deletes it once the job released it;
//   - registers again a node the server no longer lets it act as (deleted
//     by an admin: 404 or 403 on a heartbeat).
//
// When nvidia-smi exists but fails, the pass changes nothing and sends no
// heartbeat: the agent cannot vouch for GPUs it cannot see, and it never
// deletes nodes on a failed discovery. While the server cannot be used (no
// answer, 401, 429, 5xx) the agent backs off with jitter and recovers by
// itself. It remembers its nodes' pks in a state file, so a restart
// creates no duplicates and still deletes the nodes of GPUs removed while
// it was down.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// API is what the agent needs of the registry's HTTP API. The agent
// declares it; cmd/registryd implements it with the project's Go client.
//
// The server's refusals come back as errors wrapping the registry's
// sentinels: registry.ErrNotFound (404), registry.ErrForbidden (403),
// registry.ErrConflict (409, a *registry.Error whose ExistingPK names the
// node that holds the pair when the server said so) and
// registry.ErrInvalid (400). Any other error (no answer, 401, 429, 5xx)
// means the server cannot be used right now.
type API interface {
	// CreateNode registers a node (POST /v1/nodes/create); adopted reports
	// that the server handed over an imported node (200) rather than
	// creating one (201).
	CreateNode(ctx context.Context, spec registry.NodeSpec) (n registry.Node, adopted bool, err error)
	// GetNodeAs reads node pk acting as it (Node-Id: pk): it proves the
	// agent may act as the node, and is its heartbeat.
	GetNodeAs(ctx context.Context, pk int64) (registry.Node, error)
	// PatchNodeAs changes node pk acting as it (a JSON merge patch).
	PatchNodeAs(ctx context.Context, pk int64, patch registry.NodePatch) (registry.Node, error)
	// DeleteNodeAs deletes node pk acting as it.
	DeleteNodeAs(ctx context.Context, pk int64) error
	// Ping is node pk's heartbeat: GET /v1/nodes/ping with Node-Id: pk.
	Ping(ctx context.Context, pk int64) error
	// HardwareByName returns the pk of the hardware generation named name.
	HardwareByName(ctx context.Context, name string) (pk int64, found bool, err error)
}

// Config is the agent's setup. API, StatePath and one of IP or Server
// are required; the rest have defaults.
type Config struct {
	API API
	// Server is the registry's base URL; the agent's address is the local
	// address of the route to its host, unless IP is set.
	Server *url.URL
	// IP is this host's address in the registry (REGISTRY_AGENT_IP).
	IP string
	// Fabric, when not "", is this host's fabric (REGISTRY_AGENT_FABRIC):
	// set on its nodes unless their cloud import names one.
	Fabric string
	// Labels are set on this host's nodes (REGISTRY_AGENT_LABELS); the
	// nodes' other labels stay.
	Labels registry.Labels
	// Interval is the time between passes (REGISTRY_AGENT_INTERVAL); 10s
	// when zero.
	Interval time.Duration
	// StatePath is the file that remembers the nodes' pks
	// (REGISTRY_AGENT_STATE).
	StatePath string
	// Path is the PATH nvidia-smi is looked up in, on every pass (a driver
	// installed later is found).
	Path string
	// MemInfo is the file the host's memory is read from; /proc/meminfo
	// when empty.
	MemInfo string
	// NvidiaSMITimeout bounds one run of nvidia-smi; 30s when zero.
	NvidiaSMITimeout time.Duration
	// PassTimeout bounds one pass; 1m when zero.
	PassTimeout time.Duration
	// BackoffMin and BackoffMax space the passes while the server cannot
	// be used: the first wait is BackoffMin (1s when zero), each next one
	// twice the last, up to BackoffMax (the larger of Interval and 1m when
	// zero); each wait is drawn at random from its upper half, so agents
	// that lost the server together do not come back together.
	BackoffMin, BackoffMax time.Duration
	// HardwareRecheck is how long a GPU model that names no hardware
	// generation is not looked up again; 5m when zero.
	HardwareRecheck time.Duration
	// Refresh is how often the agent reads its nodes again (acting as
	// them, in place of that pass's ping) to set right what someone else
	// changed; 5m when zero.
	Refresh time.Duration
	Logger  *slog.Logger
	// AfterPass, if set, is called with the report of every pass (tests).
	AfterPass func(Report)
}

// Report says what a pass did.
type Report struct {
	// Nodes are the nodes the agent acts as after the pass, by (ip, index).
	Nodes map[Key]int64
	// Problems are the nodes the agent could not register or delete this
	// pass, and why.
	Problems map[Key]string
	// Err is what ended the pass early (failed discovery, the server), or
	// nil.
	Err error
	// ServerDown says Err was the server: the next pass follows a backoff.
	ServerDown bool
	// Wait is the time until the next pass.
	Wait time.Duration
}

// Agent is the loop of one host. It is not safe for concurrent use: Run
// (or RunOnce) from one goroutine.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	nodes map[Key]*tracked
	// problems are what keeps a node from being registered or deleted,
	// as last logged: each is logged when it appears, changes or ends.
	problems map[Key]string
	hw       map[string]hwEntry
	warned   map[string]bool
	dirty    bool   // nodes changed since the state file was written
	failing  string // the error of the last pass, if it failed
	loaded   bool
	backoff  lifecycle.Backoff
}

// tracked is a node the agent acts as.
type tracked struct {
	pk int64
	// node is the server's last answer about it; nil until the agent has
	// read it (a pk from the state file is checked before it is trusted).
	node *registry.Node
	// read is when node was last answered.
	read time.Time
}

type hwEntry struct {
	pk    int64
	found bool
	at    time.Time
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.API == nil:
		return nil, errors.New("agent: no API")
	case cfg.StatePath == "":
		return nil, errors.New("agent: no state file")
	case cfg.IP == "" && cfg.Server == nil:
		return nil, errors.New("agent: neither an address nor a server to find it from")
	}
	if cfg.IP != "" {
		ip, err := registry.CanonicalIP(cfg.IP)
		if err != nil {
			return nil, fmt.Errorf("agent: address %q: %w", cfg.IP, err)
		}
		cfg.IP = ip
	}
	cfg.Interval = cmp.Or(cfg.Interval, 10*time.Second)
	cfg.MemInfo = cmp.Or(cfg.MemInfo, "/proc/meminfo")
	cfg.NvidiaSMITimeout = cmp.Or(cfg.NvidiaSMITimeout, 30*time.Second)
	cfg.PassTimeout = cmp.Or(cfg.PassTimeout, time.Minute)
	cfg.BackoffMin = cmp.Or(cfg.BackoffMin, time.Second)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, max(cfg.Interval, time.Minute))
	cfg.HardwareRecheck = cmp.Or(cfg.HardwareRecheck, 5*time.Minute)
	cfg.Refresh = cmp.Or(cfg.Refresh, 5*time.Minute)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Agent{
		cfg:      cfg,
		log:      cfg.Logger,
		nodes:    map[Key]*tracked{},
		problems: map[Key]string{},
		hw:       map[string]hwEntry{},
		warned:   map[string]bool{},
		backoff:  lifecycle.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax},
	}, nil
}

// Run passes every Interval until ctx ends, then returns nil: a stop
// (SIGTERM) is the agent's normal end. The nodes stay registered; the
// next start takes them up again.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent started", "interval", a.cfg.Interval.String(), "state", a.cfg.StatePath)
	for {
		rep := a.RunOnce(ctx)
		if ctx.Err() != nil {
			a.log.Info("agent stopped")
			return nil
		}
		if !lifecycle.Sleep(ctx, rep.Wait) {
			a.log.Info("agent stopped")
			return nil
		}
	}
}

// RunOnce is one pass: discover, register, update, heartbeat, retire.
func (a *Agent) RunOnce(ctx context.Context) (rep Report) {
	if !a.loaded {
		a.loadState()
	}
	pctx, cancel := context.WithTimeout(ctx, a.cfg.PassTimeout)
	defer cancel()
	rep.Problems = map[Key]string{}
	defer func() {
		a.saveState()
		rep.Nodes = a.pks()
		switch {
		case rep.ServerDown:
			rep.Wait = jitter(a.backoff.Next())
		default:
			a.backoff.Reset()
			rep.Wait = a.cfg.Interval
		}
		a.logOutcome(ctx, rep)
		if a.cfg.AfterPass != nil {
			a.cfg.AfterPass(rep)
		}
	}()

	want, down, err := a.discover(pctx)
	if err != nil {
		rep.Err, rep.ServerDown = err, down
		return rep
	}
	for _, k := range slices.SortedFunc(maps.Keys(want), CompareKeys) {
		if err := a.reconcile(pctx, k, want[k]); err != nil {
			rep.Err, rep.ServerDown = err, true
			return rep
		}
	}
	// Nodes at another address (REGISTRY_AGENT_IP changed, or the route
	// did) are retired only once every node at this address is
	// registered: a mistyped address, or one the token is not bound to,
	// must not cost the host the nodes it has.
	settled := true
	for k := range want {
		if a.nodes[k] == nil || a.problems[k] != "" {
			settled = false
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(a.nodes), CompareKeys) {
		if _, ok := want[k]; ok {
			continue
		}
		if !settled && !sameIP(k, want) {
			a.warnOnce(fmt.Sprintf("keeping the nodes at %s until this host's nodes at its new address are registered", k.IP))
			continue
		}
		if err := a.retire(pctx, k); err != nil {
			rep.Err, rep.ServerDown = err, true
			return rep
		}
	}
	// A node that is neither wanted nor had has no problem left.
	for k := range a.problems {
		if _, ok := want[k]; !ok && a.nodes[k] == nil {
			a.setProblem(k, "")
		}
	}
	maps.Copy(rep.Problems, a.problems)
	return rep
}

// sameIP reports whether k is at the address of the wanted nodes.
func sameIP(k Key, want map[Key]desired) bool {
	for w := range want {
		return w.IP == k.IP
	}
	return false
}

// logOutcome logs a failed pass, or the first good one after failures. A
// discovery that keeps failing the same way is logged once, then at debug
// level; the server being down is logged on every retry, which the backoff
// spaces out.
func (a *Agent) logOutcome(ctx context.Context, rep Report) {
	switch {
	case ctx.Err() != nil:
	case rep.Err == nil && a.failing != "":
		a.log.Info("pass succeeded again", "was", a.failing)
		a.failing = ""
	case rep.ServerDown:
		a.log.Warn("the registry cannot be used; retrying", "err", rep.Err, "in", rep.Wait.Round(time.Millisecond).String())
		a.failing = problemKey(rep.Err.Error())
	case rep.Err != nil && problemKey(rep.Err.Error()) == a.failing:
		a.log.Debug("pass failed again; nothing changed, no heartbeats sent", "err", rep.Err)
	case rep.Err != nil:
		a.log.Error("pass failed; nothing changed, no heartbeats sent", "err", rep.Err, "in", rep.Wait.String())
		a.failing = problemKey(rep.Err.Error())
	}
}

// discover returns the nodes this host should have, by (ip, index). down
// says the error was about reaching the server (its address, a hardware
// lookup), so the pass backs off.
func (a *Agent) discover(ctx context.Context) (want map[Key]desired, down bool, err error) {
	ip := a.cfg.IP
	if ip == "" {
		if ip, err = RouteIP(ctx, a.cfg.Server); err != nil {
			return nil, true, err
		}
	}
	mem, err := HostMemory(a.cfg.MemInfo)
	if err != nil {
		return nil, false, err
	}
	gpus, err := DiscoverGPUs(ctx, a.cfg.Path, a.cfg.NvidiaSMITimeout)
	switch {
	case errors.Is(err, errNoNvidiaSMI):
		a.warnOnce("nvidia-smi is not on PATH: this is a CPU-only host, one node with index 0")
	case err != nil:
		return nil, false, fmt.Errorf("discover GPUs: %w", err)
	}
	want = map[Key]desired{}
	var fabric *string
	if a.cfg.Fabric != "" {
		fabric = &a.cfg.Fabric
	}
	if len(gpus) == 0 {
		want[Key{IP: ip, Index: 0}] = desired{NodeSpec: registry.NodeSpec{IP: ip, Index: 0, CPUMem: mem,
			Fabric: fabric, Labels: a.cfg.Labels}}
		return want, false, nil
	}
	for _, g := range gpus {
		hw, err := a.hardware(ctx, g.Name)
		if err != nil {
			return nil, true, err
		}
		if g.Memory == nil {
			a.warnOnce(fmt.Sprintf("nvidia-smi reports no memory for GPU %d; its node has gpu_mem null", g.Index))
		}
		if g.DriverVersion == "" {
			a.warnOnce(fmt.Sprintf("nvidia-smi reports no driver version for GPU %d", g.Index))
		}
		want[Key{IP: ip, Index: g.Index}] = desired{NodeSpec: registry.NodeSpec{IP: ip, Index: g.Index, CPUMem: mem,
			DriverVersion: g.DriverVersion, HardwareGeneration: hw, GPUMem: g.Memory,
			GPUModel: nonEmpty(g.Name), GPUUUID: nonEmpty(g.UUID), Fabric: fabric, Labels: a.cfg.Labels},
			hardwareUnknown: hw == nil}
	}
	return want, false, nil
}

// hardware maps a GPU model to the hardware generation of that name, or
// nil when the server knows none. Found generations are remembered; a
// model without one is looked up again after HardwareRecheck, so one an
// admin creates later is picked up.
func (a *Agent) hardware(ctx context.Context, product string) (*int64, error) {
	if product == "" {
		return nil, nil
	}
	if e, ok := a.hw[product]; ok && (e.found || time.Since(e.at) < a.cfg.HardwareRecheck) {
		if !e.found {
			return nil, nil
		}
		return &e.pk, nil
	}
	names := hardwareNames(product)
	for _, name := range names {
		pk, found, err := a.cfg.API.HardwareByName(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("look up hardware generation %q: %w", name, err)
		}
		if found {
			a.hw[product] = hwEntry{pk: pk, found: true}
			a.log.Info("GPU model maps to a hardware generation", "gpu", product, "hardware_generation", pk, "name", name)
			return &pk, nil
		}
	}
	if _, seen := a.hw[product]; !seen {
		a.log.Warn("no hardware generation is named after this GPU model; its nodes have hardware_generation null until an admin creates one",
			"gpu", product, "names", strings.Join(names, ", "), "recheck", a.cfg.HardwareRecheck.String(),
			"hint", fmt.Sprintf(`POST /v1/hardware/create {"name":%q}`, names[len(names)-1]))
	}
	a.hw[product] = hwEntry{at: time.Now()}
	return nil, nil
}

// desired is what a node should be.
type desired struct {
	registry.NodeSpec
	// hardwareUnknown says the GPU's model names no hardware generation
	// the server knows: HardwareGeneration is nil for want of knowing,
	// not because there is none (as on a CPU-only host).
	hardwareUnknown bool
}

// gone reports whether the server says the agent no longer acts as a
// node: it does not exist (404) or is not the agent's to act as (403, the
// answer an agent gets for a node that does not exist).
func gone(err error) bool {
	return errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrForbidden)
}

// refused reports whether err is the server refusing this one request
// (the other requests of the pass may still succeed), as opposed to the
// server not being usable at all.
func refused(err error) bool {
	return gone(err) || errors.Is(err, registry.ErrConflict) || errors.Is(err, registry.ErrInvalid) ||
		errors.Is(err, registry.ErrPrecondition)
}

// reconcile brings the node at k to want and heartbeats it. It returns
// only errors that mean the server cannot be used; what the server
// refuses for this node alone is logged as the node's problem.
func (a *Agent) reconcile(ctx context.Context, k Key, want desired) error {
	// A node deleted under the agent (an admin) is registered again at
	// once; once only, so a pass stays bounded.
	for attempt := 0; ; attempt++ {
		lost, err := a.converge(ctx, k, want)
		if err != nil || !lost || attempt == 1 {
			return err
		}
	}
}

// converge is one try of reconcile. lost says the server no longer lets
// the agent act as the node it had for k, which it has now forgotten.
func (a *Agent) converge(ctx context.Context, k Key, want desired) (lost bool, err error) {
	t := a.nodes[k]
	beat := false // whether this pass has heartbeated the node already
	if t != nil && (t.node == nil || time.Since(t.read) >= a.cfg.Refresh) {
		// A pk from the state file: trusted once the server says the
		// agent acts as it, and that it is still the node at k. A node
		// the agent has is read again now and then, so that what someone
		// else changed (an admin's PATCH of driver_version) is set right.
		if t, err = a.verify(ctx, k, t); err != nil {
			return false, err
		}
		beat = t != nil
	}
	if t == nil {
		var problem string
		if t, beat, problem, err = a.register(ctx, k, want); err != nil {
			return false, err
		}
		if t == nil {
			a.setProblem(k, problem)
			return false, nil
		}
	}
	problem := ""
	if p, fields := patchFor(*t.node, want); len(fields) > 0 {
		n, err := a.cfg.API.PatchNodeAs(ctx, t.pk, p)
		switch {
		case gone(err):
			a.lose(k, t, err)
			return true, nil
		case refused(err):
			a.refusedInput(err)
			problem = fmt.Sprintf("updating node %d (%s) was refused: %v", t.pk, strings.Join(fields, ", "), err)
		case err != nil:
			return false, fmt.Errorf("update node %d: %w", t.pk, err)
		default:
			a.log.Info("updated node", "pk", t.pk, "ip", k.IP, "index", k.Index, "fields", strings.Join(fields, ", "),
				"driver_version", n.DriverVersion)
			t.node, t.read, beat = &n, time.Now(), true
		}
	}
	if !beat {
		err := a.cfg.API.Ping(ctx, t.pk)
		switch {
		case gone(err):
			a.lose(k, t, err)
			return true, nil
		case refused(err):
			problem = fmt.Sprintf("heartbeat of node %d was refused: %v", t.pk, err)
		case err != nil:
			return false, fmt.Errorf("heartbeat node %d: %w", t.pk, err)
		}
	}
	a.setProblem(k, problem)
	return false, nil
}

// verify reads node t.pk acting as it, and returns t with the node filled
// in, or nil when the agent no longer has it (it is forgotten then).
func (a *Agent) verify(ctx context.Context, k Key, t *tracked) (*tracked, error) {
	n, err := a.cfg.API.GetNodeAs(ctx, t.pk)
	switch {
	case gone(err) || refused(err):
		a.lose(k, t, err)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read node %d: %w", t.pk, err)
	case n.IP != k.IP || n.Index != k.Index:
		a.log.Warn("the state file's node is another node now; forgetting it", "pk", t.pk, "ip", k.IP, "index", k.Index,
			"node_ip", n.IP, "node_index", n.Index)
		a.forget(k)
		return nil, nil
	}
	t.node, t.read = &n, time.Now()
	return t, nil
}

// register creates the node at k, or takes up the one the server has
// there if the agent may act as it. It returns the node now tracked and
// whether that was a heartbeat, or nil and what keeps it from
// registering.
func (a *Agent) register(ctx context.Context, k Key, want desired) (t *tracked, beat bool, problem string, err error) {
	n, adopted, err := a.cfg.API.CreateNode(ctx, want.NodeSpec)
	if err == nil {
		t = a.track(k, n)
		if adopted {
			a.log.Info("adopted the imported node", "pk", n.PK, "ip", k.IP, "index", k.Index, "source", n.Source)
		} else {
			a.log.Info("registered node", "pk", n.PK, "ip", k.IP, "index", k.Index)
		}
		return t, false, "", nil
	}
	var re *registry.Error
	if errors.Is(err, registry.ErrConflict) && errors.As(err, &re) && re.ExistingPK > 0 {
		// The pair is taken. If the agent may act as that node, it is its
		// own from before (a lost or corrupt state file): take it back.
		n, gerr := a.cfg.API.GetNodeAs(ctx, re.ExistingPK)
		switch {
		case gerr == nil && n.IP == k.IP && n.Index == k.Index:
			a.log.Info("found its own node registered before; taking it up", "pk", n.PK, "ip", k.IP, "index", k.Index)
			return a.track(k, n), true, "", nil
		case gerr == nil:
			return nil, false, fmt.Sprintf("%s is taken by node %d, which is now at %s/%d", k, re.ExistingPK, n.IP, n.Index), nil
		case gone(gerr) || refused(gerr):
			return nil, false, fmt.Sprintf("%s is held by node %d of another principal; an admin must delete it (DELETE /v1/nodes/%d) or give this agent that principal's token", k, re.ExistingPK, re.ExistingPK), nil
		default:
			return nil, false, "", fmt.Errorf("read node %d: %w", re.ExistingPK, gerr)
		}
	}
	if refused(err) {
		a.refusedInput(err)
		return nil, false, fmt.Sprintf("registering %s was refused: %v", k, err), nil
	}
	return nil, false, "", fmt.Errorf("register %s: %w", k, err)
}

// retire deletes the node of a GPU that is gone, acting as it.
func (a *Agent) retire(ctx context.Context, k Key) error {
	t := a.nodes[k]
	if t.node == nil {
		var err error
		if t, err = a.verify(ctx, k, t); err != nil || t == nil {
			a.setProblem(k, "")
			return err
		}
	}
	err := a.cfg.API.DeleteNodeAs(ctx, t.pk)
	switch {
	case err == nil:
		a.log.Info("the GPU is gone; deleted its node", "pk", t.pk, "ip", k.IP, "index", k.Index)
		a.forget(k)
		a.setProblem(k, "")
	case gone(err):
		a.log.Info("the GPU is gone, and so is its node", "pk", t.pk, "ip", k.IP, "index", k.Index, "err", err)
		a.forget(k)
		a.setProblem(k, "")
	case errors.Is(err, registry.ErrConflict):
		a.setProblem(k, fmt.Sprintf("the GPU is gone but node %d cannot be deleted (%v); it gets no more heartbeats and is deleted once released", t.pk, err))
	case refused(err):
		a.setProblem(k, fmt.Sprintf("the GPU is gone but deleting node %d was refused: %v", t.pk, err))
	default:
		return fmt.Errorf("delete node %d: %w", t.pk, err)
	}
	return nil
}

// patchFor is the change that makes node n what the host reports, and the
// names of the fields it sets. The driver version is always the agent's
// to report. Memory and hardware generation are too, for a node the agent
// registered; for an imported node they are its provider's, and the agent
// leaves them alone (the import would only set them back). A GPU model
// that names no generation leaves the node's generation as it is (an
// admin may have set one by hand); a CPU-only host has none.
//
// What nvidia-smi names (gpu_model, gpu_uuid) is the agent's on every node
// it owns; its labels are set, never removed (an admin's stay); its fabric
// is set where no cloud import names one, and never cleared (an admin may
// have set one).
func patchFor(n registry.Node, want desired) (p registry.NodePatch, fields []string) {
	if n.DriverVersion != want.DriverVersion {
		p.DriverVersion = registry.Optional[string]{Set: true, Value: want.DriverVersion}
		fields = append(fields, "driver_version")
	}
	// On a node registered through the API the agent's word is the whole
	// truth (a GPU gone clears its model); on an imported one it only adds
	// what it knows.
	set := func(field string, o *registry.Optional[string], cur, want *string) {
		switch {
		case want == nil && cur != nil && n.Source == "api" && field != "fabric":
			*o = registry.Optional[string]{Set: true, Null: true}
		case want == nil || cur != nil && *cur == *want:
			return
		default:
			*o = registry.Optional[string]{Set: true, Value: *want}
		}
		fields = append(fields, field)
	}
	set("gpu_model", &p.GPUModel, n.GPUModel, want.GPUModel)
	set("gpu_uuid", &p.GPUUUID, n.GPUUUID, want.GPUUUID)
	if n.Source == "api" || n.Fabric == nil {
		set("fabric", &p.Fabric, n.Fabric, want.Fabric)
	}
	for k, v := range want.Labels.All() {
		if cur, ok := n.Labels.Get(k); !ok || cur != v {
			if p.Labels.Values == nil {
				p.Labels = registry.LabelPatch{Set: true, Values: map[string]*string{}}
				fields = append(fields, "labels")
			}
			p.Labels.Values[k] = &v
		}
	}
	if n.Source != "api" {
		return p, fields
	}
	if n.CPUMem != want.CPUMem {
		p.CPUMem = registry.Optional[int64]{Set: true, Value: want.CPUMem}
		fields = append(fields, "cpu_mem")
	}
	if !equalPtr(n.GPUMem, want.GPUMem) {
		p.GPUMem = optional(want.GPUMem)
		fields = append(fields, "gpu_mem")
	}
	if !want.hardwareUnknown && !equalPtr(n.HardwareGeneration, want.HardwareGeneration) {
		p.HardwareGeneration = optional(want.HardwareGeneration)
		fields = append(fields, "hardware_generation")
	}
	return p, fields
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func equalPtr(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func optional(v *int64) registry.Optional[int64] {
	if v == nil {
		return registry.Optional[int64]{Set: true, Null: true}
	}
	return registry.Optional[int64]{Set: true, Value: *v}
}

// refusedInput forgets the hardware generations found when the server
// refuses what the agent sent: the likeliest cause is a generation
// deleted since it was looked up.
func (a *Agent) refusedInput(err error) {
	if errors.Is(err, registry.ErrInvalid) {
		clear(a.hw)
	}
}

func (a *Agent) track(k Key, n registry.Node) *tracked {
	t := &tracked{pk: n.PK, node: &n, read: time.Now()}
	a.nodes[k] = t
	a.dirty = true
	return t
}

func (a *Agent) forget(k Key) {
	delete(a.nodes, k)
	a.dirty = true
}

// lose forgets the node at k, which the server no longer lets the agent
// act as: an admin deleted it, most likely.
func (a *Agent) lose(k Key, t *tracked, err error) {
	a.log.Warn("the registry no longer lets the agent act as its node (deleted?); registering it again", "pk", t.pk,
		"ip", k.IP, "index", k.Index, "err", err)
	a.forget(k)
}

// setProblem records what keeps the node at k from being as it should
// ("" for nothing), logging it when it appears, changes or ends, not on
// every pass.
func (a *Agent) setProblem(k Key, problem string) {
	old := a.problems[k]
	switch {
	case problemKey(problem) == problemKey(old):
	case problem == "":
		delete(a.problems, k)
		a.log.Info("resolved", "ip", k.IP, "index", k.Index, "was", old)
	default:
		a.problems[k] = problem
		a.log.Error(problem, "ip", k.IP, "index", k.Index)
	}
}

// requestIDs matches the id of a request in the client's errors
// ("[request 4f2a…]"): every answer has its own, so two reports of the
// same problem differ by it.
var requestIDs = regexp.MustCompile(` ?\[request [^\]]*\]`)

// problemKey is what two reports of one problem have in common: the
// message without request ids. A problem is logged again only when its
// key changes.
func problemKey(msg string) string { return requestIDs.ReplaceAllString(msg, "") }

func (a *Agent) warnOnce(msg string) {
	if !a.warned[msg] {
		a.warned[msg] = true
		a.log.Warn(msg)
	}
}

func (a *Agent) pks() map[Key]int64 {
	out := make(map[Key]int64, len(a.nodes))
	for k, t := range a.nodes {
		out[k] = t.pk
	}
	return out
}

// loadState takes up the nodes of the state file. A file that cannot be
// read is logged and replaced at the end of the first pass.
func (a *Agent) loadState() {
	a.loaded = true
	nodes, err := loadState(a.cfg.StatePath)
	if err != nil {
		a.log.Warn("cannot read the state file; starting afresh (nodes registered before are found again through the registry)",
			"state", a.cfg.StatePath, "err", err)
		a.dirty = true
	}
	for k, pk := range nodes {
		a.nodes[k] = &tracked{pk: pk}
	}
	if len(nodes) > 0 {
		a.log.Info("state loaded", "state", a.cfg.StatePath, "nodes", len(nodes))
	}
}

func (a *Agent) saveState() {
	if !a.dirty {
		return
	}
	if err := saveState(a.cfg.StatePath, a.pks()); err != nil {
		// Kept dirty: the next pass tries again.
		a.warnOnce("cannot write the state file: " + err.Error())
		return
	}
	a.dirty = false
}

// jitter draws a wait from the upper half of d.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d - rand.N(d/2)
}
