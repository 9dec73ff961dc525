package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// database is an open store plus whatever must be stopped after it.
type database struct {
	store    *store.Store
	embedded bool
	close    func()
}

// openDatabase connects to REGISTRY_DATABASE_URL, or starts the embedded
// PostgreSQL when it is unset.
func openDatabase(ctx context.Context, cfg config, logger *slog.Logger) (*database, error) {
	url := cfg.DatabaseURL
	stopCluster := func() {}
	embedded := url == ""
	if embedded {
		c, err := startEmbedded(ctx, cfg, logger)
		if err != nil {
			return nil, err
		}
		url = c.URL()
		stopCluster = func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := c.Stop(ctx); err != nil {
				logger.Error("stop embedded PostgreSQL", "err", err)
			}
		}
	}
	st, err := store.Open(ctx, url, store.Options{MaxConns: cfg.MaxConns, AcquireTimeout: cfg.AcquireTimeout})
	if err != nil {
		stopCluster()
		return nil, err
	}
	return &database{store: st, embedded: embedded, close: func() { st.Close(); stopCluster() }}, nil
}

// embeddedDataDir resolves REGISTRY_DATA_DIR for the embedded default. It
// holds the PostgreSQL cluster (postgres/) and the token secret
// (jwt-secret). As root the server runs as the postgres user, which may not
// be able to enter the checkout (under /root, say); rather than fail on a
// fresh clone, the data then goes to a directory of its own, named after
// the checkout so each checkout keeps its own data.
func embeddedDataDir(cfg config, logger *slog.Logger) (string, error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return "", err
	}
	if err := pglocal.CheckAccess(filepath.Join(dir, "postgres")); err != nil {
		if cfg.DataDirSet || os.Geteuid() != 0 {
			return "", err
		}
		sum := sha256.Sum256([]byte(dir))
		alt := filepath.Join("/var/tmp", "registryd-"+hex.EncodeToString(sum[:6]))
		logger.Warn("data directory is not reachable by the postgres user; using another",
			"wanted", dir, "using", alt, "reason", err.Error(), "hint", "set REGISTRY_DATA_DIR to choose")
		dir = alt
	}
	// 0711: the postgres user passes through to its cluster; nobody else
	// lists the directory, and the secret file itself is 0600.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("create data directory: %w", err)
	}
	return dir, nil
}

// startEmbedded runs registryd's own PostgreSQL in the data directory.
func startEmbedded(ctx context.Context, cfg config, logger *slog.Logger) (*pglocal.Cluster, error) {
	if _, err := pglocal.FindBinDir(); err != nil {
		return nil, err
	}
	dir, err := embeddedDataDir(cfg, logger)
	if err != nil {
		return nil, err
	}
	logger.Info("starting embedded PostgreSQL", "data_dir", dir)
	return pglocal.Start(ctx, pglocal.Options{DataDir: filepath.Join(dir, "postgres"), Database: "registry", Logger: logger})
}

// tokenSecret returns the HS256 secret: the configured one, or for the
// embedded default one kept in the data directory, made on first use.
// created reports whether this call made it.
func tokenSecret(cfg config, logger *slog.Logger) (secret []byte, created bool, err error) {
	if cfg.JWTSecret != nil || len(cfg.JWTPublicKeys) > 0 {
		return cfg.JWTSecret, false, nil
	}
	if cfg.DatabaseURL != "" {
		return nil, false, errors.New("no token keys configured: with REGISTRY_DATABASE_URL set, set REGISTRY_JWT_SECRET (at least 32 bytes, e.g. `openssl rand -hex 32`), REGISTRY_JWT_SECRET_FILE or REGISTRY_JWT_PUBLIC_KEYS; every replica needs the same keys")
	}
	dir, err := embeddedDataDir(cfg, logger)
	if err != nil {
		return nil, false, err
	}
	return auth.LoadOrCreateSecret(filepath.Join(dir, "jwt-secret"))
}

