package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sys is the actor of the store tests' writes.
var sys = registry.Actor{Principal: registry.Principal{Sub: "store-test", Role: registry.RoleAdmin}}

func TestSchemaLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.NewEmpty(t), store.Options{})
	state, err := st.CheckSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if state.OK() || state.Current != 0 || !strings.Contains(state.Problem(), "migrate up") {
		t.Fatalf("empty database: %+v %q", state, state.Problem())
	}
	m, err := st.NewMigrator(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if state, _ = st.CheckSchema(ctx); !state.OK() {
		t.Fatalf("after up: %+v", state)
	}
	// Down, step by step, really removes the schema, and up restores it.
	for state.Current > 0 {
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
		prev := state.Current
		if state, err = st.CheckSchema(ctx); err != nil || state.Current >= prev {
			t.Fatalf("down from %d left %+v, %v", prev, state, err)
		}
	}
	if _, err := st.ListNodes(ctx, registry.NodeFilter{}); err == nil {
		t.Fatal("nodes table survived migrate down")
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ListNodes(ctx, registry.NodeFilter{}); err != nil {
		t.Fatal(err)
	}
}

// Concurrent read-modify-write updates of one node serialize on its row
// lock: none is lost.
func TestUpdateNodeSerializes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 20
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			_, err := st.UpdateNode(ctx, sys, n.PK, func(cur registry.Node) (registry.NodeSpec, error) {
				s := cur.Spec()
				s.CPUMem++
				return s, nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := st.GetNode(ctx, n.PK)
	if err != nil {
		t.Fatal(err)
	}
	if got.CPUMem != writers || got.Version != 1+writers {
		t.Errorf("cpu_mem %d version %d, want %d and %d", got.CPUMem, got.Version, writers, 1+writers)
	}
}

func TestUpdateNodeCallbackErrorChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	refuse := registry.Invalidf("no")
	_, err = st.UpdateNode(ctx, sys, n.PK, func(cur registry.Node) (registry.NodeSpec, error) { return registry.NodeSpec{}, refuse })
	if !errors.Is(err, refuse) {
		t.Fatalf("error %v, want the callback's", err)
	}
	_, err = st.UpdateNode(ctx, sys, n.PK, func(cur registry.Node) (registry.NodeSpec, error) {
		s := cur.Spec()
		s.IP = "not an ip"
		return s, nil
	})
	if !errors.Is(err, registry.ErrInvalid) {
		t.Fatalf("invalid spec: %v", err)
	}
	got, _ := st.GetNode(ctx, n.PK)
	if got.Version != n.Version || got.IP != n.IP {
		t.Errorf("node changed: %+v", got)
	}
	if _, err := st.UpdateNode(ctx, sys, 999, func(cur registry.Node) (registry.NodeSpec, error) { return cur.Spec(), nil }); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("missing node: %v", err)
	}
}

func TestStoreErrorsAreTyped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	hw, err := st.CreateHardware(ctx, sys, registry.HardwareSpec{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateHardware(ctx, sys, registry.HardwareSpec{Name: "H100"}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("duplicate name: %v", err)
	}
	a, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", DriverVersion: "d", HardwareGeneration: &hw.PK})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", DriverVersion: "e"})
	var re *registry.Error
	if !errors.As(err, &re) || !errors.Is(err, registry.ErrConflict) || re.ExistingPK != a.PK {
		t.Errorf("duplicate pair: %v", err)
	}
	missing := int64(12345)
	_, _, err = st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.2", DriverVersion: "d", HardwareGeneration: &missing})
	if f := registry.FieldsOf(err); len(f) != 1 || f[0].Field != "hardware_generation" {
		t.Errorf("missing hardware: %v", err)
	}
	if _, err := st.DeleteHardware(ctx, sys, hw.PK, nil); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("delete used hardware: %v", err)
	}
	if _, err := st.DeleteNode(ctx, sys, 424242, false, nil); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("delete missing node: %v", err)
	}
	if _, err := st.GetHardware(ctx, 424242); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("get missing hardware: %v", err)
	}
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", store.Options{})
	_, err := st.GetNode(context.Background(), 1)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("unreachable database: %v, want ErrUnavailable", err)
	}
}

// A reader that follows events by id while writers commit concurrently and
// sequencers run in parallel never sees an id below one it already saw,
// and in the end has seen every change exactly once.
func TestEventsNeverAppearBehindTheReader(t *testing.T) {
	t.Parallel()
	// The reader and the sequencers loop until the writers are done: bound
	// the writers, so that a hang fails in seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := pgtest.New(t)
	st := pgtest.Open(t, url, store.Options{})
	const writers, perWriter = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				_, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: fmt.Sprintf("10.%d.%d.1", w, i), DriverVersion: "d"})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var seqs sync.WaitGroup
	for range 3 { // three replicas' sequencers
		seqs.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := st.SequenceEvents(ctx, 0); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	seen := map[int64]bool{}
	var last int64
	read := func() {
		events, err := st.NodeEventsAfter(ctx, last, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.ID <= last {
				t.Fatalf("event %d after %d", e.ID, last)
			}
			last = e.ID
			if seen[e.Node.PK] {
				t.Fatalf("node %d created twice", e.Node.PK)
			}
			seen[e.Node.PK] = true
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			read()
		}
	}
	close(stop)
	seqs.Wait()
	if _, err := st.SequenceEvents(ctx, 0); err != nil {
		t.Fatal(err)
	}
	read()
	// Anything stamped below the reader's position after it passed would
	// be lost to it: check the log holds nothing it did not see.
	all, err := st.NodeEventsAfter(ctx, 0, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != writers*perWriter || len(all) != writers*perWriter {
		t.Errorf("reader saw %d, log holds %d, want %d", len(seen), len(all), writers*perWriter)
	}
}
