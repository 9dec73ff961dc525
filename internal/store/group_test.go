package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// groupLog records what a store's Options.ObserveGroup is told.
type groupLog struct {
	mu        sync.Mutex
	calls     []string
	committed int // operations committed in groups
}

func (l *groupLog) observe(committed int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf("%d %v", committed, err))
	l.committed += committed
}

// grouped is the number of operations committed in groups.
func (l *groupLog) grouped() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.committed
}

func (l *groupLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// observedFleet is a store on a database of its own with hosts hosts of 8
// nodes (gangFleet), whose groups are told to the log it returns.
func observedFleet(t *testing.T, hosts int) (*store.Store, *groupLog) {
	t.Helper()
	log := &groupLog{}
	st := pgtest.Open(t, pgtest.New(t), store.Options{ObserveGroup: log.observe})
	gangFleet(t, st, hosts)
	return st, log
}

// slowTrigger makes a trigger (def: what follows CREATE, without the
// function) that sleeps 0.6 s each time it fires.
func slowTrigger(t *testing.T, st *store.Store, def string) {
	t.Helper()
	if _, err := st.Pool().Exec(context.Background(), `
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.6); RETURN NEW; END $$;
		CREATE `+def+` EXECUTE FUNCTION slow()`); err != nil {
		t.Fatal(err)
	}
}

// heldByJob counts the nodes job holds.
func heldByJob(t *testing.T, st *store.Store, job int64) int {
	t.Helper()
	var n int
	if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM nodes WHERE current_job = $1`, job).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued waits, at most 10 s, for n claims and releases to be
// queued.
func waitQueued(t *testing.T, st *store.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for store.GroupQueued(st) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations queued after 10 s, want %d", store.GroupQueued(st), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitDone waits, at most 10 s, for wg.
func waitDone(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("grouped operations not answered after 10 s")
	}
}

// asGroup runs ops as one group: each is queued in turn while st holds its
// groups, so the group has them in this order, then all are let go; it
// waits, 10 s at most, for every one to end.
func asGroup(t *testing.T, st *store.Store, ops ...func()) {
	t.Helper()
	release := store.HoldGroups(st)
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(op)
		waitQueued(t, st, i+1)
	}
	release()
	waitDone(t, &wg)
}

// claimsAsGroup runs n claims of count nodes as one group, claim i for job
// job+i by scheduler(i), and returns what each got.
func claimsAsGroup(t *testing.T, st *store.Store, n int, job int64, count int) ([][]registry.Node, []error) {
	t.Helper()
	got, errs := make([][]registry.Node, n), make([]error, n)
	ops := make([]func(), n)
	for i := range ops {
		ops[i] = func() {
			got[i], errs[i] = st.ClaimNodes(context.Background(), scheduler(i), registry.Claim{Job: job + int64(i), Count: count})
		}
	}
	asGroup(t, st, ops...)
	return got, errs
}

func scheduler(i int) registry.Actor {
	return registry.Actor{Principal: registry.Principal{Sub: fmt.Sprintf("sched-%d", i), Role: registry.RoleScheduler}}
}

// Claims and releases queued together commit in one transaction, each
// still its own: its nodes (none taken twice), its change-log rows and
// its audit entries under its own actor; a claim that finds too few nodes
// in the group is answered as alone after it (the conflict and the count
// left then), and a release reports its listed nodes not released.
// Faults caught (each tried once): no grouping (each operation alone);
// the short claim answered from the group (no error); the audit entries
// of a group written under its first operation's actor.
func TestGroupedClaimsAndReleases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 2) // 16 nodes
	pre, err := st.ClaimNodes(ctx, scheduler(7), registry.Claim{Job: 7, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	changeID, auditID := lastIDs(t, st)

	claims := make([][]registry.Node, 5)
	claimErrs := make([]error, 5)
	var ops []func()
	for i := range claims {
		ops = append(ops, func() {
			claims[i], claimErrs[i] = st.ClaimNodes(ctx, scheduler(i), registry.Claim{Job: int64(100 + i), Count: 2})
		})
	}
	var tooMany error
	ops = append(ops, func() { _, tooMany = st.ClaimNodes(ctx, scheduler(9), registry.Claim{Job: 9, Count: 17}) })
	var released []registry.Node
	var notReleased []registry.NotReleased
	var releaseErr error
	ops = append(ops, func() {
		released, notReleased, releaseErr = st.ReleaseNodes(ctx, scheduler(7),
			registry.Release{Job: 7, Nodes: []int64{pre[0].PK, pre[1].PK, 999_999}})
	})
	asGroup(t, st, ops...)

	taken := map[int64]int64{}
	for i, got := range claims {
		if claimErrs[i] != nil || len(got) != 2 {
			t.Fatalf("claim %d: %d nodes, %v; want 2", i, len(got), claimErrs[i])
		}
		for _, n := range got {
			if n.CurrentJob == nil || *n.CurrentJob != int64(100+i) {
				t.Errorf("claim %d answered node %d with job %v", i, n.PK, n.CurrentJob)
			}
			if j, ok := taken[n.PK]; ok {
				t.Errorf("node %d given to jobs %d and %d", n.PK, j, 100+i)
			}
			taken[n.PK] = int64(100 + i)
		}
	}
	// 16 nodes, 2 held before, 10 claimed and 2 released in the group.
	if !errors.Is(tooMany, registry.ErrConflict) || !strings.Contains(tooMany.Error(), "only 6 free node(s)") {
		t.Errorf("a claim of 17: %v, want a conflict with 6 free", tooMany)
	}
	if releaseErr != nil || len(released) != 2 {
		t.Fatalf("release: %d nodes, %v; want 2", len(released), releaseErr)
	}
	if len(notReleased) != 1 || notReleased[0].PK != 999_999 || notReleased[0].Reason != "no such node" {
		t.Errorf("not released: %+v, want node 999999, no such node", notReleased)
	}
	if n := log.grouped(); n != 6 {
		t.Errorf("%d operations committed grouped, want 6 (five claims and the release)", n)
	}
	if got := log.get(); !slices.Equal(got, []string{"6 <nil>"}) {
		t.Errorf("ObserveGroup told %q, want one group of 6", got)
	}

	changes, audits := recordsSince(t, st, changeID, auditID)
	if len(changes) != 12 || len(audits) != 12 {
		t.Fatalf("%d change rows and %d audit entries, want 12 each", len(changes), len(audits))
	}
	for _, a := range audits {
		want := "sched-7"
		if a.Action == registry.ActionNodeClaim {
			want = fmt.Sprintf("sched-%d", taken[a.PK]-100)
		}
		if a.Principal != want {
			t.Errorf("%s of node %d recorded as %s, want %s", a.Action, a.PK, a.Principal, want)
		}
	}
	var txs int
	if err := st.Pool().QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM node_changes WHERE row_id > $1`, changeID).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	if txs != 1 {
		t.Errorf("the group's change rows were written by %d transactions, want 1", txs)
	}
	if held := heldNodes(t, st); held != 10 {
		t.Errorf("%d nodes held after the group, want 10", held)
	}
}

