package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// migratedBelow is a store on a fresh database migrated down to just
// below migration version, and its migrator (to go up with).
func migratedBelow(t *testing.T, version int64) (*store.Store, *store.Migrator) {
	t.Helper()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	m, err := st.NewMigrator(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for {
		v, err := st.SchemaVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v < version {
			return st, m
		}
		if _, err := m.Down(ctx); err != nil {
			t.Fatalf("down from %d: %v", v, err)
		}
	}
}

// hostFreeMigration is the migration that creates host_free and first
// fills it from the nodes already there.
const hostFreeMigration = 13

// A database holding nodes in every state when it is migrated to
// host_free gets free counts equal to a recount from nodes: lost,
// cordoned, held and unschedulable nodes are not free, whatever else they
// are. The template database is migrated with no nodes, so no other test
// runs the migration's fill over a fleet.
func TestHostFreeMigrationFillsFromNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, m := migratedBelow(t, hostFreeMigration)
	// Four hosts of eight: on each, gpu 0 and 1 free, 2 lost, 3 cordoned,
	// 4 held, 5 unschedulable, 6 lost and held, 7 lost and cordoned. Host
	// .1 is CPU-only with no hardware generation (NULL attributes), host
	// .2 imported; on host .3 every node is lost.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO hardware_generations (name) VALUES ('H100')`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, source,
		                   lost, cordon_reason, current_job, schedulable)
		SELECT '10.40.0.0'::inet + h, i, 1024, 'd',
		       CASE WHEN h <> 1 THEN 1 END, CASE WHEN h <> 1 THEN 80 END, CASE WHEN h = 2 THEN 'scp' ELSE 'api' END,
		       h = 3 OR i IN (2, 6, 7), CASE WHEN i IN (3, 7) THEN 'fan' END, CASE WHEN i IN (4, 6) THEN 42 END, i <> 5
		FROM generate_series(0, 3) h, generate_series(0, 7) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if drift := hostFreeDrift(t, st); len(drift) > 0 {
		t.Fatalf("after migrating a fleet to host_free, the free counts differ from a recount:\n%s", strings.Join(drift, "\n"))
	}
	// The recount itself is what the fleet above holds.
	rows, err := st.Pool().Query(ctx, `SELECT host(ip) || ' ' || free FROM host_free ORDER BY ip`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.40.0.0 2", "10.40.0.1 2", "10.40.0.2 2"}, got); diff != "" {
		t.Fatalf("host_free after the migration (-want +got):\n%s", diff)
	}
}
