package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func ptr[T any](v T) *T { return &v }

// The store's SQL and NodeFilter.Match (what watch uses) must select the
// same nodes for every filter: one meaning, two implementations.
func TestListAgreesWithMatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	h1, err := st.CreateHardware(ctx, sys, registry.HardwareSpec{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	h2, err := st.CreateHardware(ctx, sys, registry.HardwareSpec{Name: "A100"})
	if err != nil {
		t.Fatal(err)
	}
	var pks []int64
	for i := range 12 {
		spec := registry.NodeSpec{IP: fmt.Sprintf("10.0.0.%d", i/4), Index: i % 4, CPUMem: int64(i) * 100, DriverVersion: "d"}
		if i == 11 {
			spec.IP = "2001:db8::1"
		}
		switch i % 3 {
		case 0:
			spec.HardwareGeneration, spec.GPUMem = &h1.PK, ptr(int64(i)<<30)
		case 1:
			spec.HardwareGeneration, spec.GPUMem = &h2.PK, ptr(int64(0))
		}
		if i < 8 {
			spec.Fabric = ptr(fmt.Sprintf("ib-%d", i/4))
			spec.Labels = mustLabels(t, map[string]string{"team": []string{"a", "b", ""}[i%3], "zone": fmt.Sprint(i / 4)})
		}
		n, _, err := st.CreateNode(ctx, sys, spec)
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE nodes SET current_job = 5 WHERE pk = ANY($1)`, []int64{pks[1], pks[4]})
	exec(`UPDATE nodes SET current_job = 6 WHERE pk = $1`, pks[7])
	exec(`UPDATE nodes SET source = 'scp', schedulable = false WHERE pk = ANY($1)`, []int64{pks[2], pks[4]})
	exec(`UPDATE nodes SET source = 'e2e' WHERE pk = $1`, pks[9])
	exec(`UPDATE nodes SET lost = true WHERE pk = ANY($1)`, []int64{pks[3], pks[4]})           // lost; lost and gone
	exec(`UPDATE nodes SET cordon_reason = 'fan' WHERE pk = ANY($1)`, []int64{pks[7], pks[8]}) // draining; cordoned
	exec(`UPDATE nodes SET cordon_reason = 'psu', current_job = 6 WHERE pk = $1`, pks[3])      // lost beats draining
	exec(`UPDATE nodes SET cordon_reason = 'psu' WHERE pk = $1`, pks[2])                       // gone beats cordoned
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT unnest($1::bigint[]), now() - interval '10 seconds'`, []int64{pks[0], pks[3], pks[5]})
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT unnest($1::bigint[]), now() - interval '2 hours'`, []int64{pks[6], pks[10]})

	all, err := st.ListNodes(ctx, registry.NodeFilter{})
	if err != nil || len(all) != len(pks) {
		t.Fatalf("all nodes: %d, %v", len(all), err)
	}
	for _, f := range []registry.NodeFilter{
		{Free: ptr(true)},
		{Free: ptr(false)},
		{CurrentJob: ptr[int64](5)},
		{CurrentJob: ptr[int64](6)},
		{HardwareGeneration: &h1.PK},
		{HardwareGeneration: &h2.PK},
		{MinGPUMem: ptr[int64](0)},
		{MinGPUMem: ptr[int64](3 << 30)},
		{MinCPUMem: ptr[int64](500)},
		{IP: ptr("10.0.0.1")},
		{IP: ptr("2001:DB8:0::1")},
		{IP: ptr("::ffff:10.0.0.2")},
		{IP: ptr("10.0.0.0/31")},
		{IP: ptr("10.0.0.2/31")},
		{IP: ptr("10.0.0.0/24")},
		{IP: ptr("10.0.0.1/32")},
		{IP: ptr("0.0.0.0/0")},
		{IP: ptr("::/0")},
		{IP: ptr("2001:db8::/32")},
		{IP: ptr("::ffff:10.0.0.0/127")},
		{IP: ptr("10.0.0.0/30"), Index: ptr(3), Free: ptr(true)},
		{Index: ptr(0)},
		{Index: ptr(3)},
		{SeenWithin: ptr(time.Minute)},
		{SeenWithin: ptr(24 * time.Hour)},
		{Source: ptr("api")},
		{Source: ptr("scp")},
		{Source: ptr("e2e")},
		{PK: &pks[5]},
		{PK: ptr[int64](999999)},
		{Free: ptr(true), HardwareGeneration: &h1.PK, MinGPUMem: ptr[int64](1 << 30)},
		{Free: ptr(false), Source: ptr("scp"), Index: ptr(2)},
		{IP: ptr("10.0.0.0"), SeenWithin: ptr(time.Minute), Source: ptr("api")},
		{State: []registry.State{registry.StateFree}},
		{State: []registry.State{registry.StateBusy}},
		{State: []registry.State{registry.StateGone}},
		{State: []registry.State{registry.StateLost}},
		{State: []registry.State{registry.StateDraining}},
		{State: []registry.State{registry.StateCordoned}},
		{State: []registry.State{registry.StateCordoned, registry.StateDraining}},
		{State: []registry.State{registry.StateBusy, registry.StateFree, registry.StateBusy}},
		{State: []registry.State{registry.StateLost, registry.StateGone}, Source: ptr("scp")},
		{State: []registry.State{registry.StateBusy, registry.StateLost}, Free: ptr(false)},
		{State: []registry.State{registry.StateFree, registry.StateCordoned}, Free: ptr(true)},
		{Fabric: ptr("ib-0")},
		{Fabric: ptr("ib-1"), Free: ptr(true)},
		{Fabric: ptr("ib-9")},
		{Selector: mustSelector(t, "team=a")},
		{Selector: mustSelector(t, "team=")},
		{Selector: mustSelector(t, "team!=a")},
		{Selector: mustSelector(t, "team in (a,b)")},
		{Selector: mustSelector(t, "team notin (a,b)")},
		{Selector: mustSelector(t, "team")},
		{Selector: mustSelector(t, "!team")},
		{Selector: mustSelector(t, "zone=1,team!=b")},
		{Selector: mustSelector(t, "zone=1"), Fabric: ptr("ib-0")},
	} {
		list, err := st.ListNodes(ctx, f)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		var got, want []int64
		for _, n := range list {
			got = append(got, n.PK)
		}
		norm := f
		if err := norm.Normalize(); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, n := range all {
			if norm.Match(n, now) {
				want = append(want, n.PK)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("filter %s: list %v, Match %v", describe(f), got, want)
		}
		if len(want) == len(all) && f.Free == nil {
			t.Errorf("filter %s selects every node: a weak case", describe(f))
		}
	}

	// Each node is in exactly one state, the one its document shows, and
	// every state has a node here (no state case is empty by accident).
	inState := map[int64]registry.State{}
	for _, state := range registry.States {
		list, err := st.ListNodes(ctx, registry.NodeFilter{State: []registry.State{state}})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			t.Errorf("no node in state %s: a weak fixture", state)
		}
		for _, n := range list {
			if prev, ok := inState[n.PK]; ok {
				t.Errorf("node %d listed in states %s and %s", n.PK, prev, state)
			}
			if n.State != state {
				t.Errorf("node %d listed in state %s shows %s", n.PK, state, n.State)
			}
			inState[n.PK] = state
		}
	}
	if len(inState) != len(all) {
		t.Errorf("%d of %d nodes are in some state", len(inState), len(all))
	}

	// Claims take free nodes only: never a lost, cordoned, draining, busy
	// or gone one. Asking for one more than there are free takes nothing.
	free, err := st.ListNodes(ctx, registry.NodeFilter{Free: ptr(true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range free {
		if n.State != registry.StateFree {
			t.Errorf("node %d listed free in state %s", n.PK, n.State)
		}
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 77, Count: len(free) + 1}); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("claim of %d with %d free: %v, want a conflict", len(free)+1, len(free), err)
	}
	got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 77, Count: len(free)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(free) {
		t.Fatalf("claimed %d, want %d", len(got), len(free))
	}
	for i, n := range got {
		if n.PK != free[i].PK || n.State != registry.StateBusy {
			t.Errorf("claimed node %d in state %s, want %d busy", n.PK, n.State, free[i].PK)
		}
	}
}

func describe(f registry.NodeFilter) string {
	s := ""
	add := func(name string, v any) { s += fmt.Sprintf("%s=%v ", name, v) }
	if f.Free != nil {
		add("free", *f.Free)
	}
	if f.State != nil {
		add("state", f.State)
	}
	if f.CurrentJob != nil {
		add("current_job", *f.CurrentJob)
	}
	if f.HardwareGeneration != nil {
		add("hardware_generation", *f.HardwareGeneration)
	}
	if f.MinGPUMem != nil {
		add("min_gpu_mem", *f.MinGPUMem)
	}
	if f.MinCPUMem != nil {
		add("min_cpu_mem", *f.MinCPUMem)
	}
	if f.IP != nil {
		add("ip", *f.IP)
	}
	if f.Index != nil {
		add("index", *f.Index)
	}
	if f.SeenWithin != nil {
		add("seen_within", *f.SeenWithin)
	}
	if f.Source != nil {
		add("source", *f.Source)
	}
	if f.PK != nil {
		add("pk", *f.PK)
	}
	if f.Fabric != nil {
		add("fabric", *f.Fabric)
	}
	if f.Selector != nil {
		add("selector", f.Selector.String())
	}
	return s
}

func mustSelector(t testing.TB, text string) registry.Selector {
	t.Helper()
	sel, err := registry.ParseSelector(text)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func mustLabels(t testing.TB, m map[string]string) registry.Labels {
	t.Helper()
	l, err := registry.MakeLabels(m)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Random selectors over a small vocabulary select, through the store's
// SQL, exactly the nodes Selector.Matches does.
func TestSelectorSQLAgreesWithMatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	r := rand.New(rand.NewPCG(7, 11))
	keys := []string{"a", "b", "x.io/c"}
	values := []string{"", "1", "2"}
	var all []registry.Node
	for i := range 24 {
		m := map[string]string{}
		for _, k := range keys {
			if r.IntN(3) > 0 {
				m[k] = values[r.IntN(len(values))]
			}
		}
		n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: fmt.Sprintf("10.1.0.%d", i), DriverVersion: "d", Labels: mustLabels(t, m)})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, n)
	}
	ops := []string{"%s=%s", "%s!=%s", "%s in (%s,1)", "%s notin (%s)", "%s", "!%s"}
	for range 300 {
		var parts []string
		for range 1 + r.IntN(3) {
			op := ops[r.IntN(len(ops))]
			k, v := keys[r.IntN(len(keys))], values[r.IntN(len(values))]
			if strings.Count(op, "%s") == 1 {
				parts = append(parts, fmt.Sprintf(op, k))
			} else {
				parts = append(parts, fmt.Sprintf(op, k, v))
			}
		}
		f := registry.NodeFilter{Selector: mustSelector(t, strings.Join(parts, ","))}
		list, err := st.ListNodes(ctx, f)
		if err != nil {
			t.Fatalf("%s: %v", f.Selector, err)
		}
		var got, want []int64
		for _, n := range list {
			got = append(got, n.PK)
		}
		for _, n := range all {
			if f.Match(n, time.Now()) {
				want = append(want, n.PK)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("selector %s: the store lists %v, Match says %v", f.Selector, got, want)
		}
	}
}

// The store validates the filters it is given, whoever calls it.
func TestListRefusesInvalidFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	if _, err := st.ListNodes(ctx, registry.NodeFilter{CurrentJob: ptr[int64](-1)}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("ListNodes with current_job -1: %v", err)
	}
	if _, err := st.ListAudit(ctx, registry.AuditFilter{TargetPK: ptr[int64](0)}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("ListAudit with target_pk 0: %v", err)
	}
	if _, err := st.ListAudit(ctx, registry.AuditFilter{TargetType: ptr("job")}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("ListAudit with target_type job: %v", err)
	}
}
