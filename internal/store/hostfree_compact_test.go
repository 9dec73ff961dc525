package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// bloatDeltas appends rows deltas that change no count (pairs of +1 and -1
// of one class): 60,000 make the file several MiB long, as a million
// nodes' import leaves it once folded.
func bloatDeltas(t *testing.T, st *store.Store, rows int) {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
		SELECT '10.30.0.0', 1, 80, 1024, 'api', CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END
		FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
}

func deltaFileBytes(t *testing.T, st *store.Store) int64 {
	t.Helper()
	var n int64
	if err := st.Pool().QueryRow(context.Background(), `SELECT pg_relation_size('host_free_delta')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// bloatedFleet is a store with 4 hosts of 8 nodes and rows pending deltas
// that change no count (see bloatDeltas).
func bloatedFleet(t *testing.T, rows int) *store.Store {
	t.Helper()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st, rows)
	return st
}

// setJob sets current_job to job on the node with the lowest pk (NULL:
// releases it), through db: the pool or an open transaction.
func setJob(t *testing.T, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, job *int64) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `UPDATE nodes SET current_job = $1 WHERE pk = (SELECT min(pk) FROM nodes)`, job); err != nil {
		t.Fatal(err)
	}
}

// foldMatches folds and requires the counts to equal a recount.
func foldMatches(t *testing.T, st *store.Store, when string) {
	t.Helper()
	if err := st.FoldHostFree(context.Background()); err != nil {
		t.Fatalf("fold %s: %v", when, err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts %s: %v", when, drift)
	}
}

// A fold that moves an import's worth of deltas has the table vacuumed,
// which cuts its emptied file down, and the counts stay equal to a
// recount, the deltas written meanwhile included.
func TestFoldVacuumsDeltas(t *testing.T) {
	t.Parallel()
	st := bloatedFleet(t, 60000)
	job := int64(9)
	setJob(t, st.Pool(), &job) // a real change pending with the bloat
	if got := deltaFileBytes(t, st); got < 2<<20 {
		t.Fatalf("host_free_delta is %d bytes before the fold; the test wants it bloated", got)
	}
	foldMatches(t, st, "after a large fold")
	if got := deltaFileBytes(t, st); got != 0 {
		t.Errorf("host_free_delta is %d bytes after the fold, want 0 (vacuumed)", got)
	}
	setJob(t, st.Pool(), nil) // writes afterwards are counted as before
	foldMatches(t, st, "after a release and another fold")
}

// vacuums is how many times host_free_delta was vacuumed by hand.
func vacuums(t *testing.T, st *store.Store) int64 {
	t.Helper()
	var n int64
	if err := st.Pool().QueryRow(context.Background(),
		`SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'host_free_delta'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The steady folds of claims (each fewer deltas than an import) have the
// table vacuumed once 2,000 deltas have been folded since the last
// vacuum, without cutting the file (no wait for a moment without
// writers): the space is reused, so the file stops growing. Faults
// caught (each tried once): no vacuum for small folds; a vacuum on every
// fold; the count of folded deltas not reset by a vacuum.
func TestFoldSteadyMakesSpaceReusable(t *testing.T) {
	t.Parallel()
	st := bloatedFleet(t, 1500)
	before := vacuums(t, st)
	foldMatches(t, st, "after a fold of 1,500 deltas")
	if n := vacuums(t, st) - before; n != 0 {
		t.Fatalf("%d vacuums after 1,500 deltas folded, want none yet", n)
	}
	bloatDeltas(t, st, 1500)
	grown := deltaFileBytes(t, st)
	foldMatches(t, st, "after 3,000 deltas folded in all")
	if n := vacuums(t, st) - before; n != 1 {
		t.Fatalf("%d vacuums after 3,000 deltas folded, want 1", n)
	}
	if got := deltaFileBytes(t, st); got != grown {
		t.Errorf("host_free_delta went from %d to %d bytes: want the file kept, not cut", grown, got)
	}
	bloatDeltas(t, st, 1500)
	if got := deltaFileBytes(t, st); got != grown {
		t.Errorf("host_free_delta grew from %d to %d bytes with the vacuumed space free to reuse", grown, got)
	}
	foldMatches(t, st, "after the space was reused")
	if n := vacuums(t, st) - before; n != 1 {
		t.Errorf("%d vacuums after 1,500 more deltas, want still 1 (the count starts again at each vacuum)", n)
	}
}

// The sweeper folds through the store of the lock it holds: the folded
// deltas are counted there too, and vacuumed. Fault caught (tried once):
// the lock's store made without the count (no vacuum ever from the
// sweeper).
func TestFoldThroughLockVacuums(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := bloatedFleet(t, 3000)
	before := vacuums(t, st)
	l, ok, err := st.TryLock(ctx, 4242)
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	defer l.Release(ctx)
	if err := l.Store().FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if n := vacuums(t, st) - before; n != 1 {
		t.Errorf("%d vacuums after 3,000 deltas folded through the lock's store, want 1", n)
	}
}

// A large fold inside a caller's transaction folds and leaves the vacuum
// out (VACUUM cannot run in a transaction block).
func TestFoldInTransactionDoesNotVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := bloatedFleet(t, 60000)
	if err := st.WithTx(ctx, func(tx *store.Store) error { return tx.FoldHostFree(ctx) }); err != nil {
		t.Fatalf("a large fold in a transaction: %v", err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts: %v", drift)
	}
}

// While a writer holds host_free_delta (a claim not yet committed), the
// vacuum after a large fold cannot cut the file; the fold still ends, in
// PostgreSQL's bound on that wait, and the writer's delta is folded later.
func TestFoldVacuumBesideWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := bloatedFleet(t, 60000)
	writer, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	job := int64(7)
	setJob(t, writer, &job)
	foldCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := st.FoldHostFree(foldCtx); err != nil {
		t.Fatalf("fold beside an open writer: %v", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	foldMatches(t, st, "after the writer committed")
}