// A group that the server fails (here one claim's audit entry, refused by
// a trigger) is rolled back whole and each operation run again alone: the
// failing one gets its own error, the others their nodes. Fault caught
// (tried once): the group's error given to every operation.
func TestGroupThatFailsRunsEachAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 1)
	refuseAudit(t, st)
	errs := make([]error, 4)
	got := make([][]registry.Node, 4)
	ops := make([]func(), 4)
	for i := range ops {
		actor := scheduler(i)
		if i == 2 {
			actor.Sub = "refused"
		}
		ops[i] = func() { got[i], errs[i] = st.ClaimNodes(ctx, actor, registry.Claim{Job: int64(10 + i), Count: 2}) }
	}
	asGroup(t, st, ops...)
	for i, err := range errs {
		switch {
		case i == 2 && (err == nil || !strings.Contains(err.Error(), "refused by the test")):
			t.Errorf("the refused claim: %v, want the trigger's error", err)
		case i != 2 && (err != nil || len(got[i]) != 2):
			t.Errorf("claim %d beside the refused one: %d nodes, %v; want 2", i, len(got[i]), err)
		}
	}
	if n := log.grouped(); n != 0 {
		t.Errorf("%d operations counted as committed grouped, want 0", n)
	}
	if got := log.get(); len(got) != 1 || !strings.HasPrefix(got[0], "0 ") || !strings.Contains(got[0], "refused by the test") {
		t.Errorf("ObserveGroup told %q, want one failed group with the trigger's error", got)
	}
	if held := heldNodes(t, st); held != 6 {
		t.Errorf("%d nodes held, want 6", held)
	}
}

