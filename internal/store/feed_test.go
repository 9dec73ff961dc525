package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// changes appends n change rows (a node's creation each) and sequences
// them, as a write and a pass would; it returns the pass's answer.
func changes(t *testing.T, st *store.Store, n int, seen int64) registry.Feed {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO node_changes (kind, node_pk, doc)
		SELECT 'created', g, '{}' FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	feed, err := st.SequenceEvents(ctx, seen)
	if err != nil {
		t.Fatal(err)
	}
	return feed
}

// The feed's epoch: ordinary passes stay in it; each way the database can
// stop being the one that handed out the ids so far (the sequence set
// back, another cluster's or database's identity or a new timeline in the
// witness, the log's tail gone, a replica that saw more) begins a new
// epoch whose ids are above every earlier one, and FeedPosition never
// answers a position a reader of the old ids could prove itself current
// with. Faults caught (each tried once): no check of the sequence (the
// setval case stamps ids again in epoch 0); FeedPosition ignoring the
// verdict (answers the old epoch's position); no check of the database's
// oid.
func TestFeedEpochs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	exec := func(sql string) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	first := changes(t, st, 3, 0)
	if first.Epoch != 0 || first.NewEpoch != "" || first.Latest < 3 {
		t.Fatalf("first pass: %+v", first)
	}
	again := changes(t, st, 2, first.Latest)
	if again.Epoch != 0 || again.NewEpoch != "" || again.Latest != first.Latest+2 {
		t.Fatalf("an ordinary pass: %+v after %+v", again, first)
	}
	highest := again.Latest
	steps := []struct {
		name, sql, reason string
		seen              int64 // > 0: the pass is told a replica saw this id
	}{
		{"setval backwards", `SELECT setval('node_event_seq', 1)`, "sequence went backwards", 0},
		{"another cluster", `UPDATE node_feed SET system_identifier = system_identifier + 1`, "another cluster", 0},
		{"another database", `UPDATE node_feed SET database_oid = database_oid + 1`, "another database", 0},
		{"new timeline", `UPDATE node_feed SET timeline = timeline + 1`, "new timeline", 0},
		{"lost tail", `DELETE FROM node_changes WHERE event_id = (SELECT max(event_id) FROM node_changes)`, "lost events", 0},
		{"seen more", ``, "never handed out", -1},
	}
	for _, step := range steps {
		seen := int64(0)
		if step.seen < 0 {
			seen = highest + 1000
		}
		if step.sql != "" {
			exec(step.sql)
		}
		// Before the sequencer's pass, the position already lies beyond
		// every id handed out (and seen), and asks for the pass.
		pos, pending, err := st.FeedPosition(ctx, seen)
		if err != nil {
			t.Fatal(err)
		}
		if pos <= max(highest, seen) || !pending {
			t.Errorf("%s: FeedPosition before the pass = %d, pending %v; want above %d, pending", step.name, pos, pending, max(highest, seen))
		}
		feed := changes(t, st, 2, seen)
		if !strings.Contains(feed.NewEpoch, step.reason) {
			t.Errorf("%s: the pass says %q, want a new epoch because %s", step.name, feed.NewEpoch, step.reason)
		}
		if feed.Epoch <= max(highest, seen) || feed.Epoch%(1<<store.EpochBits) != 0 || feed.Latest != feed.Epoch+2 {
			t.Errorf("%s: %+v after ids up to %d (seen %d)", step.name, feed, highest, seen)
		}
		pos, pending, err = st.FeedPosition(ctx, feed.Latest)
		if err != nil || pos != feed.Latest || pending {
			t.Errorf("%s: FeedPosition after the pass = %d, %v, %v; want %d", step.name, pos, pending, err, feed.Latest)
		}
		next := changes(t, st, 1, feed.Latest)
		if next.NewEpoch != "" || next.Epoch != feed.Epoch || next.Latest != feed.Latest+1 {
			t.Errorf("%s: the pass after the new epoch: %+v after %+v", step.name, next, feed)
		}
		h, err := st.EventHorizon(ctx)
		if err != nil || h.Epoch != feed.Epoch || h.Latest != next.Latest {
			t.Errorf("%s: EventHorizon = %+v, %v; want epoch %d, latest %d", step.name, h, err, feed.Epoch, next.Latest)
		}
		highest = next.Latest
	}
}
