package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/sweeper"
)

// newSweeper wires the node lifecycle sweeper to the store: replicas take
// turns through the sweeper's lease (see takeLease), which a frozen leader
// loses within REGISTRY_LEADER_TTL.
func newSweeper(cfg config, st *store.Store, logger *slog.Logger, onPass func(time.Duration, registry.Sweep, error)) (*sweeper.Sweeper, error) {
	return sweeper.New(sweeper.Config{
		TTL:    cfg.NodeTTL,
		Logger: logger,
		OnPass: onPass,
		Locker: func(ctx context.Context) (sweeper.Store, func(), bool, error) {
			leader, release, ok, err := takeLease(ctx, st, sweeperLease, cfg.LeaderTTL, 0)
			if err != nil || !ok {
				return nil, nil, ok, err
			}
			return leader, release, true, nil
		},
	})
}