// A queued claim whose caller gives up leaves the queue at once, answered
// with the context's error, and is never run. Fault caught (tried once):
// the waiter left in the queue (it then ran when the queue went).
func TestGroupQueuedClaimCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 1)
	release := store.HoldGroups(st)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := st.ClaimNodes(cctx, sys, registry.Claim{Job: 1, Count: 1})
		done <- err
	}()
	waitQueued(t, st, 1)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled claim: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled claim not answered after 10 s")
	}
	if n := store.GroupQueued(st); n != 0 {
		t.Errorf("%d operations queued after the cancel, want 0", n)
	}
	release()
	// Nothing is left to run: a claim now runs alone and takes the first node.
	got, err := st.ClaimNodes(ctx, sys, registry.Claim{Job: 2, Count: 8})
	if err != nil || len(got) != 8 {
		t.Fatalf("claim of every node after the cancel: %d nodes, %v", len(got), err)
	}
}

// Many schedulers claiming and releasing at once, with no hold: the
// operations group by themselves, every one is answered right, and no
// node is ever held by two jobs: each node's change rows (in row order,
// which the row lock makes its commit order) alternate claimed and
// released, each release of the job claimed before. Fault caught (tried
// once): no grouping.
func TestGroupedClaimsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 2) // 16 nodes, fewer than the schedulers
	changeID, _ := lastIDs(t, st)
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for w := range 24 {
		wg.Go(func() {
			for i := range 40 {
				job := int64(w*1000 + i + 1)
				got, err := st.ClaimNodes(ctx, scheduler(w), registry.Claim{Job: job, Count: 1})
				if errors.Is(err, registry.ErrConflict) {
					continue
				}
				if err != nil || len(got) != 1 || got[0].CurrentJob == nil || *got[0].CurrentJob != job {
					errs <- fmt.Errorf("claim for job %d: %+v, %v", job, got, err)
					return
				}
				released, _, err := st.ReleaseNodes(ctx, scheduler(w), registry.Release{Job: job, Nodes: []int64{got[0].PK}})
				if err != nil || len(released) != 1 {
					errs <- fmt.Errorf("release of node %d by job %d: %d released, %v", got[0].PK, job, len(released), err)
					return
				}
			}
		})
	}
	waitDone(t, &wg)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if log.grouped() == 0 {
		t.Error("no operation was committed in a group")
	}
	rows, err := st.Pool().Query(ctx, `SELECT node_pk, kind, coalesce((doc->>'current_job')::bigint, 0) FROM node_change_events WHERE row_id > $1 ORDER BY row_id, ord`, changeID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	holder := map[int64]int64{}
	var claims int
	for rows.Next() {
		var pk, job int64
		var kind string
		if err := rows.Scan(&pk, &kind, &job); err != nil {
			t.Fatal(err)
		}
		switch {
		case kind == "claimed" && holder[pk] != 0:
			t.Fatalf("node %d claimed by job %d while job %d held it", pk, job, holder[pk])
		case kind == "claimed":
			holder[pk] = job
			claims++
		case kind == "released" && holder[pk] == 0:
			t.Fatalf("node %d released while no job held it", pk)
		case kind == "released":
			holder[pk] = 0
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if claims == 0 {
		t.Fatal("no claim recorded")
	}
}

// A group whose connection ends while its COMMIT is on the way (here the
// server terminates the session from a deferred trigger, which runs at
// COMMIT) may have committed or not: each of its operations fails with the error,
// none is run again (that could hold a job's nodes twice), and nothing is
// held. Fault caught (tried once): the operations run again alone.
func TestGroupLostAtCommitFailsEach(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 1)
	if _, err := st.Pool().Exec(ctx, `
		CREATE FUNCTION end_session() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.principal = 'sched-0' THEN
				PERFORM pg_terminate_backend(pg_backend_pid());
				PERFORM pg_sleep(5);
			END IF;
			RETURN NEW;
		END $$;
		CREATE CONSTRAINT TRIGGER end_session AFTER INSERT ON audit_log DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION end_session()`); err != nil {
		t.Fatal(err)
	}
	_, errs := claimsAsGroup(t, st, 3, 10, 1)
	for i, err := range errs {
		if err == nil {
			t.Errorf("claim %d of the lost group: no error", i)
		}
	}
	if held := heldNodes(t, st); held != 0 {
		t.Errorf("%d nodes held after the lost group, want 0", held)
	}
}

// A group whose release waits for a row lock another transaction holds
// gives way after groupLockTimeout: rolled back, each operation run again
// alone, so the claims beside the release are answered while the lock is
// still held, and the release once it is let go. Fault caught (tried
// once): no lock timeout (the claims wait with the release).
func TestGroupLockWaitRunsEachAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 1)
	held, err := st.ClaimNodes(ctx, scheduler(7), registry.Claim{Job: 7, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	locker, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT 1 FROM nodes WHERE pk = $1 FOR UPDATE`, held[0].PK); err != nil {
		t.Fatal(err)
	}

	release := store.HoldGroups(st)
	released := make(chan error, 1)
	go func() {
		_, _, err := st.ReleaseNodes(ctx, scheduler(7), registry.Release{Job: 7, Nodes: []int64{held[0].PK}})
		released <- err
	}()
	waitQueued(t, st, 1)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = st.ClaimNodes(ctx, scheduler(i), registry.Claim{Job: int64(20 + i), Count: 1}) })
	}
	waitQueued(t, st, 3)
	release()
	waitDone(t, &wg) // within 10 s, the lock still held
	for i, err := range errs {
		if err != nil {
			t.Errorf("claim %d beside the waiting release: %v", i, err)
		}
	}
	select {
	case err := <-released:
		t.Fatalf("the release ended (%v) while its node was locked", err)
	default:
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-released:
		if err != nil {
			t.Errorf("release after the lock was let go: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("release not answered 10 s after the lock was let go")
	}
	if got := log.get(); len(got) != 1 || !strings.Contains(got[0], "55P03") {
		t.Errorf("ObserveGroup told %q, want one group failed by the lock timeout (55P03)", got)
	}
}

// waitActivity waits, at most 10 s, until the query (a count over
// pg_locks or pg_stat_activity) counts at least one backend.
func waitActivity(t *testing.T, st *store.Store, what, query string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := st.Pool().QueryRow(context.Background(), query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A group locks rows in the order its requests came, so it can deadlock
// with a writer that locks them in pk order (here a cordon of nodes 1 and
// 2, against a group releasing node 2 and then node 1). The group must be
// the one that gives way, within its lock timeout, before PostgreSQL's
// deadlock check (deadlock_timeout, 1 s after the cordon began to wait)
// fails the cordon: then the cordon commits, and the group's releases,
// run again alone, commit too. A trigger holds the group between its two
// locks (on an advisory lock the test holds, waited for without a lock
// timeout) until the cordon waits for node 2. Fault caught (tried once):
// the group's lock timeout raised above deadlock_timeout (the cordon
// failed with "deadlock detected").
func TestGroupGivesWayInDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 1)
	// Each job is its releaser's: scheduler(i) releases the i-th below.
	one, err := st.ClaimNodes(ctx, scheduler(1), registry.Claim{Job: 71, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	two, err := st.ClaimNodes(ctx, scheduler(0), registry.Claim{Job: 72, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if one[0].PK != 1 || two[0].PK != 2 {
		t.Fatalf("claimed nodes %d and %d, want 1 and 2", one[0].PK, two[0].PK)
	}
	if _, err := st.Pool().Exec(ctx, `
		CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE saved text := current_setting('lock_timeout');
		BEGIN
			PERFORM set_config('lock_timeout', '0', true);
			PERFORM pg_advisory_xact_lock_shared(4242);
			PERFORM set_config('lock_timeout', saved, true);
			RETURN NEW;
		END $$;
		CREATE TRIGGER gate BEFORE UPDATE ON nodes FOR EACH ROW
			WHEN (OLD.pk = 2 AND NEW.current_job IS NULL) EXECUTE FUNCTION gate()`); err != nil {
		t.Fatal(err)
	}
	gate, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	opened := false
	open := func() {
		if !opened {
			opened = true
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer open()

	release := store.HoldGroups(st)
	var wg sync.WaitGroup
	releaseErrs := make([]error, 2)
	for i, job := range []int64{72, 71} { // node 2, then node 1
		wg.Go(func() {
			got, _, err := st.ReleaseNodes(ctx, scheduler(i), registry.Release{Job: job})
			if err == nil && len(got) != 1 {
				err = fmt.Errorf("released %d nodes, want 1", len(got))
			}
			releaseErrs[i] = err
		})
		waitQueued(t, st, i+1)
	}
	release()
	waitActivity(t, st, "the group holding node 2, at the gate",
		`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	cordoned := make(chan error, 1)
	go func() {
		got, _, err := st.CordonNodes(ctx, sys, registry.Cordon{Nodes: []int64{1, 2}, Reason: "fan"})
		if err == nil && len(got) != 2 {
			err = fmt.Errorf("cordoned %d nodes, want 2", len(got))
		}
		cordoned <- err
	}()
	waitActivity(t, st, "the cordon holding node 1, waiting for node 2",
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		   AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')`)
	open() // the group goes on to node 1: a deadlock
	select {
	case err := <-cordoned:
		if err != nil {
			t.Errorf("the cordon caught in a deadlock with a group: %v; want the group to give way", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cordon not answered within 10 s")
	}
	waitDone(t, &wg)
	for i, err := range releaseErrs {
		if err != nil {
			t.Errorf("release %d of the group: %v", i, err)
		}
	}
	if got := log.get(); len(got) != 1 || !strings.Contains(got[0], "55P03") {
		t.Errorf("ObserveGroup told %q, want one group failed by its lock timeout (55P03)", got)
	}
	if n := heldNodes(t, st); n != 0 {
		t.Errorf("%d nodes held after both releases, want 0", n)
	}
}

// A claim whose caller gives up while its group's statements run is
// withdrawn from the group's transaction: it fails with its context's
// error and leaves no trace (the node it took is back as it was, version
// and updated_at included, with no change-log or audit row), and the
// others commit in the same transaction. Once the records are on their
// way with the COMMIT, the claim commits and its caller gets its nodes,
// however late it looks (the API gives back what a departed client's
// claim took). Here a trigger makes the claim's update, or the group's
// records, slow while its context runs out. Faults caught (each tried
// once): the group committed with the abandoned claim in it; the
// withdrawal left the node's version moved; the group rolled back and
// ran again (clients that abandon claims then cost every honest
// scheduler beside them a transaction more).
func TestGroupAbandonedClaimCommitsNothing(t *testing.T) {
	t.Parallel()
	for _, slow := range []struct {
		name, trigger string
		committed     bool // whether the abandoned claim commits
		probe         bool // the caller is gone by its probe (registry.Gone), its context not done
	}{
		{"while its update runs", `BEFORE UPDATE ON nodes FOR EACH ROW WHEN (NEW.current_job = 666)`, false, false},
		{"gone by its probe", `BEFORE UPDATE ON nodes FOR EACH ROW WHEN (NEW.current_job = 666)`, false, true},
		{"while the records are written", `BEFORE INSERT ON audit_log FOR EACH ROW WHEN (NEW.principal = 'sched-6')`, true, false},
	} {
		t.Run(slow.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st, log := observedFleet(t, 1)
			slowTrigger(t, st, `TRIGGER slow `+slow.trigger)
			// Every node lost a job's lease once: a claim clears that, a
			// withdrawal restores it.
			if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET expired_job = 99`); err != nil {
				t.Fatal(err)
			}
			before := nodeStates(t, st)
			changes, audits := lastIDs(t, st)
			var abandoned error
			errs := make([]error, 2)
			claim := func(i int) func() {
				return func() { _, errs[i] = st.ClaimNodes(ctx, scheduler(i), registry.Claim{Job: int64(30 + i), Count: 1}) }
			}
			want := error(context.DeadlineExceeded)
			asGroup(t, st, func() {
				cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				if slow.probe {
					start := time.Now()
					cctx = registry.WithGoneProbe(ctx, func() bool { return time.Since(start) > 200*time.Millisecond })
					want = context.Canceled
				}
				_, abandoned = st.ClaimNodes(cctx, scheduler(6), registry.Claim{Job: 666, Count: 1})
			}, claim(0), claim(1))
			for i, err := range errs {
				if err != nil {
					t.Errorf("claim %d beside the abandoned one: %v", i, err)
				}
			}
			if n := log.grouped(); n != 2+btoi(slow.committed) {
				t.Errorf("%d operations committed grouped, want %d, in one transaction", n, 2+btoi(slow.committed))
			}
			if slow.committed {
				if abandoned != nil || heldByJob(t, st, 666) != 1 {
					t.Errorf("the claim whose COMMIT was sent: %v, %d held; want it committed", abandoned, heldByJob(t, st, 666))
				}
				return
			}
			if !errors.Is(abandoned, want) {
				t.Errorf("the abandoned claim: %v, want %v", abandoned, want)
			}
			if n := heldByJob(t, st, 666); n != 0 {
				t.Errorf("%d nodes held by the abandoned claim's job, want 0", n)
			}
			if held := heldNodes(t, st); held != 2 {
				t.Errorf("%d nodes held, want the other two claims'", held)
			}
			if drift := hostFreeDrift(t, st); len(drift) > 0 {
				t.Errorf("host_free after the withdrawal: %v", drift)
			}
			after := nodeStates(t, st)
			for pk, was := range before {
				if now := after[pk]; now != was && !strings.Contains(now, "job 3") {
					t.Errorf("node %d: %s before, %s after; want the withdrawn claim's node as it was", pk, was, now)
				}
			}
			var n int
			if err := st.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM node_change_events WHERE row_id > $1 AND doc->>'current_job' = '666')
				+ (SELECT count(*) FROM audit_log WHERE id > $2 AND principal = 'sched-6')`, changes, audits).Scan(&n); err != nil || n != 0 {
				t.Errorf("%d change-log and audit rows of the withdrawn claim (%v), want none", n, err)
			}
		})
	}
}

// nodeStates is each node's job, lease, expired job, version and
// updated_at, by pk.
func nodeStates(t *testing.T, st *store.Store) map[int64]string {
	t.Helper()
	rows, _ := st.Pool().Query(context.Background(), `SELECT pk, format('job %s lease %s expired %s version %s updated %s',
		current_job, lease_expires_at, expired_job, version, updated_at) FROM nodes`)
	m := map[int64]string{}
	var pk int64
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&pk, &state}, func() error { m[pk] = state; return nil }); err != nil {
		t.Fatal(err)
	}
	return m
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A panic while a group runs (here in its observer) ends neither the
// process nor its callers' waits: each operation fails, its outcome
// unknown. Fault caught (tried once): no recovery in the runner.
func TestGroupPanicFailsEach(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{ObserveGroup: func(int, error) { panic("observer") }})
	gangFleet(t, st, 1)
	_, errs := claimsAsGroup(t, st, 2, 40, 1)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "outcome unknown") {
			t.Errorf("claim %d of the group that panicked: %v, want its outcome unknown", i, err)
		}
	}
}

