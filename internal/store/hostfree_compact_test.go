package store_test

import (
	"context"
	"testing"
	"time"

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

// A fold that moves an import's worth of deltas has the table vacuumed,
// which cuts its emptied file down, and the counts stay equal to a
// recount, the deltas written meanwhile included.
func TestFoldVacuumsDeltas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st, 60000)
	// A real change pending with the bloat: one node claimed.
	if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET current_job = 9 WHERE pk = (SELECT min(pk) FROM nodes)`); err != nil {
		t.Fatal(err)
	}
	if got := deltaFileBytes(t, st); got < 2<<20 {
		t.Fatalf("host_free_delta is %d bytes before the fold; the test wants it bloated", got)
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if got := deltaFileBytes(t, st); got != 0 {
		t.Errorf("host_free_delta is %d bytes after the fold, want 0 (vacuumed)", got)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts after the fold: %v", drift)
	}
	// Writes afterwards are counted as before.
	if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET current_job = NULL WHERE current_job = 9`); err != nil {
		t.Fatal(err)
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts after a release and another fold: %v", drift)
	}
}

// The steady folds of claims (fewer deltas than an import) leave the
// vacuum to autovacuum: no pass waits on a vacuum's truncation.
func TestFoldSmallDoesNotVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st, 5000)
	before := deltaFileBytes(t, st)
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if got := deltaFileBytes(t, st); got != before {
		t.Errorf("host_free_delta went from %d to %d bytes after a fold of 5,000 deltas; want no vacuum", before, got)
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
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st, 60000)
	writer, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	if _, err := writer.Exec(ctx, `UPDATE nodes SET current_job = 7 WHERE pk = (SELECT min(pk) FROM nodes)`); err != nil {
		t.Fatal(err)
	}
	foldCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := st.FoldHostFree(foldCtx); err != nil {
		t.Fatalf("fold beside an open writer: %v", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts after the writer committed: %v", drift)
	}
}
