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
	"sync/atomic"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/connlimit"
	"github.com/registryd/registryd/internal/docs"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/logbatch"
	"github.com/registryd/registryd/internal/metrics"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/revoke"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// newLogger is a command's logger, in cfg's level and format; it first
// warns of cfg.UnknownSettings.
func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	logger := slog.New(slog.NewJSONHandler(w, opts))
	if cfg.LogFormat == "text" {
		logger = slog.New(slog.NewTextHandler(w, opts))
	}
	for _, msg := range cfg.UnknownSettings {
		logger.Warn(msg)
	}
	return logger
}

// serve is `registryd serve`: it listens, opens (or starts) the database,
// starts the background loops (revocation list, heartbeats, sync, the
// lifecycle sweeper, node cache, watch hub), waits for the revocation list
// and serves until ctx ends or the embedded database is lost for good,
// then drains requests for ShutdownTimeout.
//
// Each subsystem is built by a step of wiring, which pushes how to stop
// it; whichever way serve returns, they are stopped in the reverse order
// of their start.
func serve(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if err := serveFlags(&cfg).Parse(args); err != nil {
		c, _ := findCommand("serve")
		return usageError(stderr, c, err)
	}
	// Informational lines (an access-log line per request) are written in
	// batches at most 50 ms apart; warnings and errors at once.
	logs := logbatch.New(stderr, 0, 0)
	defer logs.Flush()
	w := &wiring{cfg: cfg, logs: logs, logger: newLogger(cfg, logs)}
	defer w.stops.run()
	w.setProcs()
	// Cancelled on a signal, or when the embedded database is lost for
	// good: either way every background loop stops.
	ctx, w.cancel = context.WithCancel(ctx)
	w.stops.push(w.cancel)

	if err := w.listen(ctx); err != nil {
		return err
	}
	w.metrics = newMetrics(&w.cfg)
	if err := w.openDatabase(ctx); err != nil {
		return err
	}
	if err := w.startAuth(ctx); err != nil {
		return err
	}
	if err := w.startWorkers(ctx); err != nil {
		return err
	}
	w.lim = deriveLimits(w.cfg.limits, int(w.db.store.Pool().Config().MaxConns), w.logger)
	w.startNodeCache(ctx)
	w.startWatchHub(ctx)
	if err := w.newAPIServer(ctx); err != nil {
		return err
	}
	if err := awaitRevocations(ctx, w.revocations, cmp.Or(w.cfg.revocationsWait, 30*time.Second)); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}
	if err := w.announce(stdout); err != nil {
		return err
	}
	return w.run(ctx)
}

// wiring is a serving registryd, built subsystem by subsystem by serve's
// steps, in the order of its fields.
type wiring struct {
	cfg    config
	logs   *logbatch.Writer
	logger *slog.Logger
	cancel context.CancelFunc // serve's context: every background loop
	stops  stack              // what the steps started, to stop in reverse

	ln        net.Listener   // the API's
	certs     *certFiles     // REGISTRY_TLS_*'s; nil: plain HTTP
	claim     *embeddedClaim // this serve's turn on the embedded PostgreSQL; nil with an external one
	metricsLn net.Listener   // REGISTRY_METRICS_LISTEN's; nil: /metrics is on ln
	metrics   *metrics.Metrics

	db       *database
	dbFailed <-chan error // the embedded PostgreSQL could not be brought back

	secret      []byte // the HS256 key, if any
	revocations *revoke.List
	verifier    *auth.Verifier
	beats       *heartbeat.Recorder
	lim         limits // with the derived ones filled in

	nodes    api.NodeCache  // nil: reads by pk go to PostgreSQL
	follower watch.Follower // the node cache, following the hub's feed
	follow   []string       // the channels the follower is notified of
	hub      *watch.Hub

	srv     *http.Server
	limited net.Listener // ln under the connection limit
}

// stack holds stop functions, to run in the reverse order of push, as
// deferred calls would run.
type stack []func()

func (s *stack) push(stop func()) { *s = append(*s, stop) }

// run calls every stop, the last pushed first; a stop that panics does
// not keep the others from running. Its receiver is a pointer so that
// `defer stops.run()` runs what is pushed after the defer too.
func (s *stack) run() {
	for _, stop := range *s {
		defer stop()
	}
}

