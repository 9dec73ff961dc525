package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/connlimit"
	"github.com/registryd/registryd/internal/docs"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/logbatch"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/revoke"
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

// serve is `registryd serve`: it listens, opens (or starts) the database,
// starts the background loops (revocation list, heartbeats, sync, the
// lifecycle sweeper, watch hub; each stopped by a deferred stop, whichever way serve returns),
// waits for the revocation list and serves until ctx ends or the embedded
// database is lost for good, then drains requests for ShutdownTimeout.
func serve(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if err := serveFlags(&cfg).Parse(args); err != nil {
		c, _ := findCommand("serve")
		return usageError(stderr, c, err)
	}
	// Informational lines (an access-log line per request) are written in
	// batches at most 50 ms apart; warnings and errors at once.
	logs := logbatch.New(stderr, 0, 0)
	defer logs.Flush()
	logger := newLogger(cfg, logs)
	// More Ps than cores while PostgreSQL shares them (see procsFactor).
	_, procsSet := os.LookupEnv("GOMAXPROCS")
	prev := runtime.GOMAXPROCS(0)
	if n := procsPlan(prev, runtime.NumCPU(), procsSet, databaseIsLocal(cfg.DatabaseURL)); n != prev {
		runtime.GOMAXPROCS(n)
		defer runtime.SetDefaultGOMAXPROCS() // the runtime's own choice again, and its tracking of CPU limits
		logger.Info("PostgreSQL shares this machine's cores: running more Go Ps than cores (set GOMAXPROCS to choose)",
			"gomaxprocs", n, "cores", runtime.NumCPU())
	}
	// Cancelled on a signal, or when the embedded database is lost for
	// good: either way every background loop below stops.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Listen before starting anything slow, so a taken port fails at once
	// (most likely taken by a serve on the same data folder: then that is
	// what the error says).
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if cfg.DatabaseURL == "" {
			if err := serveRunning(cfg, logger); err != nil {
				return err
			}
		}
		return fmt.Errorf("listen on %s (set REGISTRY_LISTEN to another address): %w", cfg.Listen, err)
	}
	defer ln.Close()
	// A second serve on the same data folder is refused at once, naming
	// the first; one waits here for a one-shot command using it.
	var claim *embeddedClaim
	if cfg.DatabaseURL == "" {
		if claim, err = claimEmbedded(ctx, cfg, logger, "serve"); err != nil {
			return err
		}
		defer claim.release(ctx)
	}
	metricsLn, err := metricsListener(cfg.Metrics)
	if err != nil {
		return err
	}
	if metricsLn != nil {
		defer metricsLn.Close()
	}
	m := newMetrics(&cfg)

	db, err := openMigrated(ctx, cfg, logger, "serve", claim)
	if err != nil {
		return err
	}
	defer db.close()
	watchStore(ctx, m, db.store, cfg.Metrics.FleetInterval, logger)
	dbFailed, stopSupervising := superviseEmbedded(ctx, db, cfg.embedded)
	defer stopSupervising() // before db.close: no restart while stopping

	secret, _, err := tokenSecret(cfg, logger)
	if err != nil {
		return err
	}
	// Revocations are checked from memory; no token is accepted before the
	// list is loaded (the verifier fails closed until then, and serving
	// waits for it below).
	revocations := revoke.New(db.store, revoke.Options{Channel: store.RevocationsChannel,
		Keep: cfg.TokenLifetimes.Longest() + 2*auth.Leeway, Leeway: auth.Leeway, Logger: logger})
	defer lifecycle.Go(ctx, revocations.Run)()
	verifier, err := auth.NewVerifier(auth.Config{Secret: secret, PublicKeys: cfg.JWTPublicKeys,
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Lifetimes: cfg.TokenLifetimes,
		RequireAgentIPs: cfg.AgentRequireIP, Revocations: revocations, CacheSize: cfg.TokenCache})
	if err != nil {
		return err
	}

	// Heartbeats outlive the HTTP server by one final flush.
	beats := heartbeat.New(db.store, heartbeat.Options{Logger: logger, Observer: m})
	m.HeartbeatsPending(beats.Pending)
	defer lifecycle.Go(context.WithoutCancel(ctx), beats.Run)()

	// The sync loop runs when a provider is configured; replicas take turns
	// through an advisory lock.
	syncWorker, err := newSyncer(cfg, db.store, logger, 0, nil, syncPasses(m))
	if err != nil {
		return err
	}
	if syncWorker != nil {
		defer lifecycle.Go(ctx, syncWorker.Run)()
	}

	// The lifecycle sweeper (lost, found, expired leases): one replica at
	// a time, through an advisory lock.
	sweep, err := newSweeper(cfg, db.store, logger)
	if err != nil {
		return err
	}
	defer lifecycle.Go(ctx, sweep.Run)()

	lim := deriveLimits(cfg.limits, int(db.store.Pool().Config().MaxConns), logger)

	// The node cache follows the change feed through the hub; without it
	// (REGISTRY_NODE_CACHE=0) reads by pk go to PostgreSQL.
	var nodes api.NodeCache
	var follower watch.Follower
	var follow []string
	if cfg.NodeCache > 0 {
		c := nodecache.New(db.store, nodecache.Options{Size: cfg.NodeCache, LivenessChannel: store.LivenessChannel, Logger: logger})
		nodes, follower, follow = c, c, []string{store.LivenessChannel}
		m.NodeCache(nodeCacheStats(c))
		// Filled with the fleet once the feed is current (and again
		// after a drop), so reads are hits from the start.
		defer lifecycle.Go(ctx, func(ctx context.Context) {
			c.Preload(ctx, func(ctx context.Context, after int64, limit int) ([]registry.Node, error) {
				return db.store.ListNodes(ctx, registry.NodeFilter{After: after, Limit: limit})
			})
		})()
	}
	// The watch hub stops with the signal, which ends every watch stream so
	// that the HTTP shutdown below is not held up by them.
	hub := watch.New(db.store, watch.Options{
		Follower:            follower,
		FollowChannels:      follow,
		Channels:            watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:              api.EncodeEvent,
		Retention:           cfg.WatchRetention,
		MaxPending:          lim.WatchBufferBytes,
		MaxStreams:          lim.WatchMaxStreams,
		MaxPerPrincipal:     lim.WatchMaxPerPrincipal,
		BackfillConcurrency: lim.WatchBackfillConcurrency,
		Logger:              logger,
	})
	defer lifecycle.Go(ctx, hub.Run)()

	handler := api.New(api.Config{
		Store:      db.store,
		Logger:     logger,
		OpenAPI:    registryd.OpenAPI,
		Docs:       docs.FS(),
		CORS:       cfg.CORSOrigins,
		Auth:       verifier,
		Heartbeats: beats,
		Nodes:      nodes,
		Events:     hub,
		Health:     embeddedHealth(db.cluster, cfg.embedded.healthGrace),
		Ready:      schemaReady(db.store),
		Metrics:    apiMetrics(m, metricsLn),
		Observer:   m,

		LogHeartbeats: cfg.LogHeartbeats,
	})
	srv := newHTTPServer(ctx, handler, logger)
	// Idle keep-alive connections make room for new clients once the
	// connection limit is reached (oldest idle first).
	limited, err := connlimit.Wrap(srv, ln, connlimit.Options{Max: lim.MaxConnections, Logger: logger})
	if err != nil {
		return err
	}
	if err := awaitRevocations(ctx, revocations, cmp.Or(cfg.revocationsWait, 30*time.Second)); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}
	addr := "http://" + ln.Addr().String()
	logger.Info("registryd listening", "addr", addr, "embedded_postgres", db.embedded())
	// One write, so that a reader who sees the first line sees the token too.
	var banner bytes.Buffer
	fmt.Fprintf(&banner, "registryd is serving on %s\n", addr)
	if db.embedded() && cfg.JWTSecret == nil && secret != nil {
		if err := printAdminToken(&banner, cfg, secret, addr); err != nil {
			return err
		}
	}
	logs.Flush() // whoever reads the banner finds the log lines before it
	stdout.Write(banner.Bytes())

	if metricsLn != nil {
		defer serveMetricsOn(ctx, metricsLn, m.Handler(), cfg.Metrics.Pprof, cfg.ShutdownTimeout, logger)()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(limited) }()
	var exitErr error
	select {
	case err := <-errc:
		cancel()
		return fmt.Errorf("serve: %w", err)
	case err := <-dbFailed:
		logger.Error("embedded PostgreSQL is down and could not be restarted; shutting down", "err", err)
		exitErr = fmt.Errorf("embedded PostgreSQL: %w", err)
		cancel()
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
	return exitErr
}

