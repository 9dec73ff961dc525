package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// nodeColumns is the select list scanNode reads, in order.
const nodeColumns = `pk, host(ip), gpu_index, cpu_mem, driver_version, hardware_generation,
	gpu_mem, last_seen, current_job, owner, created_at, updated_at, version`

func scanNode(row pgx.CollectableRow) (registry.Node, error) {
	var n registry.Node
	err := row.Scan(&n.PK, &n.IP, &n.Index, &n.CPUMem, &n.DriverVersion, &n.HardwareGeneration,
		&n.GPUMem, &n.LastSeen, &n.CurrentJob, &n.Owner, &n.CreatedAt, &n.UpdatedAt, &n.Version)
	return n, err
}

// CreateNode stores a new node and audits it. An agent that creates a node
// becomes its owner. It returns an ErrInvalid error when spec is invalid or
// names a missing hardware generation, and an ErrConflict error (with
// ExistingPK) when (ip, index) is taken.
func (s *Store) CreateNode(ctx context.Context, actor registry.Actor, spec registry.NodeSpec) (registry.Node, error) {
	if err := spec.Normalize(); err != nil {
		return registry.Node{}, err
	}
	var owner *string
	if actor.Role == registry.RoleAgent {
		owner = &actor.Sub
	}
	var n registry.Node
	err := s.WithTx(ctx, func(tx *Store) error {
		rows, _ := tx.db.Query(ctx, `
			INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, owner)
			VALUES ($1::inet, $2, $3, $4, $5, $6, $7)
			RETURNING `+nodeColumns,
			spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem, owner)
		var err error
		if n, err = pgx.CollectExactlyOneRow(rows, scanNode); err != nil {
			return err
		}
		return tx.audit(ctx, actor, "node.create", "node", n.PK, nil, docOfNode(n))
	})
	if err != nil {
		return registry.Node{}, fmt.Errorf("store: create node: %w", s.nodeWriteError(ctx, err, spec))
	}
	return n, nil
}

// nodeWriteError explains a failed insert or update of spec: a taken
// (ip, index) pair names the node that holds it; a missing hardware
// generation is a field error. Inside a transaction the lookup cannot run (the
// transaction is aborted), so it goes to the pool.
func (s *Store) nodeWriteError(ctx context.Context, err error, spec registry.NodeSpec) error {
	switch code, constraint := pgCode(err); {
	case code == codeUniqueViolation && constraint == "nodes_ip_index_key":
		var pk int64
		lookupErr := s.pool.QueryRow(ctx, `SELECT pk FROM nodes WHERE ip = $1::inet AND gpu_index = $2`,
			spec.IP, spec.Index).Scan(&pk)
		if lookupErr != nil {
			// Deleted since: the pair is free now, but this write failed.
			return registry.Conflictf("a node with ip %s and index %d was being written at the same time; retry", spec.IP, spec.Index)
		}
		return &registry.Error{
			Kind:       registry.ErrConflict,
			Message:    fmt.Sprintf("node %d already has ip %s and index %d", pk, spec.IP, spec.Index),
			ExistingPK: pk,
		}
	case code == codeForeignKeyViolation && constraint == "nodes_hardware_generation_fkey":
		var fe registry.FieldErrors
		fe.Add("hardware_generation", "hardware generation %d does not exist", deref(spec.HardwareGeneration))
		return fe.Err()
	}
	if _, ok := errors.AsType[*registry.Error](err); ok {
		return err
	}
	return translate(err)
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// GetNode returns the node with the given pk, or an ErrNotFound error.
func (s *Store) GetNode(ctx context.Context, pk int64) (registry.Node, error) {
	return s.getNode(ctx, pk, "")
}

func (s *Store) getNode(ctx context.Context, pk int64, lock string) (registry.Node, error) {
	rows, _ := s.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE pk = $1 `+lock, pk)
	n, err := pgx.CollectExactlyOneRow(rows, scanNode)
	if errors.Is(err, pgx.ErrNoRows) {
		return registry.Node{}, registry.NotFoundf("node %d does not exist", pk)
	}
	if err != nil {
		return registry.Node{}, fmt.Errorf("store: get node %d: %w", pk, translate(err))
	}
	return n, nil
}

// UpdateNode locks node pk, asks fn for its new writable fields given the
// current node, and stores and audits them, all in one transaction. fn's
// error aborts the update and is returned as is. A spec equal to the current
// one changes nothing (no version bump, no audit entry). Errors as
// CreateNode, plus ErrNotFound.
func (s *Store) UpdateNode(ctx context.Context, actor registry.Actor, pk int64, fn func(cur registry.Node) (registry.NodeSpec, error)) (registry.Node, error) {
	var out registry.Node
	var spec registry.NodeSpec
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getNode(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		spec, err = fn(cur)
		if err != nil {
			return err
		}
		if err := spec.Normalize(); err != nil {
			return err
		}
		if sameSpec(spec, cur.Spec()) {
			out = cur
			return nil
		}
		rows, _ := tx.db.Query(ctx, `
			UPDATE nodes SET ip = $2::inet, gpu_index = $3, cpu_mem = $4, driver_version = $5,
				hardware_generation = $6, gpu_mem = $7, updated_at = now(), version = version + 1
			WHERE pk = $1
			RETURNING `+nodeColumns,
			pk, spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem)
		if out, err = pgx.CollectExactlyOneRow(rows, scanNode); err != nil {
			return err
		}
		return tx.audit(ctx, actor, "node.update", "node", pk, docOfNode(cur), docOfNode(out))
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return registry.Node{}, err
		}
		return registry.Node{}, fmt.Errorf("store: update node %d: %w", pk, s.nodeWriteError(ctx, err, spec))
	}
	return out, nil
}

func sameSpec(a, b registry.NodeSpec) bool {
	return a.IP == b.IP && a.Index == b.Index && a.CPUMem == b.CPUMem &&
		a.DriverVersion == b.DriverVersion &&
		sameInt(a.HardwareGeneration, b.HardwareGeneration) && sameInt(a.GPUMem, b.GPUMem)
}

func sameInt(a, b *int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// DeleteNode removes node pk, audits it and returns it as it was. A node
// that holds a job is kept: ErrConflict. A missing node: ErrNotFound.
func (s *Store) DeleteNode(ctx context.Context, actor registry.Actor, pk int64) (registry.Node, error) {
	var out registry.Node
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getNode(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		if cur.CurrentJob != nil {
			return registry.Conflictf("node %d holds job %d; release it before deleting the node", pk, *cur.CurrentJob)
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM nodes WHERE pk = $1`, pk); err != nil {
			return fmt.Errorf("store: delete node %d: %w", pk, translate(err))
		}
		out = cur
		return tx.audit(ctx, actor, "node.delete", "node", pk, docOfNode(cur), nil)
	})
	return out, err
}

