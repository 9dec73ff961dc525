package main

import (
	"context"
	"log/slog"

	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/sweeper"
)

// newSweeper wires the node lifecycle sweeper to the store: replicas take
// turns through an advisory lock held on a session of its own.
func newSweeper(cfg config, st *store.Store, logger *slog.Logger) (*sweeper.Sweeper, error) {
	return sweeper.New(sweeper.Config{
		TTL:    cfg.NodeTTL,
		Logger: logger,
		Locker: func(ctx context.Context) (sweeper.Store, func(), bool, error) {
			l, ok, err := st.TryLock(ctx, sweeper.LockKey)
			if err != nil || !ok {
				return nil, nil, ok, err
			}
			return l.Store(), func() { l.Release(context.WithoutCancel(ctx)) }, true, nil
		},
	})
}
