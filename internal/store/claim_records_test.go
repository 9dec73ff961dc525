package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// docMap is node n's document as the change log and the audit log keep
// it (the node's JSON and its version), read back as JSON values.
func docMap(t *testing.T, n registry.Node) map[string]any {
	t.Helper()
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["version"] = float64(n.Version)
	return m
}

// jsonMap reads a jsonb column's text; SQL NULL is nil.
func jsonMap(t *testing.T, s *string) map[string]any {
	t.Helper()
	if s == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(*s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

type changeRow struct {
	Kind string
	PK   int64
	Doc  map[string]any
}

type auditRow struct {
	Principal, Role, Action    string
	PK                         int64
	ActingNode                 *int64
	Before, After              map[string]any
	RequestID, ClientRequestID *string
}

// recordsSince reads the change-log rows and node audit entries written
// after the given row ids, in order.
func recordsSince(t *testing.T, st *store.Store, changeID, auditID int64) ([]changeRow, []auditRow) {
	t.Helper()
	ctx := context.Background()
	rows, _ := st.Pool().Query(ctx, `SELECT kind, node_pk, doc::text FROM node_change_events WHERE row_id > $1 ORDER BY row_id, ord`, changeID)
	changes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (changeRow, error) {
		var c changeRow
		var doc *string
		err := r.Scan(&c.Kind, &c.PK, &doc)
		c.Doc = jsonMap(t, doc)
		return c, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ = st.Pool().Query(ctx, `
		SELECT principal, role, action, target_pk, acting_node, before::text, after::text, request_id, client_request_id
		FROM audit_log WHERE id > $1 AND target_type = 'node' ORDER BY id`, auditID)
	audits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (auditRow, error) {
		var a auditRow
		var before, after *string
		err := r.Scan(&a.Principal, &a.Role, &a.Action, &a.PK, &a.ActingNode, &before, &after, &a.RequestID, &a.ClientRequestID)
		a.Before, a.After = jsonMap(t, before), jsonMap(t, after)
		return a, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return changes, audits
}

// refuseAudit makes the server refuse every audit entry of the principal
// "refused", failing the statement that writes it.
func refuseAudit(t *testing.T, st *store.Store) {
	t.Helper()
	if _, err := st.Pool().Exec(context.Background(), `
		CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.principal = 'refused' THEN RAISE EXCEPTION 'refused by the test'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse_audit()`); err != nil {
		t.Fatal(err)
	}
}

// heldNodes counts the nodes some job holds.
func heldNodes(t *testing.T, st *store.Store) int {
	t.Helper()
	var held int
	if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM nodes WHERE current_job IS NOT NULL`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	return held
}

func lastIDs(t *testing.T, st *store.Store) (changeID, auditID int64) {
	t.Helper()
	err := st.Pool().QueryRow(context.Background(),
		`SELECT coalesce((SELECT max(row_id) FROM node_changes), 0), coalesce((SELECT max(id) FROM audit_log), 0)`).Scan(&changeID, &auditID)
	if err != nil {
		t.Fatal(err)
	}
	return changeID, auditID
}

// A claim and a release write, per node they change and in their own
// transaction, one change-log row whose document is the node as answered
// (with its version) and one audit entry: "after" that same document,
// "before" the node as it was (a claim's without its job and lease, a
// release's with the job), with the actor and request ids; and the watch
// is notified. Single claims, gang claims, and both kinds of release.
// Faults caught (each tried once): the change rows' documents made from
// the audit's "before"; the request id left out of the entries; the
// NOTIFY dropped from the combined statement.
func TestClaimAndReleaseRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	gangFleet(t, st, 3)

	listener, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close(context.Background()) })
	if _, err := listener.Exec(ctx, "LISTEN "+store.ChangesChannel); err != nil {
		t.Fatal(err)
	}
	notified := func(t *testing.T) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := listener.WaitForNotification(wctx); err != nil {
			t.Fatalf("no notification on %s: %v", store.ChangesChannel, err)
		}
	}

	node := int64(3)
	actor := registry.Actor{Principal: registry.Principal{Sub: "sched-1", Role: registry.RoleScheduler},
		ActingNode: &node, RequestID: "req-1", ClientRequestID: "client-1"}
	lease := 90 * time.Second
	check := func(t *testing.T, kind, action string, nodes []registry.Node, changeID, auditID int64, before func(registry.Node) registry.Node) {
		t.Helper()
		changes, audits := recordsSince(t, st, changeID, auditID)
		var wantChanges []changeRow
		var wantAudits []auditRow
		for _, n := range nodes {
			wantChanges = append(wantChanges, changeRow{Kind: kind, PK: n.PK, Doc: docMap(t, n)})
			b := before(n)
			b.State = b.DeriveState()
			wantAudits = append(wantAudits, auditRow{Principal: "sched-1", Role: "scheduler", Action: action, PK: n.PK, ActingNode: &node,
				Before: docMap(t, b), After: docMap(t, n), RequestID: &actor.RequestID, ClientRequestID: &actor.ClientRequestID})
		}
		if diff := cmp.Diff(wantChanges, changes); diff != "" {
			t.Errorf("change-log rows (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantAudits, audits); diff != "" {
			t.Errorf("audit entries (-want +got):\n%s", diff)
		}
		notified(t)
	}
	for _, tc := range []struct {
		name       string
		claim      registry.Claim
		listed     bool
		wantClaims int
	}{
		{"single, release listed", registry.Claim{Job: 11, Count: 1, Lease: &lease}, true, 1},
		{"three, release all", registry.Claim{Job: 12, Count: 3}, false, 3},
		{"gang, release listed", registry.Claim{Job: 13, Count: 8, SameHost: true, Lease: &lease}, true, 8},
		{"gang, release all", registry.Claim{Job: 14, Count: 4, SameHost: true}, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changeID, auditID := lastIDs(t, st)
			got, err := st.ClaimNodes(ctx, actor, tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.wantClaims {
				t.Fatalf("claimed %d nodes, want %d", len(got), tc.wantClaims)
			}
			check(t, "claimed", registry.ActionNodeClaim, got, changeID, auditID, func(n registry.Node) registry.Node {
				n.CurrentJob, n.LeaseExpiresAt = nil, nil
				return n
			})

			changeID, auditID = lastIDs(t, st)
			r := registry.Release{Job: tc.claim.Job}
			if tc.listed {
				for _, n := range got {
					r.Nodes = append(r.Nodes, n.PK)
				}
			}
			released, notReleased, err := st.ReleaseNodes(ctx, actor, r)
			if err != nil {
				t.Fatal(err)
			}
			if len(released) != len(got) || len(notReleased) != 0 {
				t.Fatalf("released %d of %d, not released %v", len(released), len(got), notReleased)
			}
			check(t, "released", registry.ActionNodeRelease, released, changeID, auditID, func(n registry.Node) registry.Node {
				n.CurrentJob = &tc.claim.Job
				return n
			})
		})
	}
}

// A claim whose last round trip fails (here its audit entry, refused by a
// trigger) leaves nothing behind: the nodes stay free, no change row or
// entry is kept, and the connection goes back to the pool usable. So
// does a claim that finds too few nodes after locking some. Fault caught
// (tried once): the failed transaction left open on the connection (the
// pool then closes it, so a claim on the next one is still right, but
// every failed claim costs a new connection).
func TestClaimThatFailsLateChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{MaxConns: 1})
	gangFleet(t, st, 1)
	refuseAudit(t, st)
	changeID, auditID := lastIDs(t, st)
	conns := st.Pool().Stat().NewConnsCount()
	refused := registry.Actor{Principal: registry.Principal{Sub: "refused", Role: registry.RoleScheduler}}
	for _, c := range []registry.Claim{{Job: 1, Count: 2}, {Job: 2, Count: 3, SameHost: true}} {
		if _, err := st.ClaimNodes(ctx, refused, c); err == nil {
			t.Fatalf("claim %+v with its audit refused: %v, want an error", c, err)
		}
	}
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 3, Count: 9}); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a claim of 9 of 8 nodes: %v, want a conflict", err)
	}
	if held := heldNodes(t, st); held != 0 {
		t.Errorf("%d nodes held after failed claims", held)
	}
	if changes, audits := recordsSince(t, st, changeID, auditID); len(changes)+len(audits) > 0 {
		t.Errorf("failed claims left %d change rows and %d audit entries", len(changes), len(audits))
	}
	// The one connection is back, rolled back rather than closed by the
	// pool for being left in a transaction, and a claim on it commits on
	// its own.
	if n := st.Pool().Stat().NewConnsCount(); n != conns {
		t.Errorf("the failed claims cost %d new connections", n-conns)
	}
	got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 4, Count: 8, SameHost: true})
	if err != nil || len(got) != 8 {
		t.Fatalf("claim after the failures: %d nodes, %v", len(got), err)
	}
	other := pgtest.Open(t, dbURL, store.Options{})
	var held int
	if err := other.Pool().QueryRow(ctx, `SELECT count(*) FROM nodes WHERE current_job = 4`).Scan(&held); err != nil || held != 8 {
		t.Errorf("another session sees %d nodes held by the claim (%v), want 8", held, err)
	}
}

// A sequencing pass (one round trip) stamps the unstamped change rows in
// row order, answers the latest event id and notifies it on
// EventsChannel; a pass with nothing to stamp answers the same id and
// notifies nothing. Faults caught (each tried once): the latest id read
// from the rows as they were before the pass (the statement's snapshot);
// a notification on every pass.
func TestSequenceEventsOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	gangFleet(t, st, 1)
	if _, err := st.SequenceEvents(ctx, 0); err != nil {
		t.Fatal(err)
	}
	listener, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close(context.Background()) })
	if _, err := listener.Exec(ctx, "LISTEN "+store.EventsChannel); err != nil {
		t.Fatal(err)
	}
	changeID, _ := lastIDs(t, st)
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 1, Count: 3}); err != nil {
		t.Fatal(err)
	}
	feed, err := st.SequenceEvents(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	latest := feed.Latest
	rows, _ := st.Pool().Query(ctx, `SELECT event_id FROM node_change_events WHERE row_id > $1 ORDER BY row_id, ord`, changeID)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[*int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("%d change events for a claim of 3", len(ids))
	}
	for i, id := range ids {
		if id == nil || (i > 0 && *id <= *ids[i-1]) {
			t.Fatalf("event ids in row order: %v", ids)
		}
	}
	if latest != *ids[2] {
		t.Errorf("the pass answered %d, the last stamp is %d", latest, *ids[2])
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != strconv.FormatInt(latest, 10) {
		t.Errorf("notified %q, want %d", n.Payload, latest)
	}
	again, err := st.SequenceEvents(ctx, 0)
	if err != nil || again.Latest != latest {
		t.Errorf("a pass with nothing new: %d, %v; want %d", again.Latest, err, latest)
	}
	wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if n, err := listener.WaitForNotification(wctx); err == nil {
		t.Errorf("a pass with nothing new notified %q", n.Payload)
	}
}
