package store

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/registryd/registryd/migrations"
)

// migrationLockID keys the advisory lock that keeps replicas migrating at
// the same moment from stepping on each other ("registry" in ASCII).
const migrationLockID = 0x7265676973747279

// Migrator applies the embedded goose migrations.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
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
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, opts...)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns what ran.
func (m *Migrator) Up(ctx context.Context) ([]*goose.MigrationResult, error) {
	res, err := m.provider.Up(withoutStatementTimeout(ctx))
	if err != nil {
		return res, fmt.Errorf("store: migrate up: %w", translate(err))
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

// LatestVersion is the newest migration this binary knows.
func LatestVersion() (int64, error) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil {
			return 0, fmt.Errorf("store: migration %s: %w", n, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
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
}

// OK reports whether the schema is exactly the one this binary expects.
func (st SchemaState) OK() bool { return st.Current == st.Latest }

// Problem describes what is wrong and how to fix it, or "" when OK.
func (st SchemaState) Problem() string {
	switch {
	case st.Current == 0:
		return fmt.Sprintf("the database has no registry schema; run `registryd migrate up` (or start with REGISTRY_MIGRATE=true) to create it (version %d)", st.Latest)
	case st.Current < st.Latest:
		return fmt.Sprintf("the database schema is at version %d but this registryd needs %d; run `registryd migrate up` (or start with REGISTRY_MIGRATE=true)", st.Current, st.Latest)
	case st.Current > st.Latest:
		return fmt.Sprintf("the database schema is at version %d, newer than this registryd knows (%d); upgrade registryd or roll the schema back with a newer binary's `migrate down`", st.Current, st.Latest)
	}
	return ""
}

// CheckSchema reports the database's schema state.
func (s *Store) CheckSchema(ctx context.Context) (SchemaState, error) {
	latest, err := LatestVersion()
	if err != nil {
		return SchemaState{}, err
	}
	cur, err := s.SchemaVersion(ctx)
	if err != nil {
		return SchemaState{}, err
	}
	return SchemaState{Current: cur, Latest: latest}, nil
}
