package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

const hardwareColumns = `pk, name, created_at, updated_at, version,
	(SELECT count(*) FROM nodes n WHERE n.hardware_generation = h.pk)`

func scanHardware(row pgx.CollectableRow) (registry.Hardware, error) {
	var h registry.Hardware
	err := row.Scan(&h.PK, &h.Name, &h.CreatedAt, &h.UpdatedAt, &h.Version, &h.Nodes)
	return h, err
}

// CreateHardware stores a new hardware generation. A taken name is an
// ErrConflict error naming the existing pk.
func (s *Store) CreateHardware(ctx context.Context, actor registry.Actor, spec registry.HardwareSpec) (registry.Hardware, error) {
	if err := spec.Normalize(); err != nil {
		return registry.Hardware{}, err
	}
	var h registry.Hardware
	err := s.WithTx(ctx, func(tx *Store) error {
		var err error
		h, err = collectOne(ctx, tx.db, scanHardware, `
			INSERT INTO hardware_generations AS h (name) VALUES ($1)
			RETURNING `+hardwareColumns, spec.Name)
		if err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionHardwareCreate, "hardware", h.PK, nil, docOfHardware(h))
	})
	if err != nil {
		return registry.Hardware{}, fmt.Errorf("store: create hardware: %w", s.hardwareWriteError(ctx, err, spec))
	}
	return h, nil
}

func (s *Store) hardwareWriteError(ctx context.Context, err error, spec registry.HardwareSpec) error {
	if _, ok := errors.AsType[*registry.Error](err); ok {
		return err
	}
	if code, constraint := pgCode(err); code == codeUniqueViolation && constraint == "hardware_generations_name_key" {
		var pk int64
		if s.pool.QueryRow(ctx, `SELECT pk FROM hardware_generations WHERE name = $1`, spec.Name).Scan(&pk) != nil {
			return registry.Conflictf("a hardware generation named %q was being written at the same time; retry", spec.Name)
		}
		return &registry.Error{
			Kind:       registry.ErrConflict,
			Message:    fmt.Sprintf("hardware generation %d is already named %q", pk, spec.Name),
			ExistingPK: pk,
		}
	}
	return translate(err)
}

// GetHardware returns one hardware generation or an ErrNotFound error.
func (s *Store) GetHardware(ctx context.Context, pk int64) (registry.Hardware, error) {
	return s.getHardware(ctx, pk, "")
}

func (s *Store) getHardware(ctx context.Context, pk int64, lock string) (registry.Hardware, error) {
	h, err := collectOne(ctx, s.db, scanHardware, `SELECT `+hardwareColumns+` FROM hardware_generations h WHERE pk = $1 `+lock, pk)
	if errors.Is(err, pgx.ErrNoRows) {
		return registry.Hardware{}, registry.NotFoundf("hardware generation %d does not exist", pk)
	}
	if err != nil {
		return registry.Hardware{}, fmt.Errorf("store: get hardware %d: %w", pk, translate(err))
	}
	return h, nil
}

// ListHardware returns every hardware generation ordered by pk. There are
// tens of them, not thousands, so there is no paging.
func (s *Store) ListHardware(ctx context.Context) ([]registry.Hardware, error) {
	hs, err := collectRows(ctx, s.db, scanHardware, `SELECT `+hardwareColumns+` FROM hardware_generations h ORDER BY pk`)
	if err != nil {
		return nil, fmt.Errorf("store: list hardware: %w", translate(err))
	}
	return hs, nil
}

// UpdateHardware works like UpdateNode for hardware generations.
func (s *Store) UpdateHardware(ctx context.Context, actor registry.Actor, pk int64, fn func(cur registry.Hardware) (registry.HardwareSpec, error)) (registry.Hardware, error) {
	var out registry.Hardware
	var spec registry.HardwareSpec
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getHardware(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		if spec, err = fn(cur); err != nil {
			return err
		}
		if err := spec.Normalize(); err != nil {
			return err
		}
		if spec.Name == cur.Name {
			out = cur
			return nil
		}
		if out, err = collectOne(ctx, tx.db, scanHardware, `
			UPDATE hardware_generations h SET name = $2, updated_at = now(), version = version + 1
			WHERE pk = $1 RETURNING `+hardwareColumns, pk, spec.Name); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionHardwareUpdate, "hardware", pk, docOfHardware(cur), docOfHardware(out))
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return registry.Hardware{}, err
		}
		return registry.Hardware{}, fmt.Errorf("store: update hardware %d: %w", pk, s.hardwareWriteError(ctx, err, spec))
	}
	return out, nil
}

// DeleteHardware removes a hardware generation that no node uses; check
// works as in DeleteNode. In use: ErrConflict. Missing: ErrNotFound.
func (s *Store) DeleteHardware(ctx context.Context, actor registry.Actor, pk int64, check func(cur registry.Hardware) error) (registry.Hardware, error) {
	var out registry.Hardware
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getHardware(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(cur); err != nil {
				return err
			}
		}
		if cur.Nodes > 0 {
			return registry.Conflictf("hardware generation %d is used by %d nodes; move or delete them first", pk, cur.Nodes)
		}
		_, err = tx.db.Exec(ctx, `DELETE FROM hardware_generations WHERE pk = $1`, pk)
		if code, _ := pgCode(err); code == codeForeignKeyViolation {
			// The count read above may be stale; the foreign key is the truth.
			return registry.Conflictf("hardware generation %d is used by nodes; move or delete them first", pk)
		}
		if err != nil {
			return fmt.Errorf("store: delete hardware %d: %w", pk, translate(err))
		}
		out = cur
		return tx.audit(ctx, actor, registry.ActionHardwareDelete, "hardware", pk, docOfHardware(cur), nil)
	})
	return out, err
}
