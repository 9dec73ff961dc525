package store

import (
	"context"
	"errors"
	"fmt"
)

// FoldHostFree folds the committed deltas of host_free_delta into host_free
// (migration 00013), keeping the claims' read of the counts short. The
// lifecycle sweeper calls it on every pass. Folds never run at once: each
// transaction of one takes foldLockID without waiting, and a fold that
// finds it taken (an import folding its own deltas, another replica's
// sweeper) leaves the deltas to the next pass. A count that falls below
// zero means a write bypassed the triggers: an error.
//
// It folds a chunk of classes a transaction (every delta of each), so that
// a backlog (an import's or a mass cordon's: one delta a host) never
// becomes one long transaction that outlives the sweeper's lease and is
// rolled back, leaving every gang claim to sum the backlog on its own.
func (s *Store) FoldHostFree(ctx context.Context) error {
	var moved int64
	for {
		var n, classes int64
		err := s.WithTx(ctx, func(tx *Store) error {
			var locked bool
			if err := tx.db.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(foldLockID)).Scan(&locked); err != nil || !locked {
				return err
			}
			var err error
			n, classes, err = tx.foldDeltas(ctx, foldChunkOf(ctx))
			return err
		})
		if err != nil {
			s.countFolded(moved) // what the chunks before moved is folded
			return fmt.Errorf("store: fold host_free: %w", translate(err))
		}
		moved += n
		if f, ok := ctx.Value(foldObserverKey{}).(func()); ok {
			f()
		}
		// Fewer classes than a chunk: the table is folded as it was when
		// this transaction began. Not "until none is left": under steady
		// claims new deltas keep coming, and the pass would never end.
		if classes < foldChunkOf(ctx) {
			break
		}
	}
	return s.vacuumDeltas(ctx, moved)
}

// foldAllDeltas folds every delta visible to the transaction of s, its own
// included, and returns how many it moved: an import folds what it wrote
// before it commits, so that no claim ever sums its deltas. It waits for
// foldLockID, which it then holds until the transaction ends.
func (s *Store) foldAllDeltas(ctx context.Context) (int64, error) {
	if _, err := s.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(foldLockID)); err != nil {
		return 0, err
	}
	var moved int64
	for {
		n, classes, err := s.foldDeltas(ctx, foldChunkOf(ctx))
		moved += n
		if err != nil || classes < foldChunkOf(ctx) {
			return moved, err
		}
	}
}

// foldLockID serializes the folds of host_free_delta (transaction-level
// advisory lock): two at once could each hold a row lock the other waits
// for (a fabric_free bucket and a delta), and one that skipped the
// other's rows would stop before it had folded its own.
const foldLockID = 0x7265676973746664

