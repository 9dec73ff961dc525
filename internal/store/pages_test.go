package store_test

import (
	"context"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A lent page is the page ListNodes reads; given back, its memory is
// cleared (it points at nothing) and the next page is read into it, right
// again: values where the last page had NULLs and NULLs where it had
// values. Two pages out at once never share memory. Pages of other lists
// are not taken back. Faults caught (each tried once): the page not kept
// for reuse; a page kept for reuse while still lent; the page not
// cleared.
func TestListPageLentAndReused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 2) // 16 nodes with a generation, gpu_mem
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, owner, cordon_reason)
		SELECT '10.40.0.1', g, 1, 'd', 'agent-1', 'maint' FROM generate_series(0, 7) g;
		UPDATE nodes SET current_job = 5, lease_expires_at = now() + interval '1 hour' WHERE pk % 3 = 0`); err != nil {
		t.Fatal(err)
	}
	filters := []registry.NodeFilter{{Limit: 8}, {After: 16, Limit: 8}, {After: 8, Limit: 8}, {Limit: 8}}
	var first *registry.Node
	for i, f := range filters {
		want, err := st.ListNodes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.ListPage(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("page %d (-ListNodes +ListPage):\n%s", i, diff)
		}
		if i == 0 {
			first = unsafe.SliceData(got)
		} else if unsafe.SliceData(got) != first {
			t.Errorf("page %d was read into new memory, want the page given back reused", i)
		}
		if st.RecyclePage(want) {
			t.Errorf("page %d of ListNodes taken back as lent", i)
		}
		if !st.RecyclePage(got) {
			t.Fatalf("page %d not taken back", i)
		}
		if got[0].PK != 0 || got[0].HardwareGeneration != nil {
			t.Errorf("page %d given back still holds %+v, want it cleared", i, got[0])
		}
	}
	a, err := st.ListPage(ctx, registry.NodeFilter{Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.ListPage(ctx, registry.NodeFilter{After: 16, Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(a) == unsafe.SliceData(b) || a[0].PK != 1 || b[0].PK != 17 || a[0].HardwareGeneration == nil {
		t.Errorf("two pages out at once: first %d (generation %v), second %d; want 1 (with one) and 17 in memory of their own",
			a[0].PK, a[0].HardwareGeneration, b[0].PK)
	}
	if st.RecyclePage(nil) {
		t.Error("a nil page taken back")
	}
	if got, err := st.ListPage(ctx, registry.NodeFilter{}); err != nil || len(got) != 24 || st.RecyclePage(got) {
		t.Errorf("a list without a limit: %d nodes, %v; want all 24 and the page not lent", len(got), err)
	}
	if _, err := st.ListPage(ctx, registry.NodeFilter{Limit: -1}); err == nil {
		t.Error("a negative limit: no error")
	}
}

// Pages never given back are forgotten once more than MaxLent are out, so
// tracking them stays bounded; given back late, they are not taken. Fault
// caught (tried once): the map never cleared.
func TestListPageUnreturnedForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 1)
	var kept [][]registry.Node
	for range store.MaxLent + 1 {
		p, err := st.ListPage(ctx, registry.NodeFilter{Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, p)
	}
	if n := store.LentPages(st); n > store.MaxLent {
		t.Fatalf("%d pages tracked, want at most %d", n, store.MaxLent)
	}
	if st.RecyclePage(kept[0]) {
		t.Error("a forgotten page taken back")
	}
	if !st.RecyclePage(kept[len(kept)-1]) {
		t.Error("the newest page not taken back")
	}
	if kept[0][0].PK == 0 {
		t.Error("a forgotten page was cleared: its caller still holds it")
	}
}

// A page is taken back once: given back a second time (a caller's bug, or
// a page that is someone else's by then) it is refused, so its memory is
// never kept twice and lent to two callers at once. Fault caught (tried
// once): RecyclePage leaving the page marked as lent.
func TestListPageGivenBackOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 1)
	p, err := st.ListPage(ctx, registry.NodeFilter{Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !st.RecyclePage(p) {
		t.Fatal("the page not taken back")
	}
	if n := store.LentPages(st); n != 0 {
		t.Errorf("%d pages still tracked as lent after the only one came back", n)
	}
	if st.RecyclePage(p) {
		t.Error("the page taken back a second time")
	}
	a, err := st.ListPage(ctx, registry.NodeFilter{Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.ListPage(ctx, registry.NodeFilter{After: 4, Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(a) == unsafe.SliceData(b) {
		t.Fatal("two pages out at once share their memory")
	}
	if a[0].PK != 1 || b[0].PK != 5 {
		t.Errorf("pages start at nodes %d and %d, want 1 and 5", a[0].PK, b[0].PK)
	}
}
