package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/registryd/registryd/internal/metrics"
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
}

func loadMetricsConfig(getenv func(string) string, errs *[]string) metricsConfig {
	c := metricsConfig{Listen: getenv("REGISTRY_METRICS_LISTEN"), FleetInterval: metrics.DefaultFleetInterval}
	if v := getenv("REGISTRY_METRICS_LISTEN"); v != "" {
		if _, _, err := net.SplitHostPort(v); err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_METRICS_LISTEN=%q: want host:port, such as 127.0.0.1:9090", v))
		}
	}
	if v := getenv("REGISTRY_METRICS_FLEET_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < metrics.DefaultFleetInterval || d > time.Hour {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_METRICS_FLEET_INTERVAL=%q: want a duration between 15s and 1h, such as 15s", v))
		}
		c.FleetInterval = d
	}
	return c
}

// newMetrics makes a serving registryd's metrics. The store reports its
// statements through cfg.observeQuery, set here before the store opens.
func newMetrics(cfg *config) *metrics.Metrics {
	m := metrics.New()
	cfg.observeQuery = m.ObserveQuery
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

// metricsListener listens on REGISTRY_METRICS_LISTEN, when set; nil
// otherwise. Like the API's, it listens before anything slow starts.
func metricsListener(cfg metricsConfig) (net.Listener, error) {
	if cfg.Listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (set REGISTRY_METRICS_LISTEN to another address): %w", cfg.Listen, err)
	}
	return ln, nil
}

// serveMetricsOn serves only /metrics on ln (others: 404) until stop is
// called, which shuts it down within timeout.
func serveMetricsOn(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration, logger *slog.Logger) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
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
