package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// bloatDeltas leaves host_free_delta's file several MiB long and empty of
// anything that changes a count: pairs of +1 and -1 of one class, folded
// away, as a million nodes' import or a day of claims leaves it.
func bloatDeltas(t *testing.T, st *store.Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
		SELECT '10.30.0.0', 1, 80, 1024, 'api', CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END
		FROM generate_series(1, 60000) g`); err != nil {
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

// A fold that finds host_free_delta's file grown empties it, and the
// counts stay equal to a recount, the deltas written meanwhile included.
func TestFoldCompactsDeltas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st)
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
		t.Errorf("host_free_delta is %d bytes after the fold, want 0 (compacted)", got)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts after compacting: %v", drift)
	}
	// Writes after the compaction are counted as before.
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

// While a writer holds host_free_delta (a claim not yet committed), a
// fold does not wait for it beyond a moment: it folds without compacting,
// and the writer's delta is folded by a later pass.
func TestFoldCompactGivesWayToWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	gangFleet(t, st, 4)
	bloatDeltas(t, st)
	writer, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	if _, err := writer.Exec(ctx, `UPDATE nodes SET current_job = 7 WHERE pk = (SELECT min(pk) FROM nodes)`); err != nil {
		t.Fatal(err)
	}
	foldCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := st.FoldHostFree(foldCtx); err != nil {
		t.Fatalf("fold beside an open writer: %v (after %v)", err, time.Since(start))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the fold waited %v for the writer", took)
	}
	if got := deltaFileBytes(t, st); got == 0 {
		t.Error("host_free_delta was truncated under an open writer")
	}
	// The writer commits normally, and the next fold compacts.
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.FoldHostFree(ctx); err != nil {
		t.Fatal(err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Errorf("counts after the writer committed: %v", drift)
	}
	if got := deltaFileBytes(t, st); got != 0 {
		t.Errorf("host_free_delta is %d bytes once the writer is gone, want 0", got)
	}
}
