package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// filterOptions are the node filters of the API as flags: list (and its
// watch), cordon, uncordon, drain, claim and fabrics list share them.
type filterOptions struct {
	free      bool
	state     string
	fabric    string
	selector  string
	ip        string
	job       int64
	hardware  string
	owner     string
	minGPUMem string
}

// filterFlags picks which filters a command offers.
type filterFlags uint8

const (
	withState  filterFlags = 1 << iota // --free, --state
	withJob                            // --job (a claim's --job is its own)
	allFilters = withState | withJob
)

// nodeStates are the states --state takes.
var nodeStates = []client.NodeState{client.StateFree, client.StateBusy, client.StateCordoned,
	client.StateDraining, client.StateLost, client.StateGone}

func (o *filterOptions) add(fs *flag.FlagSet, which filterFlags) {
	if which&withState != 0 {
		fs.BoolVar(&o.free, "free", false, "only free nodes (state free: what a claim would take)")
		fs.StringVar(&o.state, "state", "", "only nodes in one of these `STATES`, comma-separated: free, busy, cordoned, draining, lost, gone")
	}
	fs.StringVar(&o.fabric, "fabric", "", "only nodes of this `FABRIC`")
	fs.StringVar(&o.selector, "selector", "", "only nodes whose labels match this label `SELECTOR` (team=research,tier in (gold,silver))")
	fs.StringVar(&o.ip, "ip", "", "only nodes of this host `ADDR`, or of the hosts in a CIDR (10.0.0.0/24)")
	if which&withJob != 0 {
		fs.Int64Var(&o.job, "job", 0, "only nodes this `JOB` holds")
	}
	fs.StringVar(&o.hardware, "hardware", "", "only nodes of this hardware generation: its `PK` or name")
	fs.StringVar(&o.owner, "owner", "", "only nodes this agent `PRINCIPAL` registered")
	fs.StringVar(&o.minGPUMem, "min-gpu-mem", "", "only nodes with at least this much GPU memory: bytes, or `SIZE` with a unit (80Gi)")
}

// any says whether a filter is set.
func (o *filterOptions) any() bool {
	return o.free || o.state != "" || o.fabric != "" || o.selector != "" || o.ip != "" || o.job != 0 ||
		o.hardware != "" || o.owner != "" || o.minGPUMem != ""
}

// states are --state's states.
func (o *filterOptions) states() ([]client.NodeState, error) {
	var out []client.NodeState
	for s := range strings.SplitSeq(o.state, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(nodeStates, client.NodeState(s)) {
			return nil, fmt.Errorf("--state: %q is not a state (free, busy, cordoned, draining, lost, gone)", s)
		}
		out = append(out, client.NodeState(s))
	}
	return out, nil
}

// check finds the mistakes the flags alone show: a usage error.
func (o *filterOptions) check() error {
	if _, err := o.states(); err != nil {
		return err
	}
	if o.minGPUMem != "" {
		if _, err := parseBytes(o.minGPUMem); err != nil {
			return fmt.Errorf("--min-gpu-mem: %v", err)
		}
	}
	if o.job < 0 {
		return errors.New("--job: job ids are positive")
	}
	if o.ip != "" {
		// The server's own check: 10.0.0.5/24 is refused, not masked.
		if _, err := registry.CanonicalIPFilter(o.ip); err != nil {
			return fmt.Errorf("--ip %q: %v", o.ip, err)
		}
	}
	if _, err := registry.ParseSelector(o.selector); err != nil {
		return fmt.Errorf("--selector %q: %v", o.selector, err)
	}
	return nil
}

// filter is the API's node filter of the flags. A hardware generation
// named by name is looked up (one that does not exist is a not-found
// error).
func (o *filterOptions) filter(ctx context.Context, c *client.Client) (client.NodeFilter, error) {
	var f client.NodeFilter
	if o.free {
		f.Free = client.Ptr(true)
	}
	if st, _ := o.states(); len(st) > 0 {
		f.State = client.States(st...)
	}
	if o.fabric != "" {
		f.Fabric = &o.fabric
	}
	if o.selector != "" {
		f.Selector = &o.selector
	}
	if o.ip != "" {
		f.IP = &o.ip
	}
	if o.job != 0 {
		f.CurrentJob = &o.job
	}
	if o.owner != "" {
		f.Owner = &o.owner
	}
	if o.minGPUMem != "" {
		n, _ := parseBytes(o.minGPUMem)
		f.MinGPUMem = &n
	}
	if o.hardware != "" {
		pk, err := hardwarePK(ctx, c, o.hardware)
		if err != nil {
			return f, err
		}
		f.HardwareGeneration = &pk
	}
	return f, nil
}

// hardwarePK is the pk of the hardware generation named by pk or name.
func hardwarePK(ctx context.Context, c *client.Client, s string) (int64, error) {
	if pk, err := strconv.ParseInt(s, 10, 64); err == nil && pk > 0 {
		return pk, nil
	}
	hw, err := c.ListHardware(ctx, client.HardwareFilter{Name: &s})
	if err != nil {
		return 0, err
	}
	if len(hw) == 0 {
		return 0, notFound(fmt.Errorf("no hardware generation is named %q", s))
	}
	return hw[0].PK, nil
}

// matcher is f as the registry's own filter, whose Match is the
// filters' one meaning: a watch applies it to each node the stream
// brings, as the server applies it to a list.
func matcher(f client.NodeFilter) (registry.NodeFilter, error) {
	m := registry.NodeFilter{Free: f.Free, CurrentJob: f.CurrentJob, HardwareGeneration: f.HardwareGeneration,
		MinGPUMem: f.MinGPUMem, IP: f.IP, Fabric: f.Fabric, Owner: f.Owner}
	if f.State != nil {
		states, _ := f.State.AsNodeStateFilter1()
		for _, st := range states {
			m.State = append(m.State, registry.State(st))
		}
	}
	if f.Selector != nil {
		sel, err := registry.ParseSelector(*f.Selector)
		if err != nil {
			return m, fmt.Errorf("--selector: %v", err)
		}
		m.Selector = sel
	}
	return m, m.Normalize()
}

// registryNode is the node of an API document, as Match reads it.
func registryNode(doc []byte) (registry.Node, error) {
	var n registry.Node
	err := json.Unmarshal(doc, &n)
	return n, err
}

// cordonOf is the cordon of the nodes f selects.
func cordonOf(f client.NodeFilter, reason string) client.NodeCordon {
	return client.NodeCordon{Reason: reason, Free: f.Free, State: f.State, Fabric: f.Fabric, Selector: f.Selector,
		IP: f.IP, CurrentJob: f.CurrentJob, Owner: f.Owner, MinGPUMem: f.MinGPUMem, HardwareGeneration: f.HardwareGeneration}
}

// fabricFilterOf is the fabrics list filter of f.
func fabricFilterOf(f client.NodeFilter) client.FabricListFilter {
	return client.FabricListFilter{Free: f.Free, State: f.State, Fabric: f.Fabric, Selector: f.Selector,
		IP: f.IP, CurrentJob: f.CurrentJob, Owner: f.Owner, MinGPUMem: f.MinGPUMem, HardwareGeneration: f.HardwareGeneration}
}

// parsePKs reads node pks given as arguments.
func parsePKs(args []string) ([]int64, error) {
	var pks []int64
	for _, a := range args {
		pk, err := strconv.ParseInt(a, 10, 64)
		if err != nil || pk <= 0 {
			return nil, fmt.Errorf("%q is not a node pk (a positive number)", a)
		}
		pks = append(pks, pk)
	}
	return pks, nil
}