// foldDeltas moves into host_free and fabric_free every delta of at most
// limit classes (every delta of a class at once: a part of a class's
// deltas can sum below zero, a claim's -1 without the release before it,
// since rows lie in no particular order), in the transaction of s, and
// returns how many it moved.
func (s *Store) foldDeltas(ctx context.Context, limit int64) (moved, classes int64, err error) {
	var lowest *int64
	// Classes by rank, rows by ctid: no join with host_free_delta, which
	// has no index and whose statistics swing from an import's hundred
	// thousand rows to a handful, so a join could be planned as a scan of
	// the table per class.
	err = s.db.QueryRow(ctx, `
		WITH moved AS (
			DELETE FROM host_free_delta WHERE ctid = ANY (ARRAY(
				SELECT ctid FROM (
					SELECT ctid, dense_rank() OVER (ORDER BY ip, hardware_generation, gpu_mem, cpu_mem, source, fabric) AS class
					FROM host_free_delta) d
				WHERE class <= $1))
			RETURNING ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta
		), sums AS (
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, sum(delta)::integer AS delta
			FROM moved GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(delta) <> 0
		), folded AS (
			INSERT INTO host_free AS h (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, free)
			SELECT * FROM sums ORDER BY 1, 2, 3, 4, 5, 6
			ON CONFLICT (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric) DO UPDATE SET free = h.free + excluded.free
			RETURNING ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, free
		), buckets AS (
			-- Each class that moved leaves its old count's bucket of
			-- fabric_free (migration 00021) and joins its new one.
			SELECT f.fabric, f.hardware_generation, f.gpu_mem, f.cpu_mem, f.source, b.free, sum(b.hosts)::integer AS hosts
			FROM folded f JOIN sums s USING (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric),
				LATERAL (VALUES (f.free - s.delta, -1), (f.free, 1)) AS b(free, hosts)
			WHERE f.fabric <> '' AND b.free > 0
			GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(b.hosts) <> 0
		), summed AS (
			INSERT INTO fabric_free AS x (fabric, hardware_generation, gpu_mem, cpu_mem, source, free, hosts)
			SELECT * FROM buckets ORDER BY 1, 2, 3, 4, 5, 6
			ON CONFLICT (fabric, hardware_generation, gpu_mem, cpu_mem, source, free) DO UPDATE SET hosts = x.hosts + excluded.hosts
			RETURNING hosts
		)
		SELECT least((SELECT min(free) FROM folded), (SELECT min(hosts) FROM summed)), (SELECT count(*) FROM moved),
			(SELECT count(*) FROM (SELECT DISTINCT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric FROM moved) c)`,
		limit).Scan(&lowest, &moved, &classes)
	if err != nil {
		return 0, 0, err
	}
	if lowest == nil || *lowest > 0 {
		return moved, classes, nil
	}
	if *lowest < 0 {
		return 0, 0, errors.New("a free count fell below zero: a write to nodes bypassed host_free's triggers")
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM host_free WHERE free <= 0`); err != nil {
		return 0, 0, err
	}
	_, err = s.db.Exec(ctx, `DELETE FROM fabric_free WHERE hosts <= 0`)
	return moved, classes, err
}

// vacuumDeltas has host_free_delta vacuumed once folds have moved enough
// deltas out of it (moved now): what they leave behind is vacuumed here,
// not left to autovacuum, since gang claims read the whole of
// host_free_delta's file (docs/design.md). A role that does not own the
// table gets a warning from the server, and nothing is done.
func (s *Store) vacuumDeltas(ctx context.Context, moved int64) error {
	if s.inTx || s.unvacuumed == nil {
		return nil // VACUUM cannot run in a transaction block
	}
	unvacuumed := s.unvacuumed.Add(moved)
	var vacuum string
	switch {
	case moved >= deltaVacuumRows:
		// An import's worth: the emptied file is cut down as well, which
		// waits (at most 5 s) for a moment without writers to the table.
		vacuum = `VACUUM host_free_delta`
	case unvacuumed >= deltaReuseRows:
		// The steady claims' deltas: their space is made reusable, so the
		// file stops growing, without the cut and its wait.
		vacuum = `VACUUM (TRUNCATE false) host_free_delta`
	default:
		return nil
	}
	s.unvacuumed.Add(-unvacuumed)
	if _, err := s.db.Exec(ctx, vacuum); err != nil {
		return fmt.Errorf("store: vacuum host_free_delta: %w", translate(err))
	}
	return nil
}

// countFolded adds moved to the deltas folded since the last vacuum.
func (s *Store) countFolded(moved int64) {
	if s.unvacuumed != nil {
		s.unvacuumed.Add(moved)
	}
}

// foldChunk is how many classes one transaction of a fold moves the deltas
// of.
const foldChunk = 20_000

type foldChunkKey struct{}

// foldObserverKey carries a test's func, called after each transaction
// of FoldHostFree (export_test.go).
type foldObserverKey struct{}

// foldChunkOf is the fold chunk of the folds run under ctx: foldChunk, or
// a test's own (export_test.go).
func foldChunkOf(ctx context.Context) int64 {
	if n, ok := ctx.Value(foldChunkKey{}).(int64); ok && n > 0 {
		return n
	}
	return foldChunk
}

// deltaVacuumRows is how many deltas one fold must move before it has
// the table vacuumed and its file cut down, and deltaReuseRows how many
// folds must have moved since the last vacuum before one has the space
// made reusable (see FoldHostFree).
const (
	deltaVacuumRows = 10_000
	deltaReuseRows  = 2_000
)