// Groups run side by side in proportion to the pool: half its
// connections, at least two. Fault caught (tried once): a fixed number.
func TestGroupRunnersFollowPool(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.New(t)
	for _, c := range []struct {
		conns int32
		want  int
	}{{1, 2}, {4, 2}, {5, 2}, {16, 8}} {
		st := pgtest.Open(t, dbURL, store.Options{MaxConns: c.conns})
		if got := store.GroupRunners(st); got != c.want {
			t.Errorf("a pool of %d: %d runners, want %d", c.conns, got, c.want)
		}
	}
}

// A short claim's conflict never counts as many free nodes as were asked
// for (the second look can see nodes other claims gave back meanwhile; an
// outside tester saw "only 1 … 1 requested"). Fault caught (tried once):
// the count printed as found.
func TestShortClaimMessage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		found, requested int
		want             string
	}{
		{2, 4, "only 2 free node(s) match and are not being claimed right now; 4 requested"},
		{0, 1, "only 0 free node(s) match"},
		{1, 1, "fewer than 1 free node(s) matched that no other claim was taking at that moment; try again"},
		{5, 4, "fewer than 4 free node(s) matched"},
	} {
		err := store.ShortClaim(c.found, c.requested)
		if !errors.Is(err, registry.ErrConflict) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("found %d of %d: %v, want a conflict saying %q", c.found, c.requested, err, c.want)
		}
	}
}

