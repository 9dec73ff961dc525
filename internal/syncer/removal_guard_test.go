package syncer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/syncer"
)

// The finding: one answer of {"count":0,"gpu_nodes":[]} removed every
// imported SCP host. Now a pass that would take away more than 10 % of a
// provider's nodes takes away none, says so in its summary and the audit
// log, and only the third such pass in a row removes them; a pass in
// between that finds the fleet again starts the count over.
func TestMassRemovalIsHeldBack(t *testing.T) {
	b := imported(t)
	before := b.table()
	empty := func() {
		b.scp.Lock()
		b.scp.Nodes = nil
		b.scp.Unlock()
	}
	saved := func() func() {
		b.scp.Lock()
		nodes := b.scp.Nodes
		b.scp.Unlock()
		return func() {
			b.scp.Lock()
			b.scp.Nodes = nodes
			b.scp.Unlock()
		}
	}()
	held := func(pass int) {
		t.Helper()
		sums, err := b.run()
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		r := sums[0].Result
		if r.Withheld != before.Nodes["scp"] || r.Total != before.Nodes["scp"] || r.Removed != 0 {
			t.Fatalf("pass %d: %+v, want all %d scp nodes withheld, none removed", pass, r, before.Nodes["scp"])
		}
		if got := b.table(); got.Nodes["scp"] != before.Nodes["scp"] || got.Schedulable["scp"] != before.Schedulable["scp"] {
			t.Fatalf("pass %d changed scp's nodes: %v → %v", pass, before, got)
		}
		if s := sums[0].String(); !strings.Contains(s, "REMOVALS HELD BACK: 345 of the 345 nodes") ||
			!strings.Contains(s, "pass "+string(rune('0'+pass))+" of 3") || !strings.Contains(s, "--allow-removal") {
			t.Errorf("pass %d's summary:\n%s", pass, s)
		}
		if sums[1].Result.Withheld != 0 || sums[1].Err != nil {
			t.Errorf("pass %d: e2e, whose inventory did not change, %+v", pass, sums[1])
		}
	}

	empty()
	held(1)
	saved() // the fleet is back: nothing to hold, the count starts over
	if sums, err := b.run(); err != nil || sums[0].Result.Withheld != 0 || sums[0].Result.Removed != 0 {
		t.Fatalf("the fleet back: %v %+v", err, sums)
	}
	empty()
	held(1)
	held(2)
	sums, err := b.run()
	if err != nil {
		t.Fatal(err)
	}
	if r := sums[0].Result; r.Removed+r.KeptBusy != before.Nodes["scp"] || r.Withheld != 0 {
		t.Fatalf("third pass in a row: %+v, want every scp node taken away", r)
	}
	if got := b.table(); got.Nodes["scp"] != 0 {
		t.Errorf("after the third pass: %d scp nodes", got.Nodes["scp"])
	}

	// Each held pass is in the audit log, as the sync worker's own entry.
	rows, err := b.store.Pool().Query(context.Background(), `
		SELECT principal, role, target_pk IS NULL, after::text FROM audit_log
		WHERE action = $1 AND target_type = 'provider' ORDER BY id`, registry.ActionSyncRemovalsHeld)
	if err != nil {
		t.Fatal(err)
	}
	var passes []int
	for rows.Next() {
		var principal, role, after string
		var noPK bool
		if err := rows.Scan(&principal, &role, &noPK, &after); err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Provider string `json:"provider"`
			Away     int    `json:"would_take_away"`
			Of       int    `json:"of"`
			MaxPct   int    `json:"max_percent"`
			Pass     int    `json:"pass"`
			OfPasses int    `json:"passes"`
		}
		if err := json.Unmarshal([]byte(after), &doc); err != nil {
			t.Fatal(err)
		}
		if principal != "sync:scp" || role != "system" || !noPK || doc.Provider != "scp" || doc.Away != 345 || doc.Of != 345 ||
			doc.MaxPct != 10 || doc.OfPasses != 3 {
			t.Errorf("audit entry: %s %s (no pk: %v) %s", principal, role, noPK, after)
		}
		passes = append(passes, doc.Pass)
	}
	if len(passes) != 3 || passes[0] != 1 || passes[1] != 1 || passes[2] != 2 {
		t.Errorf("audited passes %v, want [1 1 2]", passes)
	}
}

// An admin who knows the fleet is gone removes it at once
// (`registryd sync --once --allow-removal`); a guard of 100 % is none.
func TestMassRemovalAllowed(t *testing.T) {
	for name, cfg := range map[string]syncer.Config{"allowed": {AllowRemoval: true}, "guard off": {MaxRemovalPercent: 100}} {
		t.Run(name, func(t *testing.T) { removeAll(t, cfg) })
	}
}