// ListNodes returns the nodes matching f, ordered by pk. Callers that want
// every node page through with f.After and f.Limit so that no single query
// holds a connection for a slow reader.
func (s *Store) ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where = append(where, "pk > "+arg(f.After))
	if f.Free != nil {
		if *f.Free {
			where = append(where, "current_job IS NULL")
		} else {
			where = append(where, "current_job IS NOT NULL")
		}
	}
	if f.CurrentJob != nil {
		where = append(where, "current_job = "+arg(*f.CurrentJob))
	}
	if f.HardwareGeneration != nil {
		where = append(where, "hardware_generation = "+arg(*f.HardwareGeneration))
	}
	if f.MinGPUMem != nil {
		where = append(where, "gpu_mem >= "+arg(*f.MinGPUMem))
	}
	if f.MinCPUMem != nil {
		where = append(where, "cpu_mem >= "+arg(*f.MinCPUMem))
	}
	if f.IP != nil {
		where = append(where, "ip = "+arg(*f.IP)+"::inet")
	}
	if f.Index != nil {
		where = append(where, "gpu_index = "+arg(*f.Index))
	}
	if f.SeenWithin != nil {
		where = append(where, "last_seen >= now() - "+arg(*f.SeenWithin)+"::interval")
	}
	q := `SELECT ` + nodeColumns + ` FROM nodes WHERE ` + strings.Join(where, " AND ") + ` ORDER BY pk`
	if f.Limit > 0 {
		q += " LIMIT " + arg(f.Limit)
	}
	rows, _ := s.db.Query(ctx, q, args...)
	nodes, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", translate(err))
	}
	return nodes, nil
}

// TouchNodes records heartbeats: each node's last_seen becomes the given
// time unless it already holds a later one. Missing nodes are skipped. Rows
// are locked in pk order so that replicas flushing overlapping batches
// cannot deadlock; the caller passes pks sorted.
func (s *Store) TouchNodes(ctx context.Context, pks []int64, seen []time.Time) error {
	_, err := s.db.Exec(ctx, `
		UPDATE nodes n SET last_seen = v.t
		FROM (SELECT * FROM unnest($1::bigint[], $2::timestamptz[]) AS u(pk, t) ORDER BY pk) v
		WHERE n.pk = v.pk AND (n.last_seen IS NULL OR n.last_seen < v.t)`, pks, seen)
	if err != nil {
		return fmt.Errorf("store: touch nodes: %w", translate(err))
	}
	return nil
}