// A release of a job waits for that job's claims under way on the
// replica. Here a claim's caller gives up while its COMMIT is on its way
// (a deferred trigger makes the COMMIT slow), and at once releases the
// job; the release must leave nothing held. In a group, the COMMIT is sent
// whatever the caller does, so the claim commits and the release frees
// its node. Alone, once its COMMIT is sent the caller giving up no longer
// cuts the call short, so the claim's end, which the release waits for,
// is its real outcome (with the round trip cancelled, PostgreSQL's cancel
// reaches this test's slow COMMIT and rolls it back, which is right too;
// a COMMIT already flushing cannot be cancelled, and that one an outside
// tester's load caught committing after the release had looked). Fault
// caught (tried once): the release not waiting (both cases: the release
// answered nothing and the node stayed held).
func TestReleaseWaitsForItsJobsClaims(t *testing.T) {
	t.Parallel()
	for _, grouped := range []bool{true, false} {
		t.Run(fmt.Sprintf("grouped=%t", grouped), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := pgtest.Open(t, pgtest.New(t), store.Options{})
			gangFleet(t, st, 1)
			slowTrigger(t, st, `CONSTRAINT TRIGGER slow AFTER INSERT ON audit_log DEFERRABLE INITIALLY DEFERRED
				FOR EACH ROW WHEN (NEW.principal = 'sched-6')`)
			abandon := func() {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				_, _ = st.ClaimNodes(cctx, scheduler(6), registry.Claim{Job: 666, Count: 1})
			}
			var wg sync.WaitGroup
			if grouped {
				release := store.HoldGroups(st)
				wg.Go(abandon)
				waitQueued(t, st, 1)
				wg.Go(func() { _, _ = st.ClaimNodes(ctx, scheduler(0), registry.Claim{Job: 30, Count: 1}) })
				waitQueued(t, st, 2)
				release()
			} else {
				wg.Go(abandon)
			}
			time.Sleep(400 * time.Millisecond) // the caller has given up; the COMMIT is on its way
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			released, _, err := st.ReleaseNodes(rctx, scheduler(6), registry.Release{Job: 666})
			if err != nil {
				t.Fatal(err)
			}
			waitDone(t, &wg)
			held := heldByJob(t, st, 666)
			if held != 0 || grouped && len(released) != 1 {
				t.Errorf("the release answered %d node(s) and %d stay held by the job; want nothing held (in a group: the claim's node released)",
					len(released), held)
			}
		})
	}
}