func removeAll(t *testing.T, cfg syncer.Config) {
	b := imported(t)
	before := b.table()
	b.scp.Lock()
	b.scp.Nodes = nil
	b.scp.Unlock()
	cfg.Sources = b.srcs
	sums, err := newSyncerWith(t, b.store, cfg).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r := sums[0].Result; r.Removed != before.Nodes["scp"] || r.Withheld != 0 {
		t.Errorf("%+v: %+v, want all %d removed", cfg, r, before.Nodes["scp"])
	}
}

// A pass that reads more than its budget from a provider fails and
// changes nothing for it, whatever it read before.
func TestPassOverReadBudget(t *testing.T) {
	b := imported(t)
	before := b.table()
	b.scp.Lock()
	b.scp.Nodes = b.scp.Nodes[1:] // a change the pass would apply
	b.scp.Unlock()
	sums, err := newSyncerWith(t, b.store, syncer.Config{Sources: b.srcs[:1], MaxReadBytes: 4096}).RunOnce(context.Background())
	if err == nil || sums[0].Err == nil || !strings.Contains(sums[0].Err.Error(), "has read more than 4096 bytes") {
		t.Fatalf("a pass past 4 KiB: %v %v", err, sums)
	}
	if got := b.table(); got.Nodes["scp"] != before.Nodes["scp"] {
		t.Errorf("the failed pass changed scp's nodes: %d → %d", before.Nodes["scp"], got.Nodes["scp"])
	}
	if sums, err := newSyncerWith(t, b.store, syncer.Config{Sources: b.srcs[:1]}).RunOnce(context.Background()); err != nil || sums[0].Result.Removed != 8 {
		t.Fatalf("the same pass within the default budget: %v %+v", err, sums)
	}
}

// A removal that grows while it is held starts the count over: two passes
// held back 5 hosts that went (12 % of the nodes); the third, which would
// let those through, finds the provider answering nothing at all and
// holds that back as the first of a new run instead of wiping the fleet.
func TestGrowingRemovalStartsOver(t *testing.T) {
	b := imported(t)
	before := b.table()
	b.scp.Lock()
	all := b.scp.Nodes
	b.scp.Nodes = all[5:] // 40 of 345 nodes gone
	b.scp.Unlock()
	for pass := 1; pass <= 2; pass++ {
		sums, err := b.run()
		if err != nil || sums[0].Result.Withheld != 40 || !strings.Contains(sums[0].String(), "pass "+string(rune('0'+pass))+" of 3") {
			t.Fatalf("pass %d: %v %+v\n%s", pass, err, sums[0].Result, sums[0])
		}
	}
	b.scp.Lock()
	b.scp.Nodes = nil
	b.scp.Unlock()
	sums, err := b.run()
	if err != nil || sums[0].Result.Withheld != 345 || sums[0].Result.Removed != 0 || !strings.Contains(sums[0].String(), "pass 1 of 3") {
		t.Fatalf("the empty answer after two held passes: %v %+v\n%s", err, sums[0].Result, sums[0])
	}
	if got := b.table(); got.Nodes["scp"] != before.Nodes["scp"] {
		t.Fatalf("scp nodes %d → %d", before.Nodes["scp"], got.Nodes["scp"])
	}
	// Back to the 5 hosts gone: a smaller removal goes on with the run
	// (pass 2), and the next pass takes those 40 away.
	b.scp.Lock()
	b.scp.Nodes = all[5:]
	b.scp.Unlock()
	if sums, err := b.run(); err != nil || sums[0].Result.Withheld != 40 || !strings.Contains(sums[0].String(), "pass 2 of 3") {
		t.Fatalf("the 5 hosts again: %v %+v\n%s", err, sums[0].Result, sums[0])
	}
	if sums, err := b.run(); err != nil || sums[0].Result.Removed != 40 || sums[0].Result.Withheld != 0 {
		t.Fatalf("the third pass of the run: %v %+v", err, sums[0].Result)
	}
}

// The guard's share is of the nodes before the pass: a pass that adds
// nodes while others vanish does not dilute the removal (15 of 100 gone
// and 50 new is 15 %, not 10 % of 150).
func TestRemovalShareOfNodesBefore(t *testing.T) {
	b := imported(t)
	b.scp.Lock()
	nodes := append([]scptest.Node(nil), b.scp.Nodes[5:]...) // 40 of 345 gone …
	for i := range 40 {                                      // … and 40 hosts (320 nodes) new
		n := b.scp.Nodes[10]
		n.ID, n.Name, n.PolicyIP = fmt.Sprintf("scp-new-%02d", i), fmt.Sprintf("new-%02d", i), fmt.Sprintf("10.11.0.%d", i+1)
		nodes = append(nodes, n)
	}
	b.scp.Nodes = nodes
	b.scp.Unlock()
	sums, err := b.run()
	if err != nil {
		t.Fatal(err)
	}
	if r := sums[0].Result; r.Withheld != 40 || r.Total != 345 || r.Added != 320 || r.Removed != 0 {
		t.Errorf("%+v: want the 40 of the 345 nodes before held back, the 320 new added", r)
	}
}
