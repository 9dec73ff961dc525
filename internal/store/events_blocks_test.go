package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A write of many nodes is one change row per 256 of them (migration
// 00022), and as many events: consecutive ids, the nodes in order, each
// its own event, readable from any position inside a row, paged with
// any limit; the horizon and pruning count a row's last id.
func TestManyNodesFewChangeRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 40) // 320 nodes, no change rows
	start, err := st.SequenceEvents(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	changeID, _ := lastIDs(t, st)
	claimed, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 1, Count: 300})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := st.Pool().Query(ctx, `SELECT width FROM node_changes WHERE row_id > $1 ORDER BY row_id`, changeID)
	widths, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(widths, []int{256, 44}) {
		t.Fatalf("a claim of 300 wrote change rows of widths %v, want [256 44]", widths)
	}
	feed, err := st.SequenceEvents(ctx, start.Latest)
	if err != nil {
		t.Fatal(err)
	}
	if feed.Latest != start.Latest+300 {
		t.Fatalf("the pass answered %d after %d: want 300 ids, one per node", feed.Latest, start.Latest)
	}

	all, err := st.NodeEventsAfter(ctx, start.Latest, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 300 {
		t.Fatalf("%d events for a claim of 300", len(all))
	}
	for i, e := range all {
		if e.ID != start.Latest+1+int64(i) || e.Kind != "claimed" || e.Node.PK != claimed[i].PK ||
			e.Node.CurrentJob == nil || *e.Node.CurrentJob != 1 || e.Node.Version != claimed[i].Version {
			t.Fatalf("event %d: id %d kind %s node %d (job %v, version %d); want id %d, claimed, node %d at version %d",
				i, e.ID, e.Kind, e.Node.PK, e.Node.CurrentJob, e.Node.Version, start.Latest+1+int64(i), claimed[i].PK, claimed[i].Version)
		}
	}
	ids := func(es []registry.NodeEvent) []int64 {
		out := make([]int64, len(es))
		for i, e := range es {
			out[i] = e.ID
		}
		return out
	}
	// From inside the first row, a limit that ends inside the second.
	mid, err := st.NodeEventsAfter(ctx, start.Latest+100, 150)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(mid), ids(all[100:250])) {
		t.Fatalf("after %d, 150 events: %v", start.Latest+100, ids(mid))
	}
	// Pages of 7 read the same events.
	var paged []registry.NodeEvent
	for after := start.Latest; ; {
		page, err := st.NodeEventsAfter(ctx, after, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 7 {
			t.Fatalf("a page of %d events for a limit of 7", len(page))
		}
		paged = append(paged, page...)
		after = page[len(page)-1].ID
	}
	if !slices.Equal(ids(paged), ids(all)) {
		t.Fatalf("paged by 7: %d events %v…", len(paged), ids(paged)[:min(10, len(paged))])
	}
	if end, err := st.NodeEventsAfter(ctx, feed.Latest, 10); err != nil || len(end) != 0 {
		t.Fatalf("after the last event: %d events, %v", len(end), err)
	}

	horizon, err := st.EventHorizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if horizon.Latest != feed.Latest {
		t.Errorf("horizon latest %d, want the second row's last id %d", horizon.Latest, feed.Latest)
	}
	latest, pending, err := st.FeedPosition(ctx, feed.Latest)
	if err != nil || latest != feed.Latest || pending {
		t.Errorf("feed position %d (pending %v, %v), want %d", latest, pending, err, feed.Latest)
	}

	// The release is two rows too; pruning everything but the newest row
	// raises the horizon to the last id of the rows it deleted.
	if _, _, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 1}); err != nil {
		t.Fatal(err)
	}
	released, err := st.SequenceEvents(ctx, feed.Latest)
	if err != nil {
		t.Fatal(err)
	}
	if released.Latest != feed.Latest+300 {
		t.Fatalf("the release's pass answered %d after %d, want 300 more", released.Latest, feed.Latest)
	}
	if _, err := st.PruneEvents(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	horizon, err = st.EventHorizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := feed.Latest + 256; horizon.Pruned != want || horizon.Latest != released.Latest {
		t.Errorf("after pruning: pruned through %d, latest %d; want %d (the release's first row) and %d",
			horizon.Pruned, horizon.Latest, want, released.Latest)
	}
	kept, err := st.NodeEventsAfter(ctx, horizon.Pruned, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 44 || kept[0].ID != horizon.Pruned+1 || kept[0].Kind != "released" {
		t.Errorf("after the horizon: %d events from %d, want the 44 of the newest row", len(kept), kept[0].ID)
	}

	// A gap wider than the limit (ids skipped, as a new epoch does) still
	// gives the event after it.
	if _, err := st.Pool().Exec(ctx, `SELECT setval('node_event_seq', $1)`, released.Latest+1000); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 2, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.SequenceEvents(ctx, released.Latest); err != nil {
		t.Fatal(err)
	}
	next, err := st.NodeEventsAfter(ctx, released.Latest, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(next) != 1 || next[0].ID != released.Latest+1001 {
		t.Errorf("after a gap of 1000 ids, a limit of 10 read %d events (%v)", len(next), ids(next))
	}
}
