package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

func actor(sub string, role registry.Role) registry.Actor {
	return registry.Actor{Principal: registry.Principal{Sub: sub, Role: role}}
}

// The audit list filters by action and by role, alone, together and with
// the other filters, against entries the store itself wrote.
func TestListAuditByActionAndRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	admin, agent, sched := actor("root", registry.RoleAdmin), actor("agent-1", registry.RoleAgent), actor("sched-1", registry.RoleScheduler)
	syncer := actor("sync:scp", registry.RoleSystem)

	h, err := st.CreateHardware(ctx, admin, registry.HardwareSpec{Name: "H100"}) // hardware.create, admin
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateHardware(ctx, syncer, registry.HardwareSpec{Name: "A100"}); err != nil { // hardware.create, system
		t.Fatal(err)
	}
	var pks []int64
	for i := range 3 { // node.create: agent, agent, admin
		a := agent
		if i == 2 {
			a = admin
		}
		n, _, err := st.CreateNode(ctx, a, registry.NodeSpec{IP: "10.0.0.1", Index: i, CPUMem: 1, DriverVersion: "d", HardwareGeneration: &h.PK})
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	if _, err := st.ClaimNodes(ctx, sched, registry.Claim{Job: 7, Count: 2}); err != nil { // node.claim ×2, scheduler
		t.Fatal(err)
	}
	if _, _, err := st.ReleaseNodes(ctx, admin, registry.Release{Job: 7}); err != nil { // node.release ×2, admin
		t.Fatal(err)
	}
	if _, err := st.DeleteNode(ctx, admin, pks[0], false, nil); err != nil { // node.delete, admin
		t.Fatal(err)
	}
	if _, err := st.DeleteNode(ctx, agent, pks[1], false, nil); err != nil { // node.delete, agent
		t.Fatal(err)
	}

	all, err := st.ListAudit(ctx, registry.AuditFilter{})
	if err != nil || len(all) != 11 {
		t.Fatalf("all entries: %d, %v", len(all), err)
	}
	s := func(v string) *string { return &v }
	// want computes the expected answer from every entry, independently of SQL.
	want := func(keep func(e registry.AuditEntry) bool) []int64 {
		var ids []int64
		for _, e := range all {
			if keep(e) {
				ids = append(ids, e.ID)
			}
		}
		return ids
	}
	for _, tc := range []struct {
		name string
		f    registry.AuditFilter
		keep func(e registry.AuditEntry) bool
		n    int
	}{
		{"action node.create", registry.AuditFilter{Action: s("node.create")},
			func(e registry.AuditEntry) bool { return e.Action == "node.create" }, 3},
		{"action node.claim", registry.AuditFilter{Action: s("node.claim")},
			func(e registry.AuditEntry) bool { return e.Action == "node.claim" }, 2},
		{"action token.revoke (none)", registry.AuditFilter{Action: s("token.revoke")},
			func(registry.AuditEntry) bool { return false }, 0},
		{"role admin", registry.AuditFilter{Role: s("admin")},
			func(e registry.AuditEntry) bool { return e.Role == "admin" }, 5},
		{"role system", registry.AuditFilter{Role: s("system")},
			func(e registry.AuditEntry) bool { return e.Role == "system" }, 1},
		{"role scheduler", registry.AuditFilter{Role: s("scheduler")},
			func(e registry.AuditEntry) bool { return e.Role == "scheduler" }, 2},
		{"role reader (never writes)", registry.AuditFilter{Role: s("reader")},
			func(registry.AuditEntry) bool { return false }, 0},
		{"action and role", registry.AuditFilter{Action: s("node.delete"), Role: s("agent")},
			func(e registry.AuditEntry) bool { return e.Action == "node.delete" && e.Role == "agent" }, 1},
		{"hardware.create by system", registry.AuditFilter{Action: s("hardware.create"), Role: s("system")},
			func(e registry.AuditEntry) bool { return e.Action == "hardware.create" && e.Role == "system" }, 1},
		{"action, role, principal and target", registry.AuditFilter{Action: s("node.create"), Role: s("admin"), Principal: s("root"),
			TargetType: s("node"), TargetPK: &pks[2]},
			func(e registry.AuditEntry) bool { return e.Action == "node.create" && e.Role == "admin" }, 1},
		{"action and role that never met", registry.AuditFilter{Action: s("node.claim"), Role: s("admin")},
			func(registry.AuditEntry) bool { return false }, 0},
		{"role with a page", registry.AuditFilter{Role: s("admin"), After: all[0].ID, Limit: 2},
			func(e registry.AuditEntry) bool { return e.Role == "admin" && e.ID > all[0].ID }, 2},
	} {
		got, err := st.ListAudit(ctx, tc.f)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var ids []int64
		for _, e := range got {
			ids = append(ids, e.ID)
		}
		w := want(tc.keep)
		if len(w) > len(ids) && tc.f.Limit > 0 {
			w = w[:tc.f.Limit]
		}
		if !slices.Equal(ids, w) || len(ids) != tc.n {
			t.Errorf("%s: ids %v, want %v (%d)", tc.name, ids, w, tc.n)
		}
	}

	for _, tc := range []struct {
		f     registry.AuditFilter
		field string
	}{
		{registry.AuditFilter{Action: s("node.explode")}, "action"},
		{registry.AuditFilter{Action: s("NODE.CREATE")}, "action"},
		{registry.AuditFilter{Action: s("")}, "action"},
		{registry.AuditFilter{Role: s("root")}, "role"},
		{registry.AuditFilter{Role: s("Admin")}, "role"},
	} {
		_, err := st.ListAudit(ctx, tc.f)
		if fields := registry.FieldsOf(err); len(fields) != 1 || fields[0].Field != tc.field {
			t.Errorf("%+v: %v, want a field error on %s", tc.f, err, tc.field)
		}
	}
}

