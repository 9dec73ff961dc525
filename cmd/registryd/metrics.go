package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/registryd/registryd/internal/metrics"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/syncer"
)

// metricsConfig is where /metrics is served and how often the fleet is
// counted.
type metricsConfig struct {
	// Listen is REGISTRY_METRICS_LISTEN: an address of its own for
	// /metrics (then the API's port answers 404 there); empty: /metrics is
	// served on REGISTRY_LISTEN with the API.
	Listen string
	// FleetInterval is REGISTRY_METRICS_FLEET_INTERVAL: the least time
	// between two counts of the fleet (one aggregate query each).
	FleetInterval time.Duration
	// Pprof is REGISTRY_PPROF: serve net/http/pprof's profiles under
	// /debug/pprof/ on the metrics listener, which must then be on
	// loopback. Profiles are never served on the API's port: they show
	// the program's memory and can keep a CPU busy, so only someone on
	// the host (or tunnelled to it) may take them.
	Pprof bool
}

func loadMetricsConfig(getenv func(string) string, errs *[]string) metricsConfig {
	c := metricsConfig{Listen: getenv("REGISTRY_METRICS_LISTEN")}
	if v := getenv("REGISTRY_METRICS_LISTEN"); v != "" {
		if _, _, err := net.SplitHostPort(v); err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_METRICS_LISTEN=%q: want host:port, such as 127.0.0.1:9090", v))
		}
	}
	c.Pprof = envBool(getenv, "REGISTRY_PPROF", errs)
	switch {
	case !c.Pprof:
	case c.Listen == "":
		*errs = append(*errs, "REGISTRY_PPROF is on but REGISTRY_METRICS_LISTEN is not set: profiles are served only on the metrics "+
			"listener, never on the API's port; set REGISTRY_METRICS_LISTEN to a loopback address, such as 127.0.0.1:6060")
	case !loopbackHost(c.Listen):
		*errs = append(*errs, fmt.Sprintf("REGISTRY_PPROF is on but REGISTRY_METRICS_LISTEN=%q is not a loopback address: profiles are "+
			"served on loopback only (127.0.0.1, ::1 or localhost); reach them from elsewhere through ssh -L or kubectl port-forward", c.Listen))
	}
	c.FleetInterval = envDuration(getenv, "REGISTRY_METRICS_FLEET_INTERVAL", metrics.DefaultFleetInterval, metrics.DefaultFleetInterval, time.Hour,
		"want a duration between 15s and 1h, such as 15s", errs)
	return c
}

// newMetrics makes a serving registryd's metrics. The store reports its
// statements through cfg.observeQuery and its shared claim transactions
// through cfg.observeGroup, set here before the store opens.
func newMetrics(cfg *config) *metrics.Metrics {
	m := metrics.New()
	m.SetBuild(buildLabels(linkerStamps(), readBuildInfo()))
	cfg.observeQuery = m.ObserveQuery
	cfg.observeGroup = m.ClaimGroup
	return m
}

// watchStore adds the figures read at scrape time from the store: the
// pool's, and the fleet's (counted at most every FleetInterval; the
// queries stop with ctx).
func watchStore(ctx context.Context, m *metrics.Metrics, st *store.Store, interval time.Duration, logger *slog.Logger) {
	pool := st.Pool()
	m.Pool(func() metrics.PoolStats {
		s := pool.Stat()
		return metrics.PoolStats{Acquired: s.AcquiredConns(), Idle: s.IdleConns(), Max: s.MaxConns(), Total: s.TotalConns(),
			AcquireCount: s.AcquireCount(), EmptyAcquireCount: s.EmptyAcquireCount(),
			CanceledAcquireCount: s.CanceledAcquireCount(), AcquireWait: s.AcquireDuration()}
	})
	m.Fleet(ctx, metrics.FleetOptions{Query: st.FleetCounts, Interval: interval, Logger: logger})
}

// syncPasses records each sync pass in m.
func syncPasses(m *metrics.Metrics) func(syncer.Summary) {
	return func(s syncer.Summary) { m.SyncPass(s.Provider, s.Duration, s.Result, s.Err, time.Now()) }
}

// sweepPasses records each lifecycle sweeper pass in m.
func sweepPasses(m *metrics.Metrics) func(time.Duration, registry.Sweep, error) { return m.SweepPass }

// loopbackHost reports whether the host of addr (host:port) is a
// loopback address or "localhost"; an empty host (every interface) is not.
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// metricsListener listens on REGISTRY_METRICS_LISTEN, when set; nil
// otherwise. Like the API's, it listens before anything slow starts. With
// REGISTRY_PPROF on, the address actually bound must be loopback (whatever
// "localhost" resolved to), or it refuses.
func metricsListener(cfg metricsConfig) (net.Listener, error) {
	if cfg.Listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (set REGISTRY_METRICS_LISTEN to another address): %w", cfg.Listen, err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); cfg.Pprof && (!ok || !a.IP.IsLoopback()) {
		ln.Close()
		return nil, fmt.Errorf("REGISTRY_PPROF is on but REGISTRY_METRICS_LISTEN=%q listens on %s, not loopback: profiles are served on loopback only",
			cfg.Listen, ln.Addr())
	}
	return ln, nil
}

// serveMetricsOn serves only /metrics on ln (others: 404) until stop is
// called, which shuts it down within timeout; with pprof, net/http/pprof's
// profiles under /debug/pprof/ too (see metricsConfig.Pprof).
func serveMetricsOn(ctx context.Context, ln net.Listener, h http.Handler, pprofOn bool, timeout time.Duration, logger *slog.Logger) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	if pprofOn {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics listener failed", "err", err)
		}
	}()
	logger.Info("metrics listening", "addr", "http://"+ln.Addr().String()+"/metrics")
	if pprofOn {
		logger.Info("profiles listening (REGISTRY_PPROF)", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	}
	return func() {
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := srv.Shutdown(shutCtx); err != nil {
			srv.Close()
		}
		<-done
	}
}

// apiMetrics is what the API serves at /metrics: nothing when metrics
// have a listener of their own.
func apiMetrics(m *metrics.Metrics, own net.Listener) http.Handler {
	if own != nil {
		return nil
	}
	return m.Handler()
}

// nodeCacheStats reads c's figures for the metrics.
func nodeCacheStats(c *nodecache.Cache) func() metrics.NodeCacheStats {
	return func() metrics.NodeCacheStats {
		s := c.Stats()
		return metrics.NodeCacheStats{Hits: s.Hits, Misses: s.Misses, Bypassed: s.Bypassed, ListHits: s.ListHits,
			ListMisses: s.ListMisses, Drops: s.Drops, Nodes: s.Size, Serving: s.Serving, Complete: s.Complete,
			AwaitsProved: s.AwaitsProved, AwaitsBehind: s.AwaitsBehind}
	}
}
