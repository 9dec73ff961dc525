package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// oldSequencerSQL is how a sequencer before migration 00022 stamped: one
// id per row.
const oldSequencerSQL = `
	WITH todo AS (SELECT row_id FROM node_changes WHERE event_id IS NULL ORDER BY row_id),
	stamps AS (SELECT row_id, nextval('node_event_seq') AS event_id FROM todo)
	UPDATE node_changes c SET event_id = stamps.event_id FROM stamps WHERE c.row_id = stamps.row_id`

// A replica of the release before, still running while the new one rolls
// out, must not stamp a row of several events with one id (the ids after
// it would be handed out twice): its pass fails and stamps nothing; rows
// of one event it still may; the new sequencer stamps the rest.
func TestOldSequencerCannotStampBlocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 5)
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 1, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, oldSequencerSQL); err != nil {
		t.Fatalf("an old sequencer stamping a row of one event: %v", err)
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 2, Count: 20}); err != nil {
		t.Fatal(err)
	}
	_, err := st.Pool().Exec(ctx, oldSequencerSQL)
	if err == nil || !strings.Contains(err.Error(), "can be stamped only by a sequencer of migration 00022 or later") {
		t.Fatalf("an old sequencer stamping a row of 20 events: %v", err)
	}
	feed, err := st.SequenceEvents(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	events, err := st.NodeEventsAfter(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 21 || events[20].ID != feed.Latest || events[20].ID-events[1].ID != 19 {
		t.Errorf("%d events, the last %d (feed %d): want 21, the claim of 20 consecutive", len(events), events[len(events)-1].ID, feed.Latest)
	}
}

// Migrating down from 00022 turns each row of several events into a row
// per event with the ids they were handed out under (unstamped ones
// unstamped, in order): a watcher resuming across it misses nothing.
func TestEventBlocksMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 6)
	for job, n := range map[int64]int{1: 20, 2: 1} {
		if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: job, Count: n}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.SequenceEvents(ctx, 0); err != nil {
		t.Fatal(err)
	}
	events, err := st.NodeEventsAfter(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 3, Count: 3}); err != nil { // left unstamped
		t.Fatal(err)
	}
	m, err := st.NewMigrator(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for { // down to the schema before 00022
		v, err := st.SchemaVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v < 22 {
			break
		}
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		ID  *int64
		PK  int64
		Job string
	}
	rows, _ := st.Pool().Query(ctx, `SELECT event_id, node_pk, doc->>'current_job' FROM node_changes ORDER BY row_id`)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	slices.SortStableFunc(got, func(a, b row) int { // stamped by id, then the unstamped in row order
		switch {
		case a.ID == nil && b.ID == nil:
			return 0
		case a.ID == nil:
			return 1
		case b.ID == nil:
			return -1
		}
		return int(*a.ID - *b.ID)
	})
	if len(got) != len(events)+3 {
		t.Fatalf("%d rows after the downgrade, want %d events and 3 unstamped", len(got), len(events))
	}
	for i, e := range events {
		if got[i].ID == nil || *got[i].ID != e.ID || got[i].PK != e.Node.PK {
			t.Fatalf("row %d: %+v, want event %d of node %d", i, got[i], e.ID, e.Node.PK)
		}
	}
	for _, r := range got[len(events):] {
		if r.ID != nil || r.Job != "3" {
			t.Errorf("unstamped row %+v, want job 3's", r)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