// A release waiting for its job's claims gives up with its own context.
// Fault caught (tried once): the wait not bounded by the context.
func TestReleaseWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 1)
	release := store.HoldGroups(st)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = st.ClaimNodes(ctx, scheduler(6), registry.Claim{Job: 666, Count: 1}) })
	waitQueued(t, st, 1)
	defer waitDone(t, &wg)
	defer release()
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := st.ReleaseNodes(rctx, scheduler(6), registry.Release{Job: 666})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("release while the job's claim waits: %v, want its context's deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the release did not give up within 5 s of its context's end")
	}
}

// A lone claim whose caller gives up during its first round trip commits
// nothing, answers its context's error (not "database unavailable"), and
// is rolled back on its connection: the pool makes no new one. Fault
// caught (found by a review): the roll-back sent under the caller's
// cancelled context, so the pool threw the connection away.
func TestLoneAbandonedClaimKeepsConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{MaxConns: 1})
	gangFleet(t, st, 1)
	slowTrigger(t, st, `TRIGGER slow BEFORE UPDATE ON nodes FOR EACH ROW WHEN (NEW.current_job = 2)`)
	if _, err := st.ClaimNodes(ctx, scheduler(1), registry.Claim{Job: 1, Count: 1}); err != nil {
		t.Fatal(err)
	}
	conns := st.Pool().Stat().NewConnsCount()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := st.ClaimNodes(cctx, scheduler(2), registry.Claim{Job: 2, Count: 1})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the abandoned claim: %v, want its context's deadline", err)
	}
	if _, err := st.ClaimNodes(ctx, scheduler(3), registry.Claim{Job: 3, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if n := st.Pool().Stat().NewConnsCount(); n != conns {
		t.Errorf("the abandoned lone claim cost %d new connection(s)", n-conns)
	}
	if n := heldByJob(t, st, 2); n != 0 {
		t.Errorf("the abandoned claim's job holds %d nodes", n)
	}
}

// A claim alone whose caller is gone by its probe (registry.Gone) before
// it starts sends nothing: it fails with context.Canceled, having not
// even tried to insert its job's row. Fault caught (tried once): the
// probe asked only after the statements.
func TestLoneClaimOfGoneCallerRunsNothing(t *testing.T) {
	t.Parallel()
	st, _ := observedFleet(t, 1)
	// A sequence counts the attempts to insert a job's row: a roll-back
	// does not undo nextval.
	if _, err := st.Pool().Exec(context.Background(), `
		CREATE SEQUENCE job_inserts;
		CREATE FUNCTION count_job_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('job_inserts'); RETURN NEW; END $$;
		CREATE TRIGGER count_job_insert BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION count_job_insert()`); err != nil {
		t.Fatal(err)
	}
	ctx := registry.WithGoneProbe(context.Background(), func() bool { return true })
	if _, err := st.ClaimNodes(ctx, scheduler(1), registry.Claim{Job: 7, Count: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("claim of a gone caller: %v, want context.Canceled", err)
	}
	var ran bool
	if err := st.Pool().QueryRow(context.Background(), `SELECT is_called FROM job_inserts`).Scan(&ran); err != nil || ran {
		t.Errorf("the claim of a gone caller ran its statements (%v)", err)
	}
}

// A claim of job 5 whose caller goes once its statements ran, followed
// in the same group by a release of job 5: the release takes the claim's
// node in the same transaction, so the claim is not withdrawn (that would
// leave a release of a node nobody saw claimed); both commit, with their
// records, and the history reads claimed then released. Fault caught
// (tried once, found by a review): the claim withdrawn, its undo matching
// nothing, the node's expired_job lost and a lone 'released' record.
func TestGoneClaimReleasedLaterInItsGroupCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _ := observedFleet(t, 1)
	changes, _ := lastIDs(t, st)
	var looks atomic.Int32
	cctx := registry.WithGoneProbe(ctx, func() bool { return looks.Add(1) > 1 }) // gone after the group's first look
	cerr, claimed, rerr, released := store.RunClaimThenRelease(st, cctx, scheduler(1), registry.Claim{Job: 5, Count: 1},
		scheduler(1), registry.Release{Job: 5})
	if cerr != nil || rerr != nil || len(claimed) != 1 || len(released) != 1 || claimed[0].PK != released[0].PK {
		t.Fatalf("claim %v (%d nodes), release %v (%d nodes); want the claim committed and released", cerr, len(claimed), rerr, len(released))
	}
	rows, _ := st.Pool().Query(ctx, `SELECT kind FROM node_change_events WHERE row_id > $1 AND node_pk = $2 ORDER BY row_id, ord`, changes, claimed[0].PK)
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(kinds, []string{"claimed", "released"}) {
		t.Errorf("the node's history: %v (%v), want claimed then released", kinds, err)
	}
	if held := heldNodes(t, st); held != 0 {
		t.Errorf("%d nodes held", held)
	}
}

// A withdrawn claim run under an Idempotency-Key whose lease ran out does
// not have its key checked before the group's COMMIT: it commits nothing
// there, and the others commit together. Fault caught (tried once, found
// by a review): its failed check rolled the group back and every other
// claim ran again alone.
func TestWithdrawnClaimsKeyIsNotChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, log := observedFleet(t, 1)
	if _, err := st.Pool().Exec(ctx, `INSERT INTO idempotency_keys (principal, key, fingerprint, request_id, running_until, keep_until)
		VALUES ('sched-6', 'k', '\x00', 'r1', now() - interval '1 second', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	var abandoned error
	errs := make([]error, 2)
	claim := func(i int) func() {
		return func() { _, errs[i] = st.ClaimNodes(ctx, scheduler(i), registry.Claim{Job: int64(30 + i), Count: 1}) }
	}
	asGroup(t, st, func() {
		var looks atomic.Int32
		cctx := registry.WithKeyHold(ctx, registry.KeyHold{Principal: "sched-6", Key: "k", RequestID: "r1"})
		cctx = registry.WithGoneProbe(cctx, func() bool { return looks.Add(1) > 1 })
		_, abandoned = st.ClaimNodes(cctx, scheduler(6), registry.Claim{Job: 666, Count: 1})
	}, claim(0), claim(1))
	if !errors.Is(abandoned, context.Canceled) || errs[0] != nil || errs[1] != nil {
		t.Errorf("withdrawn: %v; the others: %v", abandoned, errs)
	}
	if n := log.grouped(); n != 2 {
		t.Errorf("%d operations committed grouped, want the other 2", n)
	}
}
