package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// One pass applies each rule to the nodes it selects, with an event and an
// audit entry per transition, and nothing to the others; a second pass
// finds nothing left to do.
func TestSweepLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	const (
		silent = iota
		alive
		ownedSilent
		ownedNew
		imported
		lostBack
		lostStill
		leased
		unleased
		drainingLeased
		lockedSilent
		count
	)
	var pks [count]int64
	for i := range pks {
		actor := sys
		if i == ownedSilent || i == ownedNew { // an agent registers it, and then never heartbeats
			actor = registry.Actor{Principal: registry.Principal{Sub: "agent-1", Role: registry.RoleAgent}}
		}
		n, _, err := st.CreateNode(ctx, actor, registry.NodeSpec{IP: "10.1.0.1", Index: i, CPUMem: 1, DriverVersion: "d"})
		if err != nil {
			t.Fatal(err)
		}
		pks[i] = n.PK
	}
	old := `now() - interval '1 hour'`
	exec(`UPDATE nodes SET updated_at = ` + old)                             // every node written long ago...
	exec(`UPDATE nodes SET updated_at = now() WHERE pk = $1`, pks[ownedNew]) // ...but this one
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT unnest($1::bigint[]), `+old,
		[]int64{pks[silent], pks[lostStill], pks[lockedSilent]})
	exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT unnest($1::bigint[]), now()`,
		[]int64{pks[alive], pks[lostBack], pks[leased], pks[unleased], pks[drainingLeased]})
	exec(`UPDATE nodes SET source = 'scp' WHERE pk = $1`, pks[imported])
	exec(`UPDATE nodes SET lost = true WHERE pk = ANY($1)`, []int64{pks[lostBack], pks[lostStill]})
	exec(`UPDATE nodes SET current_job = 5, lease_expires_at = now() - interval '1 second' WHERE pk = $1`, pks[leased])
	exec(`UPDATE nodes SET current_job = 6 WHERE pk = $1`, pks[unleased])
	exec(`UPDATE nodes SET current_job = 7, cordon_reason = 'fan', lease_expires_at = now() - interval '1 second' WHERE pk = $1`, pks[drainingLeased])

	// A request holds one silent node's row: the pass skips it, never waits.
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once rolled back below
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = $1 FOR UPDATE`, pks[lockedSilent]); err != nil {
		t.Fatal(err)
	}
	passCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	done, err := st.SweepLifecycle(passCtx, time.Minute)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	want := registry.Sweep{
		Lost:    []int64{pks[silent], pks[ownedSilent]},
		Found:   []int64{pks[lostBack]},
		Expired: []int64{pks[leased], pks[drainingLeased]},
	}
	if !slices.Equal(done.Lost, want.Lost) || !slices.Equal(done.Found, want.Found) || !slices.Equal(done.Expired, want.Expired) {
		t.Fatalf("first pass %+v, want %+v", done, want)
	}

	states := map[int]registry.State{
		silent: registry.StateLost, alive: registry.StateFree, ownedSilent: registry.StateLost, ownedNew: registry.StateFree,
		imported: registry.StateFree, lostBack: registry.StateFree, lostStill: registry.StateLost, leased: registry.StateFree,
		unleased: registry.StateBusy, drainingLeased: registry.StateCordoned, lockedSilent: registry.StateFree,
	}
	for i, want := range states {
		n, err := st.GetNode(ctx, pks[i])
		if err != nil {
			t.Fatal(err)
		}
		if n.State != want {
			t.Errorf("node %d (case %d): state %s, want %s", n.PK, i, n.State, want)
		}
		if i == leased || i == drainingLeased {
			if n.CurrentJob != nil || n.LeaseExpiresAt != nil {
				t.Errorf("expired node %d kept job %v lease %v", n.PK, n.CurrentJob, n.LeaseExpiresAt)
			}
		}
	}

	// The skipped node is taken on the next pass; then nothing is left.
	if done, err = st.SweepLifecycle(ctx, time.Minute); err != nil || !slices.Equal(done.Lost, []int64{pks[lockedSilent]}) ||
		len(done.Found)+len(done.Expired) != 0 {
		t.Fatalf("second pass %+v, %v", done, err)
	}
	if done, err = st.SweepLifecycle(ctx, time.Minute); err != nil || !done.Empty() {
		t.Fatalf("third pass %+v, %v", done, err)
	}

	// Exactly one event and one audit entry per transition, with the
	// node's document as it is after it and the system principals.
	rows, _ := st.Pool().Query(ctx, `SELECT kind, node_pk, doc->>'state' FROM node_change_events WHERE kind IN ('lost', 'found', 'expired') ORDER BY row_id, ord`)
	var got []string
	for rows.Next() {
		var kind, state string
		var pk int64
		if err := rows.Scan(&kind, &pk, &state); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %d %s", kind, pk, state))
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	wantEvents := []string{
		fmt.Sprintf("lost %d lost", pks[silent]), fmt.Sprintf("lost %d lost", pks[ownedSilent]),
		fmt.Sprintf("found %d free", pks[lostBack]),
		fmt.Sprintf("expired %d free", pks[leased]), fmt.Sprintf("expired %d cordoned", pks[drainingLeased]),
		fmt.Sprintf("lost %d lost", pks[lockedSilent]),
	}
	if !slices.Equal(got, wantEvents) {
		t.Errorf("events\n got %q\nwant %q", got, wantEvents)
	}
	entries, err := st.ListAudit(ctx, registry.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var audited []string
	for _, e := range entries {
		if e.Role != string(registry.RoleSystem) {
			continue
		}
		line := fmt.Sprintf("%s %s %d", e.Principal, e.Action, *e.TargetPK)
		if e.Action == registry.ActionNodeExpire && !strings.Contains(string(e.Before), `"current_job":`) {
			t.Errorf("expiry entry without the job in before: %s", e.Before)
		}
		audited = append(audited, line)
	}
	wantAudit := []string{
		fmt.Sprintf("system:lifecycle node.lost %d", pks[silent]), fmt.Sprintf("system:lifecycle node.lost %d", pks[ownedSilent]),
		fmt.Sprintf("system:lifecycle node.found %d", pks[lostBack]),
		fmt.Sprintf("system:lease node.expire %d", pks[leased]), fmt.Sprintf("system:lease node.expire %d", pks[drainingLeased]),
		fmt.Sprintf("system:lifecycle node.lost %d", pks[lockedSilent]),
	}
	if !slices.Equal(audited, wantAudit) {
		t.Errorf("audit\n got %q\nwant %q", audited, wantAudit)
	}

	// The job whose lease ran out is told so when it releases, by name or
	// all at once; another job, or a node never leased, is told otherwise.
	released, notReleased, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 5, Nodes: []int64{pks[leased], pks[alive]}})
	if err != nil || len(released) != 0 || len(notReleased) != 2 {
		t.Fatalf("release after expiry: %v %v %v", released, notReleased, err)
	}
	reasons := map[int64]string{}
	for _, n := range notReleased {
		reasons[n.PK] = n.Reason
	}
	if r := reasons[pks[leased]]; r != registry.LeaseExpiredReason(5) {
		t.Errorf("expired node reported %q", r)
	}
	if r := reasons[pks[alive]]; r != "not held by any job" {
		t.Errorf("never leased node reported %q", r)
	}
	if _, nr, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 8, Nodes: []int64{pks[leased]}}); err != nil || nr[0].Reason != "not held by any job" {
		t.Errorf("another job's release: %+v %v", nr, err)
	}
	if _, nr, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 5}); err != nil || len(nr) != 1 || nr[0].PK != pks[leased] ||
		nr[0].Reason != registry.LeaseExpiredReason(5) {
		t.Errorf("release of the whole job: %+v %v", nr, err)
	}
	// Claimed again, the node no longer remembers the old job's lease.
	exec(`UPDATE nodes SET lost = true WHERE pk <> $1`, pks[leased]) // so the claim takes this one
	if _, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 9, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, nr, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 5, Nodes: []int64{pks[leased]}}); err != nil || nr[0].Reason != "held by job 9" {
		t.Errorf("after a new claim: %+v %v", nr, err)
	}
	if _, nr, err := st.ReleaseNodes(ctx, sys, registry.Release{Job: 5}); err != nil || len(nr) != 0 {
		t.Errorf("whole job after a new claim: %+v %v", nr, err)
	}
}

// While a pass is in its transaction it holds the row locks of its
// candidates (the candidate query's, which its UPDATEs then reuse; its
// change-log and audit rows are inserts that lock nothing others read).
// Heartbeats are written and claims take the free nodes meanwhile: neither
// waits for the sweep, and no claim takes a node being marked lost.
func TestSweepBlocksNeitherHeartbeatsNorClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, store.Options{})
	var pks []int64
	for i := range 4 {
		n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.4.0.1", Index: i, CPUMem: 1, DriverVersion: "d"})
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	// Two silent nodes the pass locks; two healthy ones to claim.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen)
		SELECT pk, CASE WHEN pk <= $1 THEN now() - interval '1 hour' ELSE now() END FROM unnest($2::bigint[]) AS pk`, pks[1], pks); err != nil {
		t.Fatal(err)
	}
	pass, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Rollback(ctx) //nolint:errcheck
	rows, _ := pass.Query(ctx, store.SweepCandidates, time.Now().Add(-time.Minute), time.Now())
	var locked int
	for rows.Next() {
		locked++
	}
	if rows.Err() != nil || locked != 2 {
		t.Fatalf("the candidate query locked %d rows (%v), want the 2 silent nodes", locked, rows.Err())
	}
	if _, err := pass.Exec(ctx, `UPDATE nodes SET lost = true, version = version + 1 WHERE pk = ANY($1)`, pks[:2]); err != nil {
		t.Fatal(err)
	}

	// A statement timeout of 2s makes a wait on the pass fail these
	// instead of hanging the test.
	quick := pgtest.Open(t, dbURL, store.Options{StatementTimeout: 2 * time.Second})
	// Another pass meanwhile (a second sweeper that broke the lock) skips
	// the locked rows rather than waiting or doing them twice.
	if done, err := quick.SweepLifecycle(ctx, time.Minute); err != nil || !done.Empty() {
		t.Errorf("a pass during a pass: %+v, %v", done, err)
	}
	now := time.Now()
	if err := quick.TouchNodes(ctx, pks, []time.Time{now, now, now, now}); err != nil {
		t.Errorf("a heartbeat flush during a sweep: %v", err)
	}
	claimed, err := quick.ClaimNodes(ctx, sys, registry.Claim{Job: 5, Count: 2})
	if err != nil || len(claimed) != 2 || claimed[0].PK != pks[2] || claimed[1].PK != pks[3] {
		t.Errorf("a claim during a sweep took %v, %v; want the two healthy nodes", claimed, err)
	}
	if _, err := quick.ClaimNodes(ctx, sys, registry.Claim{Job: 6, Count: 1}); !errors.Is(err, registry.ErrConflict) {
		t.Errorf("a claim with only nodes being marked lost left: %v, want a conflict at once", err)
	}
	if err := pass.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Heard of during the pass: found on the next one.
	if done, err := st.SweepLifecycle(ctx, time.Minute); err != nil || !slices.Equal(done.Found, pks[:2]) {
		t.Errorf("next pass %+v, %v; want both found", done, err)
	}
}

// An agent's node starts with a liveness row without last_seen; its first
// heartbeat fills it in.
func TestAgentNodeFirstHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	agent := registry.Actor{Principal: registry.Principal{Sub: "agent-9", Role: registry.RoleAgent}}
	n, _, err := st.CreateNode(ctx, agent, registry.NodeSpec{IP: "10.5.0.1", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if n.LastSeen != nil || n.Owner == nil {
		t.Fatalf("registered: last_seen %v, owner %v", n.LastSeen, n.Owner)
	}
	at := time.Now().Truncate(time.Microsecond)
	if err := st.TouchNodes(ctx, []int64{n.PK}, []time.Time{at}); err != nil {
		t.Fatal(err)
	}
	if n, err = st.GetNode(ctx, n.PK); err != nil || n.LastSeen == nil || !n.LastSeen.Equal(at) {
		t.Fatalf("after the first heartbeat: last_seen %v, %v; want %v", n.LastSeen, err, at)
	}
}