// schemaReady is /readyz's check: the database answers and its schema is
// the one this binary knows.
func schemaReady(st *store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		state, err := st.CheckSchema(ctx)
		if err != nil {
			return errors.New("database unreachable")
		}
		if !state.OK() {
			return errors.New(state.Problem())
		}
		return nil
	}
}

// newHTTPServer is the HTTP server of handler, with timeouts that bound
// what a slow client can hold. Requests keep running through a signal (the
// shutdown drains them) but not past it.
func newHTTPServer(ctx context.Context, handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      5 * time.Minute, // long lists stream; each batch flushes
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
}

// awaitRevocations waits, at most wait, for the token revocation list's
// first load: serving before it would refuse every token (the verifier
// fails closed until then). It returns ctx's error if ctx ends first.
func awaitRevocations(ctx context.Context, list *revoke.List, wait time.Duration) error {
	select {
	case <-list.Loaded():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
		return fmt.Errorf("could not load the token revocation list within %s; is the database reachable?", wait)
	}
}

// printAdminToken hands the person at the terminal who started the
// embedded default a working admin token, signed with the data
// directory's secret, and a command to try it with.
func printAdminToken(stdout io.Writer, cfg config, secret []byte, addr string) error {
	ttl := min(24*time.Hour, cfg.TokenLifetimes.For(registry.RoleAdmin))
	tok, err := auth.Signer{Secret: secret, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Lifetimes: cfg.TokenLifetimes}.
		Sign("admin", registry.RoleAdmin, ttl, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "admin token (%s; more with `registryd token --sub NAME --role ROLE`):\n  export REGISTRY_TOKEN=%s\n  curl -sS --fail-with-body -X POST -H \"Authorization: Bearer $REGISTRY_TOKEN\" %s/v1/nodes/list\n", auth.FormatDuration(ttl), tok, addr)
	return nil
}

