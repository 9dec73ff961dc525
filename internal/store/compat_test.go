package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// thisRelease is a database at this release's schema, a store of this
// release on it, and the release's newest migration.
func thisRelease(t *testing.T) (url string, st *store.Store, latest int64) {
	t.Helper()
	url = pgtest.New(t)
	st = pgtest.Open(t, url, store.Options{})
	latest, err := st.LatestVersion()
	if err != nil {
		t.Fatal(err)
	}
	return url, st, latest
}

// nextRelease names the next releases' migrations, as tests of upgrades
// write them: an expand step that lets the release before it serve, and
// one that does not say so.
func nextRelease(latest int64) (expand, breaking string) {
	return fmt.Sprintf("%05d_probe_expand.sql", latest+1), fmt.Sprintf("%05d_probe_breaking.sql", latest+2)
}

const expandSQL = `-- +goose Up
-- registryd:compatible-from %d
ALTER TABLE nodes ADD COLUMN probe text;
-- +goose Down
ALTER TABLE nodes DROP COLUMN probe;
`

const breakingSQL = `-- +goose Up
-- registryd:breaking
ALTER TABLE nodes ADD COLUMN probe_required text NOT NULL DEFAULT 'x';
-- +goose Down
ALTER TABLE nodes DROP COLUMN probe_required;
`

// A replica serves a schema newer than its own only when every newer
// migration says it may: an expand step marked compatible-from its
// version keeps it serving (and its writes working), a migration that
// says nothing, or whose record is missing, does not; migrate down
// restores it.
func TestSchemaCompatibility(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, old, latest := thisRelease(t)
	expand, breaking := nextRelease(latest)
	next := pgtest.Open(t, url, store.Options{Migrations: pgtest.MigrationsWith(t, map[string]string{
		expand: fmt.Sprintf(expandSQL, latest)})})
	after := pgtest.Open(t, url, store.Options{Migrations: pgtest.MigrationsWith(t, map[string]string{
		expand: fmt.Sprintf(expandSQL, latest), breaking: breakingSQL})})
	migrate := func(st *store.Store, up bool) {
		t.Helper()
		m, err := st.NewMigrator(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if up {
			_, err = m.Up(ctx)
		} else {
			_, err = m.Down(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(st *store.Store, wantOK bool, what string) store.SchemaState {
		t.Helper()
		s, err := st.CheckSchema(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK() != wantOK {
			t.Fatalf("%s: %+v OK %v, want %v (%s)", what, s, s.OK(), wantOK, s.Problem())
		}
		return s
	}

	migrate(next, true)
	if s := check(old, true, "the release before an expand step"); s.Current != latest+1 || s.Latest != latest {
		t.Fatalf("state %+v", s)
	}
	check(next, true, "the release of the expand step")
	// The older release still writes.
	if _, _, err := old.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0.1", DriverVersion: "d"}); err != nil {
		t.Fatalf("the older release's write on the expanded schema: %v", err)
	}
	// Migrating with the older release changes nothing.
	migrate(old, true)
	check(next, true, "after the older release's migrate up")

	// Its record lost (a crash between the migration and the record):
	// the older release may no longer serve, until migrate up writes it.
	pgtest.Exec(t, url, `DELETE FROM schema_compat WHERE version = $1`, latest+1)
	check(old, false, "a migration without its record")
	migrate(next, true)
	check(old, true, "the record written again")

	// A breaking migration: neither older release may serve.
	migrate(after, true)
	s := check(old, false, "the release two before a breaking step")
	if !strings.Contains(s.Problem(), "does not let older replicas serve it") {
		t.Fatalf("problem: %s", s.Problem())
	}
	check(next, false, "the release before a breaking step")
	check(after, true, "the breaking step's release")

	// Rolled back: the older releases serve again.
	migrate(after, false)
	check(next, true, "after rolling the breaking step back")
	check(old, true, "after rolling the breaking step back")
}

// A compatibility line that names no older migration is an error.
func TestSchemaCompatibilityDirective(t *testing.T) {
	t.Parallel()
	url, _, latest := thisRelease(t)
	for _, from := range []string{"0", "x", fmt.Sprint(latest + 2), "1\n-- registryd:breaking"} {
		st := pgtest.Open(t, url, store.Options{Migrations: pgtest.MigrationsWith(t, map[string]string{
			fmt.Sprintf("%05d_bad.sql", latest+1): "-- +goose Up\n-- registryd:compatible-from " + from + "\nSELECT 1;\n-- +goose Down\nSELECT 1;\n"})})
		if _, err := st.CheckSchema(context.Background()); err == nil || !strings.Contains(err.Error(), "registryd:") {
			t.Errorf("compatible-from %s: %v", from, err)
		}
	}
}

// Every migration from 00023 on says which releases may serve it.
func TestMigrationsDeclareCompatibility(t *testing.T) {
	t.Parallel()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	bad, err := st.UndeclaredMigrations(23)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("migrations that do not say which older releases may serve them (-- registryd:compatible-from N, or -- registryd:breaking): %v", bad)
	}
	// The check sees one that does not.
	probe := pgtest.Open(t, pgtest.New(t), store.Options{Migrations: pgtest.MigrationsWith(t, map[string]string{
		"99999_silent.sql": "-- +goose Up\nSELECT 1;\n-- +goose Down\nSELECT 1;\n"})})
	if bad, err := probe.UndeclaredMigrations(23); err != nil || strings.Join(bad, ",") != "99999_silent.sql" {
		t.Fatalf("undeclared: %v, %v", bad, err)
	}
}

// While a release's expand migration runs, the release before it is never
// told it may not serve (the migration's record is written before it),
// and several replicas migrating at once all succeed.
func TestSchemaCompatibilityWhileMigrating(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, old, latest := thisRelease(t)
	expand, _ := nextRelease(latest)
	next := pgtest.MigrationsWith(t, map[string]string{expand: fmt.Sprintf(expandSQL, latest)})
	done := make(chan struct{})
	checks, refused := 0, 0
	go func() {
		defer close(done)
		for {
			st, err := old.CheckSchema(ctx)
			checks++
			if err != nil || !st.OK() {
				refused++
			}
			if st.Current > latest {
				return
			}
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		st := pgtest.Open(t, url, store.Options{Migrations: next})
		go func() {
			m, err := st.NewMigrator(nil)
			if err == nil {
				_, err = m.Up(ctx)
				m.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a replica's migrate up: %v", err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the schema never moved past the older release")
	}
	if refused > 0 {
		t.Fatalf("the older release was refused %d of %d times while the expand step ran", refused, checks)
	}
}