// Every action the store writes is one the filter accepts.
func TestAuditActionsCoverTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	admin := actor("root", registry.RoleAdmin)
	h, err := st.CreateHardware(ctx, admin, registry.HardwareSpec{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateHardware(ctx, admin, h.PK, func(registry.Hardware) (registry.HardwareSpec, error) {
		return registry.HardwareSpec{Name: "H200"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	n, _, err := st.CreateNode(ctx, admin, registry.NodeSpec{IP: "10.0.0.1", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateNode(ctx, admin, n.PK, func(cur registry.Node) (registry.NodeSpec, error) {
		spec := cur.Spec()
		spec.DriverVersion = "e"
		return spec, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RevokeTokens(ctx, admin, registry.Revocation{Sub: "leaked"}); err != nil {
		t.Fatal(err)
	}
	var actions []string
	rows, err := st.Pool().Query(ctx, "SELECT DISTINCT action FROM audit_log")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, a)
	}
	if rows.Err() != nil || len(actions) < 5 {
		t.Fatalf("actions %v, %v", actions, rows.Err())
	}
	for _, a := range actions {
		if !slices.Contains(registry.AuditActions, a) {
			t.Errorf("the store wrote %q, which AuditActions does not list", a)
		}
	}
}

// A page filtered by action or role walks that filter's index in id order
// rather than scanning the log: with 20,000 entries of which a handful
// match, the plan of ListAudit's own statement names the index.
func TestListAuditFiltersUseAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO audit_log (principal, role, action, target_type, target_pk)
		SELECT CASE WHEN g % 2000 = 0 THEN 'root' ELSE 'agent-' || (g % 500) END,
		       CASE WHEN g % 2000 = 0 THEN 'admin' ELSE 'agent' END,
		       CASE WHEN g % 1000 = 0 THEN 'node.delete' ELSE 'node.update' END,
		       'node', g
		FROM generate_series(1, 20000) AS g;
		ANALYZE audit_log`); err != nil {
		t.Fatal(err)
	}
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		f     registry.AuditFilter
		index string
		n     int
	}{
		{registry.AuditFilter{Action: s("node.delete"), Limit: 100}, "audit_log_action_idx", 20},
		{registry.AuditFilter{Role: s("admin"), Limit: 100}, "audit_log_role_idx", 10},
	} {
		sql, args := store.AuditQuery(tc.f)
		var plan strings.Builder
		rows, err := st.Pool().Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&plan, line)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if !strings.Contains(plan.String(), tc.index) {
			t.Errorf("%+v does not use %s:\n%s", tc.f, tc.index, plan.String())
		}
		got, err := st.ListAudit(ctx, tc.f)
		if err != nil || len(got) != tc.n {
			t.Errorf("%+v: %d entries, %v", tc.f, len(got), err)
		}
	}
}
