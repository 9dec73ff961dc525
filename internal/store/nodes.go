package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// CreateNode stores a new node and audits it. An agent that creates a node
// becomes its owner. An agent registering a node the sync worker imported
// (same ip and index, no owner yet) adopts that row instead: it becomes the
// owner, its driver_version is kept, and adopted is true. It returns an
// ErrInvalid error when spec is invalid or names a missing hardware
// generation, and an ErrConflict error (with ExistingPK) when (ip, index)
// is taken otherwise.
func (s *Store) CreateNode(ctx context.Context, actor registry.Actor, spec registry.NodeSpec) (n registry.Node, adopted bool, err error) {
	if err := spec.Normalize(); err != nil {
		return registry.Node{}, false, err
	}
	var owner *string
	if actor.Role == registry.RoleAgent {
		owner = &actor.Sub
	}
	err = s.WithTx(ctx, func(tx *Store) error {
		if owner != nil {
			cur, err := tx.adoptable(ctx, spec)
			if err != nil {
				return err
			}
			if cur != nil {
				adopted = true
				return tx.adopt(ctx, actor, *cur, spec, &n)
			}
		}
		var err error
		n, err = collectOne(ctx, tx.db, scanNode, `
			INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, owner,
				gpu_model, gpu_uuid, fabric, labels)
			VALUES ($1::inet, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)
			RETURNING `+nodeColumns,
			spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem, owner,
			spec.GPUModel, spec.GPUUUID, spec.Fabric, spec.Labels.String())
		if err != nil {
			return err
		}
		if err := tx.recordChanges(ctx, "created", n); err != nil {
			return err
		}
		if err := tx.expectHeartbeats(ctx, n); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeCreate, "node", n.PK, nil, docOfNode(n))
	})
	if err != nil {
		return registry.Node{}, false, fmt.Errorf("store: create node: %w", s.nodeWriteError(ctx, err, spec))
	}
	return n, adopted, nil
}

// adoptable returns the imported, ownerless node at spec's (ip, index),
// locked, or nil.
func (s *Store) adoptable(ctx context.Context, spec registry.NodeSpec) (*registry.Node, error) {
	n, err := collectOne(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes
		WHERE ip = $1::inet AND gpu_index = $2 AND source <> 'api' AND owner IS NULL FOR UPDATE`, spec.IP, spec.Index)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// adopt makes the registering agent the owner of an imported node. What the
// provider knows (memory, hardware, fabric, its labels) stays; the agent's
// driver_version and GPU names (gpu_model, gpu_uuid: the driver's are the
// more exact) win, its labels are added, and its fabric fills in one the
// provider left unknown.
func (s *Store) adopt(ctx context.Context, actor registry.Actor, cur registry.Node, spec registry.NodeSpec, out *registry.Node) error {
	// The body's hardware generation is not used, but bad input is still
	// refused rather than ignored.
	if spec.HardwareGeneration != nil {
		var exists bool
		if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM hardware_generations WHERE pk = $1)`, *spec.HardwareGeneration).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			var fe registry.FieldErrors
			fe.Add("hardware_generation", "hardware generation %d does not exist", *spec.HardwareGeneration)
			return fe.Err()
		}
	}
	// The agent's own labels join the node's; the provider's stay.
	own := registry.LabelPatch{Set: true, Values: map[string]*string{}}
	for k, v := range spec.Labels.All() {
		own.Values[k] = &v
	}
	labels, err := own.Apply(cur.Labels)
	if err != nil {
		var fe registry.FieldErrors
		fe.Add("labels", "%s", err.Error())
		return fe.Err()
	}
	n, err := collectOne(ctx, s.db, scanNode, `
		UPDATE nodes SET owner = $2, driver_version = $3, gpu_uuid = coalesce($4, gpu_uuid),
			gpu_model = coalesce($5, gpu_model), fabric = coalesce(fabric, $6), labels = $7::jsonb,
			updated_at = now(), version = version + 1
		WHERE pk = $1 RETURNING `+nodeColumns, cur.PK, actor.Sub, spec.DriverVersion,
		spec.GPUUUID, spec.GPUModel, spec.Fabric, labels.String())
	if err != nil {
		return err
	}
	*out = n
	if err := s.recordChanges(ctx, "updated", n); err != nil {
		return err
	}
	if err := s.expectHeartbeats(ctx, n); err != nil {
		return err
	}
	return s.audit(ctx, actor, registry.ActionNodeAdopt, "node", n.PK, docOfNode(cur), docOfNode(n))
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
	n, err := collectOne(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE pk = $1 `+lock, pk)
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
		if err := spec.NormalizeUpdate(cur.Spec()); err != nil {
			return err
		}
		if spec.Same(cur.Spec()) {
			out = cur
			return nil
		}
		if out, err = collectOne(ctx, tx.db, scanNode, `
			UPDATE nodes SET ip = $2::inet, gpu_index = $3, cpu_mem = $4, driver_version = $5,
				hardware_generation = $6, gpu_mem = $7, gpu_model = $8, gpu_uuid = $9, fabric = $10,
				labels = $11::jsonb, updated_at = now(), version = version + 1
			WHERE pk = $1
			RETURNING `+nodeColumns,
			pk, spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem,
			spec.GPUModel, spec.GPUUUID, spec.Fabric, spec.Labels.String()); err != nil {
			return err
		}
		if err := tx.recordChanges(ctx, "updated", out); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeUpdate, "node", pk, docOfNode(cur), docOfNode(out))
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return registry.Node{}, err
		}
		return registry.Node{}, fmt.Errorf("store: update node %d: %w", pk, s.nodeWriteError(ctx, err, spec))
	}
	return out, nil
}

// DeleteNode removes node pk, audits it and returns it as it was. check,
// when not nil, sees the locked node first and may refuse. A node that
// holds a job is kept (ErrConflict) unless force is set. A missing node:
// ErrNotFound.
func (s *Store) DeleteNode(ctx context.Context, actor registry.Actor, pk int64, force bool, check func(cur registry.Node) error) (registry.Node, error) {
	var out registry.Node
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getNode(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(cur); err != nil {
				return err
			}
		}
		if cur.CurrentJob != nil && !force {
			return registry.Conflictf("job %d holds node %d; release it before deleting the node", *cur.CurrentJob, pk)
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM nodes WHERE pk = $1`, pk); err != nil {
			return fmt.Errorf("store: delete node %d: %w", pk, translate(err))
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM node_liveness WHERE node_pk = $1`, pk); err != nil {
			return fmt.Errorf("store: delete node %d: %w", pk, translate(err))
		}
		out = cur
		if err := tx.recordChanges(ctx, "deleted", cur); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeDelete, "node", pk, docOfNode(cur), nil)
	})
	return out, err
}