// setProcs runs more Ps than cores while PostgreSQL shares them (see
// procsFactor), until serve returns.
func (w *wiring) setProcs() {
	_, procsSet := os.LookupEnv("GOMAXPROCS")
	prev := runtime.GOMAXPROCS(0)
	if n := procsPlan(prev, runtime.NumCPU(), procsSet, databaseIsLocal(w.cfg.DatabaseURL)); n != prev {
		runtime.GOMAXPROCS(n)
		w.stops.push(runtime.SetDefaultGOMAXPROCS) // the runtime's own choice again, and its tracking of CPU limits
		w.logger.Info("PostgreSQL shares this machine's cores: running more Go Ps than cores (set GOMAXPROCS to choose)",
			"gomaxprocs", n, "cores", runtime.NumCPU())
	}
}

// listen reads the TLS certificate and takes the API's address, the
// embedded PostgreSQL (when there is no external one) and the metrics
// address, before anything slow starts, so that a certificate that does
// not load or a taken port fails at once (a port most likely taken by a
// serve on the same data folder: then that is what the error says).
func (w *wiring) listen(ctx context.Context) error {
	cfg := w.cfg
	if cfg.TLSCertFile != "" {
		certs, err := loadCertFiles(cfg.TLSCertFile, cfg.TLSKeyFile, w.logger)
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		w.certs = certs
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if cfg.DatabaseURL == "" {
			if err := serveRunning(cfg, w.logger); err != nil {
				return err
			}
		}
		return fmt.Errorf("listen on %s (set REGISTRY_LISTEN to another address): %w", cfg.Listen, err)
	}
	w.ln = ln
	w.stops.push(func() { ln.Close() })
	// A second serve on the same data folder is refused at once, naming
	// the first; one waits here for a one-shot command using it.
	if cfg.DatabaseURL == "" {
		if w.claim, err = claimEmbedded(ctx, cfg, w.logger, "serve"); err != nil {
			return err
		}
		claim := w.claim
		w.stops.push(func() { claim.release(ctx) })
	}
	if w.metricsLn, err = metricsListener(cfg.Metrics); err != nil {
		return err
	}
	if w.metricsLn != nil {
		w.stops.push(func() { w.metricsLn.Close() })
	}
	return nil
}

// openDatabase opens (or starts) the database at the binary's schema,
// reports its figures to the metrics, and keeps the embedded PostgreSQL
// running.
func (w *wiring) openDatabase(ctx context.Context) error {
	db, err := openMigrated(ctx, w.cfg, w.logger, "serve", w.claim)
	if err != nil {
		return err
	}
	w.db = db
	w.stops.push(db.close)
	watchStore(ctx, w.metrics, db.store, w.cfg.Metrics.FleetInterval, w.logger)
	var stopSupervising func()
	w.dbFailed, stopSupervising = superviseEmbedded(ctx, db, w.cfg.embedded)
	w.stops.push(stopSupervising) // before db.close: no restart while stopping
	return nil
}

// startAuth loads the token keys and starts following the revocation
// list. Revocations are checked from memory; no token is accepted before
// the list is loaded (the verifier fails closed until then, and serve
// waits for it).
func (w *wiring) startAuth(ctx context.Context) error {
	cfg := w.cfg
	secret, _, err := tokenSecret(cfg, w.logger)
	if err != nil {
		return err
	}
	w.secret = secret
	w.revocations = revoke.New(w.db.store, revoke.Options{Channel: store.RevocationsChannel,
		Keep: cfg.TokenLifetimes.Longest() + 3*auth.Leeway, Leeway: auth.Leeway, Logger: w.logger})
	w.stops.push(lifecycle.Go(ctx, w.revocations.Run))
	w.verifier, err = auth.NewVerifier(auth.Config{Secret: secret, PublicKeys: cfg.JWTPublicKeys,
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Lifetimes: cfg.TokenLifetimes,
		RequireAgentIPs: cfg.AgentRequireIP, Revocations: w.revocations, CacheSize: cfg.TokenCache})
	return err
}

