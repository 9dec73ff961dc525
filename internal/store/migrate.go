package store

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// migrationLockID keys the advisory lock that keeps replicas migrating at
// the same moment from stepping on each other ("registry" in ASCII).
const migrationLockID = 0x7265676973747279

// Migrator applies the store's goose migrations (Options.Migrations).
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
	store    *Store
}

// NewMigrator prepares migrations over the store's pool. Close it when done.
func (s *Store) NewMigrator(logger *slog.Logger) (*Migrator, error) {
	db := stdlib.OpenDBFromPool(s.pool)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migration lock: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, s.migrations, opts...)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	return &Migrator{db: db, provider: p, store: s}, nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns what ran, then records
// what each known migration lets older replicas do (see compatibleFrom).
// On a schema newer than the migrations it knows it applies nothing.
func (m *Migrator) Up(ctx context.Context) ([]*goose.MigrationResult, error) {
	ctx = withoutStatementTimeout(ctx)
	// Recorded before the migrations run, so that an old replica never
	// sees one applied without its record (it would go unready), and
	// again after, for the batch that makes the table.
	if err := m.store.recordCompat(ctx); err != nil {
		return nil, err
	}
	res, err := m.provider.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("store: migrate up: %w", translate(err))
	}
	if err := m.store.recordCompat(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// Down rolls back the newest applied migration.
func (m *Migrator) Down(ctx context.Context) (*goose.MigrationResult, error) {
	res, err := m.provider.Down(withoutStatementTimeout(ctx))
	if err != nil {
		return res, fmt.Errorf("store: migrate down: %w", translate(err))
	}
	return res, nil
}

// Status lists every known migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]*goose.MigrationStatus, error) {
	st, err := m.provider.Status(withoutStatementTimeout(ctx))
	if err != nil {
		return nil, fmt.Errorf("store: migrate status: %w", translate(err))
	}
	return st, nil
}

// known lists the store's migrations: version, and the oldest schema
// version whose replicas may keep serving once it is applied.
func (s *Store) known() (map[int64]int64, error) {
	names, err := fs.Glob(s.migrations, "*.sql")
	if err != nil {
		return nil, err
	}
	out := map[int64]int64{}
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil {
			return nil, fmt.Errorf("store: migration %s: %w", n, err)
		}
		text, err := fs.ReadFile(s.migrations, n)
		if err != nil {
			return nil, err
		}
		from, _, err := compatibleFrom(v, string(text))
		if err != nil {
			return nil, fmt.Errorf("store: migration %s: %w", n, err)
		}
		out[v] = from
	}
	return out, nil
}

// The lines a migration says which older replicas may keep serving once
// it is applied with: "-- registryd:compatible-from N" (replicas whose
// newest migration is N or later), or "-- registryd:breaking" (none).
const (
	compatDirective   = "-- registryd:compatible-from "
	breakingDirective = "-- registryd:breaking"
)

// compatibleFrom reads a migration's compatibility: the N of its
// directive (at most its own version), or its own version when it is
// breaking or says nothing (only replicas that know it may serve).
// declared reports whether it said anything.
func compatibleFrom(version int64, text string) (from int64, declared bool, err error) {
	from = version
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "-- +goose Down") {
			break // only the Up section speaks for the migration
		}
		if line == breakingDirective {
			if declared {
				return 0, false, fmt.Errorf("%q: the migration says twice which releases may serve it", line)
			}
			declared = true
			continue
		}
		rest, ok := strings.CutPrefix(line, compatDirective)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		if err != nil || n < 1 || n > version {
			return 0, false, fmt.Errorf("%q: want the version of an older migration, at most %d", line, version)
		}
		if declared {
			return 0, false, fmt.Errorf("%q: the migration says twice which releases may serve it", line)
		}
		from, declared = n, true
	}
	return from, declared, nil
}

// UndeclaredMigrations lists the store's migrations from version since on
// that say neither compatible-from nor breaking.
func (s *Store) UndeclaredMigrations(since int64) ([]string, error) {
	names, err := fs.Glob(s.migrations, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil || v < since {
			continue
		}
		text, err := fs.ReadFile(s.migrations, n)
		if err != nil {
			return nil, err
		}
		if _, declared, err := compatibleFrom(v, string(text)); err != nil || !declared {
			out = append(out, n)
		}
	}
	return out, nil
}

