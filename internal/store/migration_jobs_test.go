package store_test

import (
	"context"
	"testing"
)

// jobsMigration is the migration that creates jobs.
const jobsMigration = 16

// Jobs holding nodes when the registry is migrated to owned jobs belong
// to the principal the audit log shows claimed them (the latest node.claim
// of the job's lowest node); a job the log says nothing of has no owner.
// Fault caught (tried once): every job left without an owner (the first
// principal to claim it after the upgrade took it from its scheduler).
func TestJobsMigrationKeepsOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, m := migratedBelow(t, jobsMigration)
	// Job 7 holds nodes 1 and 2 (claimed by sched-a; node 1 was sched-b's
	// before, for another job); job 8 holds node 3, of which the log says
	// nothing; node 4 is free.
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, current_job)
		VALUES ('10.41.0.1', 0, 1, 'd', 7), ('10.41.0.1', 1, 1, 'd', 7), ('10.41.0.1', 2, 1, 'd', 8), ('10.41.0.1', 3, 1, 'd', NULL);
		INSERT INTO audit_log (principal, role, action, target_type, target_pk)
		VALUES ('sched-b', 'scheduler', 'node.claim', 'node', 1),
		       ('sched-a', 'scheduler', 'node.claim', 'node', 1),
		       ('sched-a', 'scheduler', 'node.claim', 'node', 2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := st.Pool().Query(ctx, `SELECT job, coalesce(owner, '(none)') FROM jobs ORDER BY job`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for rows.Next() {
		var job int64
		var owner string
		if err := rows.Scan(&job, &owner); err != nil {
			t.Fatal(err)
		}
		got[job] = owner
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[7] != "sched-a" || got[8] != "(none)" {
		t.Errorf("jobs after the migration: %v, want 7 owned by sched-a and 8 by none", got)
	}
}
