package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

type hardwareDoc struct {
	PK   int64  `json:"pk"`
	Name string `json:"name"`
}

func docOfHardware(h registry.Hardware) hardwareDoc { return hardwareDoc{PK: h.PK, Name: h.Name} }

// audit appends one entry in the current transaction, so the entry exists
// exactly when the change does. before or after may be nil.
func (s *Store) audit(ctx context.Context, a registry.Actor, action, targetType string, targetPK int64, before, after any) error {
	enc := func(v any) ([]byte, error) {
		if v == nil {
			return nil, nil
		}
		return json.Marshal(v)
	}
	b, err := enc(before)
	if err != nil {
		return err
	}
	af, err := enc(after)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `
		INSERT INTO audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id, client_request_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), nullif($10, ''))`,
		a.Sub, string(a.Role), a.ActingNode, action, targetType, targetPK, b, af, a.RequestID, a.ClientRequestID)
	if err != nil {
		return fmt.Errorf("store: audit %s: %w", action, translate(err))
	}
	return nil
}

// auditNodes appends one entry per node in a single statement: after is
// the node as it is now, before what beforeOf reconstructs.
func (s *Store) auditNodes(ctx context.Context, a registry.Actor, action string, nodes []registry.Node, beforeOf func(registry.Node) any) error {
	pks := make([]int64, len(nodes))
	befores := make([]string, len(nodes))
	afters := make([]string, len(nodes))
	for i, n := range nodes {
		pks[i] = n.PK
		b, err := json.Marshal(beforeOf(n))
		if err != nil {
			return err
		}
		af, err := json.Marshal(docOfNode(n))
		if err != nil {
			return err
		}
		befores[i], afters[i] = string(b), string(af)
	}
	_, err := s.db.Exec(ctx, `
		INSERT INTO audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id, client_request_id)
		SELECT $1, $2, $3, $4, 'node', u.pk, u.before, u.after, nullif($5, ''), nullif($9, '')
		FROM unnest($6::bigint[], $7::jsonb[], $8::jsonb[]) AS u(pk, before, after)`,
		a.Sub, string(a.Role), a.ActingNode, action, a.RequestID, pks, befores, afters, a.ClientRequestID)
	if err != nil {
		return fmt.Errorf("store: audit %s: %w", action, translate(err))
	}
	return nil
}

// ListAudit returns audit entries matching f, oldest first.
func (s *Store) ListAudit(ctx context.Context, f registry.AuditFilter) ([]registry.AuditEntry, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	sql, args := auditQuery(f)
	entries, err := collectRows(ctx, s.db, scanAuditEntry, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", translate(err))
	}
	return entries, nil
}

// auditQuery is the statement of ListAudit for a normalized filter.
// principal, action and role each have an index (column, id), and the
// target one (target_type, target_pk, id), so a page filtered by one of
// them is a walk in id order over the matching entries only.
func auditQuery(f registry.AuditFilter) (string, []any) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where = append(where, "id > "+arg(f.After))
	if f.TargetType != nil {
		where = append(where, "target_type = "+arg(*f.TargetType))
	}
	if f.TargetPK != nil {
		where = append(where, "target_pk = "+arg(*f.TargetPK))
	}
	if f.Principal != nil {
		where = append(where, "principal = "+arg(*f.Principal))
	}
	if f.Action != nil {
		where = append(where, "action = "+arg(*f.Action))
	}
	if f.Role != nil {
		where = append(where, "role = "+arg(*f.Role))
	}
	if f.Since != nil {
		where = append(where, "at >= "+arg(*f.Since))
	}
	limit := f.Limit
	if limit <= 0 || limit > registry.MaxListLimit {
		limit = registry.MaxListLimit
	}
	return `
		SELECT id, at, principal, role, acting_node, action, target_type, target_pk,
			before, after, coalesce(request_id, ''), coalesce(client_request_id, '')
		FROM audit_log WHERE ` + strings.Join(where, " AND ") + ` ORDER BY id LIMIT ` + arg(limit), args
}

// scanAuditEntry reads a row of auditQuery.
func scanAuditEntry(row pgx.CollectableRow) (registry.AuditEntry, error) {
	var e registry.AuditEntry
	err := row.Scan(&e.ID, &e.At, &e.Principal, &e.Role, &e.ActingNode, &e.Action, &e.TargetType, &e.TargetPK,
		&e.Before, &e.After, &e.RequestID, &e.ClientRequestID)
	return e, err
}
