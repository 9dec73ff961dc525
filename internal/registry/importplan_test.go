package registry

import "testing"

func TestImportPlanDecide(t *testing.T) {
	gpu, hw := ptr[int64](80), int64(3)
	region := mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1"})
	want := ImportedNode{ExternalID: "h1", IP: "10.0.0.1", Index: 0, CPUMem: 100, GPUMem: gpu, GPUModel: "H100", State: "RUNNING", Running: true,
		Fabric: "fab-1", Labels: region}
	p := ImportPlan{Source: "scp", Want: map[ImportKey]ImportedNode{{"10.0.0.1", 0}: want}, Skipped: []string{"h9"}, HW: map[string]int64{"H100": hw}}
	current := Node{PK: 1, IP: "10.0.0.1", Index: 0, CPUMem: 100, GPUMem: gpu, HardwareGeneration: &hw, Source: "scp",
		Schedulable: true, ProviderState: ptr("RUNNING"), ExternalID: ptr("h1"),
		GPUModel: ptr("H100"), Fabric: ptr("fab-1"), Labels: region}
	// What an agent owns stays: its GPU model (the driver's exact name)
	// and the node's own labels.
	agents := current
	agents.Owner, agents.GPUModel = ptr("agent-1"), ptr("NVIDIA H100 80GB HBM3")
	agents.Labels = mustLabels(t, map[string]string{"scp.registryd.io/region": "kr-west1", "team": "ml"})
	unowned := current
	unowned.GPUModel = ptr("NVIDIA H100 80GB HBM3")
	moved := current
	moved.Fabric = ptr("fab-0")
	relabelled := agents
	relabelled.Labels = mustLabels(t, map[string]string{"scp.registryd.io/region": "old", "scp.registryd.io/gone": "x", "team": "ml"})
	changed := current
	changed.CPUMem = 50
	other := current
	other.Source = "e2e"
	api := current
	api.Source, api.ExternalID, api.ProviderState = "api", nil, nil
	vanished := Node{PK: 2, IP: "10.0.0.2", Source: "scp", Schedulable: true, ExternalID: ptr("h2"), ProviderState: ptr("RUNNING")}
	busy := vanished
	busy.CurrentJob = ptr[int64](7)
	markedGone := busy
	markedGone.Schedulable, markedGone.ProviderState = false, ptr(ProviderGone)
	skipped := vanished
	skipped.ExternalID = ptr("h9/gpu3")
	foreign := vanished
	foreign.Source = "e2e"
	for _, tc := range []struct {
		name   string
		n      Node
		want   ImportDecisionKind
		writes bool
	}{
		{"holds what the provider says", current, ImportUnchanged, false},
		{"an agent's model and labels stay", agents, ImportUnchanged, false},
		{"an unowned node's model follows the provider", unowned, ImportUpdateNode, true},
		{"the host moved to another fabric", moved, ImportUpdateNode, true},
		{"the provider's labels changed", relabelled, ImportUpdateNode, true},
		{"a field differs", changed, ImportUpdateNode, true},
		{"an admin's node at the pair is taken over", api, ImportUpdateNode, true},
		{"another provider's pair", other, ImportConflict, false},
		{"vanished and free", vanished, ImportRemove, true},
		{"vanished, holding a job", busy, ImportMarkGone, true},
		{"vanished, holding a job, already gone", markedGone, ImportKeptBusy, false},
		{"vanished, but its host was skipped", skipped, ImportKeptSkipped, false},
		{"another provider's node not in the inventory", foreign, ImportNothing, false},
	} {
		d := p.Decide(tc.n)
		if d.Kind != tc.want || d.Writes() != tc.writes {
			t.Errorf("%s: %+v, want kind %d (writes %v)", tc.name, d, tc.want, tc.writes)
		}
	}
	if d := p.Decide(changed); d.Update.PK != 1 || d.Update.CPUMem != 100 || *d.Update.HW != hw || !d.Update.Schedulable {
		t.Errorf("update %+v", d.Update)
	}
	if d := p.Decide(relabelled); d.Update.Labels != agents.Labels || *d.Update.GPUModel != *agents.GPUModel {
		t.Errorf("relabelled: %+v; want the provider's labels beside the agent's, its model kept", d.Update)
	}
	if d := p.Decide(moved); *d.Update.Fabric != "fab-1" {
		t.Errorf("moved: %+v", d.Update)
	}
	// The provider takes the host out of its fabric: in none, unless an
	// agent that owns the node named one.
	out := want
	out.Fabric = ""
	p2 := ImportPlan{Source: "scp", Want: map[ImportKey]ImportedNode{{"10.0.0.1", 0}: out}, HW: p.HW}
	if d := p2.Decide(current); d.Kind != ImportUpdateNode || d.Update.Fabric != nil {
		t.Errorf("out of its fabric: %+v, want the fabric cleared", d)
	}
	agentFabric := agents
	agentFabric.Fabric = ptr("ib-local")
	if d := p2.Decide(agentFabric); d.Kind != ImportUnchanged {
		t.Errorf("an agent's fabric where the provider names none: %+v, want it kept", d)
	}
	var res ImportResult
	for _, n := range []Node{current, other, skipped, busy, markedGone} {
		p.Decide(n).Count(&res)
	}
	if res.Unchanged != 1 || len(res.Conflicts) != 1 || res.KeptSkipped != 1 || res.KeptBusy != 2 {
		t.Errorf("counted %+v", res)
	}
	for _, tc := range []struct {
		id   *string
		want bool
	}{{nil, false}, {ptr("h9"), true}, {ptr("h9/w"), true}, {ptr("h90"), false}, {ptr(""), false}} {
		if got := UnderAny(tc.id, []string{"h9", ""}); got != tc.want {
			t.Errorf("UnderAny(%v) = %v", tc.id, got)
		}
	}
	if HardwareOf(p.HW, "") != nil || *HardwareOf(p.HW, "H100") != hw {
		t.Error("HardwareOf")
	}
}