// startWorkers starts the background writers: heartbeats, the sync loop
// (when a provider is configured) and the lifecycle sweeper (lost, found,
// expired leases). Replicas take turns at syncing and sweeping through
// leader leases (takeLease).
func (w *wiring) startWorkers(ctx context.Context) error {
	// Heartbeats outlive the HTTP server by one final flush.
	w.beats = heartbeat.New(w.db.store, heartbeat.Options{Logger: w.logger, Observer: w.metrics})
	w.metrics.HeartbeatsPending(w.beats.Pending, w.beats.PendingAge)
	w.stops.push(lifecycle.Go(context.WithoutCancel(ctx), w.beats.Run))
	syncWorker, err := newSyncer(w.cfg, w.db.store, w.logger, 0, nil, syncPasses(w.metrics))
	if err != nil {
		return err
	}
	if syncWorker != nil {
		w.stops.push(lifecycle.Go(ctx, syncWorker.Run))
	}
	sweep, err := newSweeper(w.cfg, w.db.store, w.logger, sweepPasses(w.metrics))
	if err != nil {
		return err
	}
	w.stops.push(lifecycle.Go(ctx, sweep.Run))
	return nil
}

// startNodeCache starts the node cache, unless REGISTRY_NODE_CACHE=0
// turned it off (then reads by pk go to PostgreSQL). It follows the
// change feed through the hub, and is filled with the fleet once the
// feed is current (and again after a drop), so reads are hits from the
// start.
func (w *wiring) startNodeCache(ctx context.Context) {
	if w.cfg.NodeCache <= 0 {
		return
	}
	st := w.db.store
	// Reads ask the hub (started next, before any request is served) to
	// prove the cache current.
	c := nodecache.New(st, nodecache.Options{Size: w.cfg.NodeCache, LivenessChannel: store.LivenessChannel, Logger: w.logger,
		Prove: func(since time.Time) { w.hub.Prove(since) }})
	w.nodes, w.follower, w.follow = c, c, []string{store.LivenessChannel}
	w.metrics.NodeCache(nodeCacheStats(c))
	w.stops.push(lifecycle.Go(ctx, func(ctx context.Context) {
		c.Preload(ctx, func(ctx context.Context, after int64, limit int) ([]registry.Node, error) {
			return st.ListNodes(ctx, registry.NodeFilter{After: after, Limit: limit})
		})
	}))
}

// startWatchHub starts the watch hub. It stops with the signal, which
// ends every watch stream so that the HTTP shutdown is not held up by
// them.
func (w *wiring) startWatchHub(ctx context.Context) {
	w.hub = watch.New(w.db.store, watch.Options{
		Follower:            w.follower,
		FollowChannels:      w.follow,
		Channels:            watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:              api.EncodeEvent,
		Retention:           w.cfg.WatchRetention,
		MaxPending:          w.lim.WatchBufferBytes,
		MaxStreams:          w.lim.WatchMaxStreams,
		MaxPerPrincipal:     w.lim.WatchMaxPerPrincipal,
		BackfillConcurrency: w.lim.WatchBackfillConcurrency,
		Logger:              w.logger,
	})
	w.stops.push(lifecycle.Go(ctx, w.hub.Run))
}

// renewalStaleness bounds how old the revocation list may be for a
// replica to renew tokens: a revocation stored meanwhile would not stop
// renewals minted here, and its row is kept a lifetime plus three times
// auth.Leeway (one for this, one for the verifier's clock skew, one to
// spare for replicas' clocks).
const renewalStaleness = auth.Leeway

// revocationsCurrent says whether the revocation list is recent enough
// to renew tokens by.
func (w *wiring) revocationsCurrent() error { return w.revocations.Current(renewalStaleness) }

// newAPIServer builds the API's handler and its server, on ln under the
// connection limit: idle keep-alive connections make room for new clients
// once the limit is reached (oldest idle first).
func (w *wiring) newAPIServer(ctx context.Context) error {
	cfg := w.cfg
	var renewer api.TokenRenewer
	if w.secret != nil {
		renewer = &auth.Renewer{Verifier: w.verifier, Observe: w.metrics.TokenRenewed, Current: w.revocationsCurrent, Signer: auth.Signer{
			Secret: w.secret, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Lifetimes: cfg.TokenLifetimes}}
	}
	handler := api.New(api.Config{
		Store:      w.db.store,
		Logger:     w.logger,
		OpenAPI:    registryd.OpenAPI,
		Docs:       docs.FS(),
		CORS:       cfg.CORSOrigins,
		Auth:       w.verifier,
		Renewer:    renewer,
		Heartbeats: w.beats,
		Nodes:      w.nodes,
		Events:     w.hub,
		Health:     embeddedHealth(w.db.cluster, cfg.embedded.healthGrace),
		Ready:      schemaReady(w.db.store, w.logger),
		Metrics:    apiMetrics(w.metrics, w.metricsLn),
		Observer:   w.metrics,

		LogHeartbeats:   cfg.LogHeartbeats,
		IdempotencyKeep: cfg.IdempotencyKeep,
	})
	w.srv = newHTTPServer(ctx, handler, w.logger)
	if w.certs != nil {
		w.srv.TLSConfig = w.certs.tlsConfig()
	}
	var err error
	w.limited, err = connlimit.Wrap(w.srv, w.ln, connlimit.Options{Max: w.lim.MaxConnections, Logger: w.logger, TLS: w.srv.TLSConfig})
	return err
}