// LatestVersion is the newest migration the store knows.
func (s *Store) LatestVersion() (int64, error) {
	known, err := s.known()
	if err != nil {
		return 0, err
	}
	var latest int64
	for v := range known {
		latest = max(latest, v)
	}
	return latest, nil
}

// recordCompat writes what every migration the store knows allows into
// schema_compat, applied or not (CheckSchema looks only at applied
// ones), once the table exists (migration 00023). Rows are written in
// version order, so that replicas migrating at once never deadlock.
func (s *Store) recordCompat(ctx context.Context) error {
	known, err := s.known()
	if err != nil {
		return err
	}
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('schema_compat') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return translate(err)
	}
	versions := slices.Sorted(maps.Keys(known))
	froms := make([]int64, len(versions))
	for i, v := range versions {
		froms[i] = known[v]
	}
	_, err = s.db.Exec(ctx, `
INSERT INTO schema_compat (version, compatible_from)
SELECT k.v, k.f FROM unnest($1::bigint[], $2::bigint[]) AS k(v, f) ORDER BY k.v
ON CONFLICT (version) DO UPDATE SET compatible_from = EXCLUDED.compatible_from
WHERE schema_compat.compatible_from IS DISTINCT FROM EXCLUDED.compatible_from`, versions, froms)
	if err != nil {
		return fmt.Errorf("store: record schema compatibility: %w", translate(err))
	}
	return nil
}

// SchemaVersion reads the applied schema version without creating anything:
// 0 for a database goose has never touched.
func (s *Store) SchemaVersion(ctx context.Context) (int64, error) {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("store: schema version: %w", translate(err))
	}
	if !exists {
		return 0, nil
	}
	var v int64
	err := s.db.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("store: schema version: %w", translate(err))
	}
	return v, nil
}

// SchemaState compares the database's schema with the binary's.
type SchemaState struct {
	Current, Latest int64
	// Compatible, when Current > Latest, says that every migration past
	// Latest lets replicas of Latest keep serving (schema_compat).
	Compatible bool
}

// OK reports whether this binary may serve the schema: exactly its own,
// or a newer one whose every newer migration allows it.
func (st SchemaState) OK() bool {
	return st.Current == st.Latest || st.Current > st.Latest && st.Compatible
}

// Problem describes what is wrong and how to fix it, or "" when OK.
func (st SchemaState) Problem() string {
	switch {
	case st.OK():
		return ""
	case st.Current == 0:
		return fmt.Sprintf("the database has no registry schema; run `registryd migrate up` (or start with REGISTRY_MIGRATE=true) to create it (version %d)", st.Latest)
	case st.Current < st.Latest:
		return fmt.Sprintf("the database schema is at version %d but this registryd needs %d; run `registryd migrate up` (or start with REGISTRY_MIGRATE=true)", st.Current, st.Latest)
	}
	return fmt.Sprintf("the database schema is at version %d, newer than this registryd knows (%d), and a migration after %d does not let older replicas serve it; upgrade registryd or roll the schema back with a newer binary's `migrate down`", st.Current, st.Latest, st.Latest)
}

// CheckSchema reports the database's schema state.
func (s *Store) CheckSchema(ctx context.Context) (SchemaState, error) {
	latest, err := s.LatestVersion()
	if err != nil {
		return SchemaState{}, err
	}
	cur, err := s.SchemaVersion(ctx)
	if err != nil {
		return SchemaState{}, err
	}
	st := SchemaState{Current: cur, Latest: latest}
	if cur <= latest {
		return st, nil
	}
	// Every applied migration past ours must say replicas of ours (or
	// older) may serve; a missing row says nothing, so it allows none.
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('schema_compat') IS NOT NULL`).Scan(&exists); err != nil {
		return SchemaState{}, fmt.Errorf("store: schema version: %w", translate(err))
	}
	if !exists {
		return st, nil
	}
	err = s.db.QueryRow(ctx, `
SELECT NOT EXISTS (
    SELECT FROM goose_db_version g LEFT JOIN schema_compat c ON c.version = g.version_id
    WHERE g.is_applied AND g.version_id > $1 AND (c.compatible_from IS NULL OR c.compatible_from > $1))`, latest).Scan(&st.Compatible)
	if err != nil {
		return SchemaState{}, fmt.Errorf("store: schema version: %w", translate(err))
	}
	return st, nil
}