// deriveLimits fills in the limits left to be derived: the connection
// limit from the soft RLIMIT_NOFILE (raised to the hard limit when
// allowed) minus a reserve of the pool size plus 64 descriptors; the total
// of watch streams as half the connection limit (at most 10,000), so
// streams never hold every connection; backfills as a quarter of the pool.
func deriveLimits(l limits, pool int, logger *slog.Logger) limits {
	nofile, err := connlimit.NoFile()
	if err != nil {
		nofile = 1024
		logger.Warn("cannot read the file descriptor limit; assuming 1024", "err", err, "hint", "set REGISTRY_MAX_CONNECTIONS")
	}
	reserve := connlimit.Reserve(pool)
	derived := connlimit.FromNoFile(nofile, reserve)
	switch {
	case l.MaxConnections == 0:
		l.MaxConnections = derived
		if nofile < uint64(reserve+connlimit.MinLimit) {
			logger.Warn("the file descriptor limit is too low for a useful connection limit; raise it (ulimit -n)",
				"nofile", nofile, "reserve", reserve, "max_connections", l.MaxConnections)
		}
		logger.Info("connection limit derived from the file descriptor limit",
			"max_connections", l.MaxConnections, "nofile", nofile, "reserve", reserve)
	case l.MaxConnections > derived:
		logger.Warn("REGISTRY_MAX_CONNECTIONS is more than the file descriptor limit leaves room for; connections may use up every descriptor",
			"max_connections", l.MaxConnections, "nofile", nofile, "reserve", reserve, "hint", "raise the limit (ulimit -n) or lower REGISTRY_MAX_CONNECTIONS")
	}
	if l.WatchMaxStreams == 0 {
		l.WatchMaxStreams = max(1, min(l.MaxConnections/2, 10_000))
	}
	if l.WatchBackfillConcurrency == 0 {
		l.WatchBackfillConcurrency = max(1, pool/4)
	}
	logger.Info("limits", "max_connections", l.MaxConnections, "watch_max_streams", l.WatchMaxStreams,
		"watch_max_per_principal", l.WatchMaxPerPrincipal, "watch_buffer_bytes", l.WatchBufferBytes,
		"watch_backfill_concurrency", l.WatchBackfillConcurrency)
	return l
}