// announce logs where registryd serves and prints it on stdout, with an
// admin token for whoever started the embedded default at a terminal.
func (w *wiring) announce(stdout io.Writer) error {
	addr := w.scheme() + "://" + w.ln.Addr().String()
	w.logger.Info("registryd listening", "addr", addr, "embedded_postgres", w.db.embedded())
	// One write, so that a reader who sees the first line sees the token too.
	var banner bytes.Buffer
	fmt.Fprintf(&banner, "registryd is serving on %s\n", addr)
	if w.db.embedded() && w.cfg.JWTSecret == nil && w.secret != nil {
		if err := printAdminToken(&banner, w.cfg, w.secret, addr); err != nil {
			return err
		}
	}
	w.logs.Flush() // whoever reads the banner finds the log lines before it
	stdout.Write(banner.Bytes())
	return nil
}

// scheme is the API's: https when serve has a certificate.
func (w *wiring) scheme() string {
	if w.certs != nil {
		return "https"
	}
	return "http"
}

// run serves the API (and the metrics listener) until ctx ends or the
// embedded PostgreSQL is lost for good, then drains requests for
// ShutdownTimeout and closes what is left.
func (w *wiring) run(ctx context.Context) error {
	cfg, logger := w.cfg, w.logger
	if w.metricsLn != nil {
		defer serveMetricsOn(ctx, w.metricsLn, w.metrics.Handler(), cfg.Metrics.Pprof, cfg.ShutdownTimeout, logger)()
	}
	errc := make(chan error, 1)
	go func() {
		if w.certs != nil {
			errc <- w.srv.ServeTLS(w.limited, "", "") // the certificate is TLSConfig's
			return
		}
		errc <- w.srv.Serve(w.limited)
	}()
	var exitErr error
	select {
	case err := <-errc:
		w.cancel()
		return fmt.Errorf("serve: %w", err)
	case err := <-w.dbFailed:
		logger.Error("embedded PostgreSQL is down and could not be restarted; shutting down", "err", err)
		exitErr = fmt.Errorf("embedded PostgreSQL: %w", err)
		w.cancel()
	case <-ctx.Done():
	}
	logger.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := w.srv.Shutdown(shutCtx); err != nil {
		logger.Warn("shutdown did not finish in time; closing connections", "err", err)
		w.srv.Close()
	}
	logger.Info("stopped")
	return exitErr
}

// schemaReady is /readyz's check: the database answers and its schema is
// the one this binary knows.
func schemaReady(st *store.Store, logger *slog.Logger) func(context.Context) error {
	var told atomic.Int64 // the newer schema version last logged
	return func(ctx context.Context) error {
		state, err := st.CheckSchema(ctx)
		if err != nil {
			return errors.New("database unreachable")
		}
		if !state.OK() {
			return errors.New(state.Problem())
		}
		if state.Current > state.Latest && told.Swap(state.Current) != state.Current {
			warnNewerSchema(logger, state)
		}
		return nil
	}
}

// warnNewerSchema says that this replica serves a schema newer than its
// own, which the newer migrations allow (store.SchemaState.OK).
func warnNewerSchema(logger *slog.Logger, st store.SchemaState) {
	logger.Warn("the database schema is newer than this registryd; serving it, as every newer migration allows: roll out the release that brought it",
		"schema", st.Current, "known", st.Latest)
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
		ConnContext:       api.ConnContext, // a claim whose client is gone gives its nodes back
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