// openMigrated opens the database and makes sure its schema is the
// binary's (migrating when allowed): what serve and sync both need.
func openMigrated(ctx context.Context, cfg config, logger *slog.Logger) (*database, error) {
	db, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	if err := prepareSchema(ctx, db, cfg.Migrate, logger); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

// prepareSchema migrates when allowed, otherwise refuses a schema that is
// not exactly the one this binary knows.
func prepareSchema(ctx context.Context, db *database, migrate bool, logger *slog.Logger) error {
	if migrate || db.embedded {
		m, err := db.store.NewMigrator(logger)
		if err != nil {
			return err
		}
		defer m.Close()
		res, err := m.Up(ctx)
		if err != nil {
			return err
		}
		for _, r := range res {
			logger.Info("migrated", "migration", r.String())
		}
	}
	st, err := db.store.CheckSchema(ctx)
	if err != nil {
		return err
	}
	if !st.OK() {
		return errors.New(st.Problem())
	}
	return nil
}

func serve(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address to listen on (REGISTRY_LISTEN)")
	fs.BoolVar(&cfg.Migrate, "migrate", cfg.Migrate, "apply pending migrations at start (REGISTRY_MIGRATE)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	logger := newLogger(cfg, stderr)

	// Listen before starting anything slow, so a taken port fails at once.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s (set REGISTRY_LISTEN to another address): %w", cfg.Listen, err)
	}
	defer ln.Close()

	db, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer db.close()

	secret, _, err := tokenSecret(cfg, logger)
	if err != nil {
		return err
	}
	verifier, err := auth.NewVerifier(auth.Config{Secret: secret, PublicKeys: cfg.JWTPublicKeys,
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience})
	if err != nil {
		return err
	}

	// Heartbeats outlive the HTTP server by one final flush.
	beats := heartbeat.New(db.store, heartbeat.Options{Logger: logger})
	beatCtx, stopBeats := context.WithCancel(context.WithoutCancel(ctx))
	beatsDone := make(chan struct{})
	go func() { beats.Run(beatCtx); close(beatsDone) }()
	defer func() { stopBeats(); <-beatsDone }()

	// The sync loop runs when a provider is configured; replicas take turns
	// through an advisory lock.
	syncWorker, err := newSyncer(cfg, db.store, logger)
	if err != nil {
		return err
	}
	if syncWorker != nil {
		syncDone := make(chan struct{})
		go func() { syncWorker.Run(ctx); close(syncDone) }()
		defer func() { <-syncDone }()
	}

	// The watch hub stops with the signal, which ends every watch stream so
	// that the HTTP shutdown below is not held up by them.
	hub := watch.New(db.store, watch.Options{
		Channels:  watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Retention: cfg.WatchRetention,
		Logger:    logger,
	})
	hubDone := make(chan struct{})
	go func() { hub.Run(ctx); close(hubDone) }()
	defer func() { <-hubDone }()

	handler := api.New(api.Config{
		Store:      db.store,
		Logger:     logger,
		OpenAPI:    registryd.OpenAPI,
		Auth:       verifier,
		Heartbeats: beats,
		Events:     hub,
		Ready: func(ctx context.Context) error {
			st, err := db.store.CheckSchema(ctx)
			if err != nil {
				return errors.New("database unreachable")
			}
			if !st.OK() {
				return errors.New(st.Problem())
			}
			return nil
		},
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      5 * time.Minute, // long lists stream; each batch flushes
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	addr := "http://" + ln.Addr().String()
	logger.Info("registryd listening", "addr", addr, "embedded_postgres", db.embedded)
	fmt.Fprintf(stdout, "registryd is serving on %s\n", addr)
	if db.embedded && cfg.JWTSecret == nil && secret != nil {
		// The embedded default is for a person at a terminal: hand them a
		// working admin token (signed with the data directory's secret).
		tok, err := auth.Signer{Secret: secret, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience}.
			Sign("admin", registry.RoleAdmin, 24*time.Hour, time.Now())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "admin token (24h; more with `registryd token --sub NAME --role ROLE`):\n  export REGISTRY_TOKEN=%s\n  curl -s -X POST -H \"Authorization: Bearer $REGISTRY_TOKEN\" %s/v1/nodes/list\n", tok, addr)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		logger.Warn("shutdown did not finish in time; closing connections", "err", err)
		srv.Close()
	}
	logger.Info("stopped")
	return nil
}
