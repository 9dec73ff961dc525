package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/syncer"
)

// sources builds a client for every enabled provider.
func sources(cfg config, logger *slog.Logger) ([]syncer.Source, error) {
	var out []syncer.Source
	retry := provider.Retry{Logger: logger}
	if cfg.SCP.Endpoint != "" {
		c, err := scp.New(scp.Config{Endpoint: cfg.SCP.Endpoint, AccessKey: cfg.SCP.AccessKey, SecretKey: cfg.SCP.SecretKey,
			AccountID: cfg.SCP.AccountID, GPUTable: cfg.SCP.GPUTable, Retry: retry})
		if err != nil {
			return nil, fmt.Errorf("REGISTRY_SCP_*: %w", err)
		}
		out = append(out, c)
	}
	if cfg.E2E.Endpoint != "" {
		c, err := e2e.New(e2e.Config{Endpoint: cfg.E2E.Endpoint, APIKey: cfg.E2E.APIKey, Token: cfg.E2E.Token,
			ProjectID: cfg.E2E.ProjectID, Location: cfg.E2E.Location, Retry: retry})
		if err != nil {
			return nil, fmt.Errorf("REGISTRY_E2E_*: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}

// newSyncer wires the sync worker to the store, or returns nil when no
// provider is enabled. With wait 0 a pass is skipped while another replica
// syncs (serve's loop); otherwise it waits for that pass to end, at most
// wait, telling stderr once (`registryd sync --once`). Each pass's summary
// goes to onPass when it is not nil (serve's metrics).
func newSyncer(cfg config, st *store.Store, logger *slog.Logger, wait time.Duration, stderr io.Writer, onPass func(syncer.Summary)) (*syncer.Syncer, error) {
	srcs, err := sources(cfg, logger)
	if err != nil || len(srcs) == 0 {
		return nil, err
	}
	return syncer.New(syncer.Config{
		Sources:           srcs,
		Interval:          cfg.SyncInterval,
		PassTimeout:       cfg.SyncTimeout,
		Logger:            logger,
		OnPass:            onPass,
		MaxRemovalPercent: cfg.SyncMaxRemoval,
		RemovalPasses:     cfg.SyncRemovalPasses,
		AllowRemoval:      cfg.SyncAllowRemoval,
		MaxReadBytes:      int64(cfg.SyncMaxReadMiB) << 20,
		Locker: func(ctx context.Context) (syncer.Store, func(), bool, error) {
			leader, release, ok, err := takeLease(ctx, st, syncLease, cfg.LeaderTTL, 0)
			if err == nil && !ok && wait > 0 {
				fmt.Fprintf(stderr, "registryd: another registryd is in the middle of a sync pass; waiting for it to end (at most %s, REGISTRY_SYNC_TIMEOUT), then running this one (--no-wait refuses instead)\n", wait)
				leader, release, ok, err = takeLease(ctx, st, syncLease, cfg.LeaderTTL, wait)
				if err == nil && !ok {
					err = fmt.Errorf("the other registryd's sync pass did not end within %s (REGISTRY_SYNC_TIMEOUT); try again later", wait)
				}
			}
			if err != nil || !ok {
				return nil, nil, ok, err
			}
			return leader, release, true, nil
		},
	})
}

// syncCmd is `registryd sync --once`: one pass of every enabled provider,
// a summary each, and a non-zero exit if any failed.
func syncCmd(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs, once, noWait, allowRemoval := syncFlags()
	c, _ := findCommand("sync")
	if err := fs.Parse(args); err != nil {
		return usageError(stderr, c, err)
	}
	if !*once || fs.NArg() > 0 {
		return usageError(stderr, c, errors.New("--once is required (serve runs the loop every REGISTRY_SYNC_INTERVAL)"))
	}
	logger := newLogger(cfg, stderr)
	db, err := openMigrated(ctx, cfg, logger, "sync --once", nil)
	if err != nil {
		return err
	}
	defer db.close()
	cfg.SyncAllowRemoval = *allowRemoval
	wait := cfg.SyncTimeout
	if *noWait {
		wait = 0
	}
	s, err := newSyncer(cfg, db.store, logger, wait, stderr, nil)
	if err != nil {
		return err
	}
	if s == nil {
		return errors.New("no provider is configured: set REGISTRY_SCP_ENDPOINT and/or REGISTRY_E2E_ENDPOINT with their credentials")
	}
	summaries, err := s.RunOnce(ctx)
	for _, sum := range summaries {
		fmt.Fprintln(stdout, sum.String())
	}
	if errors.Is(err, syncer.ErrLocked) {
		return errors.New("another registryd is in the middle of a sync pass (--no-wait); run without --no-wait to wait for it")
	}
	return err
}
