package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/registryd/registryd/internal/registry"
)

// PoolStats are the connection pool's figures at one moment (what
// pgxpool.Stat reports).
type PoolStats struct {
	Acquired, Idle, Max, Total int32
	AcquireCount               int64         // acquires that succeeded, ever
	EmptyAcquireCount          int64         // of those, acquires that had to wait for a connection
	CanceledAcquireCount       int64         // acquires given up (deadline or caller)
	AcquireWait                time.Duration // total time acquires waited
}

// Pool reports the connection pool's figures, read by stats at each scrape.
func (m *Metrics) Pool(stats func() PoolStats) {
	m.register(&poolCollector{stats: stats})
}

var (
	poolAcquired = desc("db_pool_acquired_connections", "Pool connections in use now.")
	poolIdle     = desc("db_pool_idle_connections", "Pool connections idle now.")
	poolMax      = desc("db_pool_max_connections", "The pool's size limit.")
	poolTotal    = desc("db_pool_total_connections", "Pool connections open now (in use, idle or being made).")
	poolAcquires = desc("db_pool_acquires_total", "Connections handed out by the pool.")
	poolEmpty    = desc("db_pool_empty_acquires_total", "Acquires that waited because no connection was idle.")
	poolCanceled = desc("db_pool_canceled_acquires_total", "Acquires given up (deadline or caller gone) before a connection came.")
	poolWait     = desc("db_pool_acquire_wait_seconds_total", "Total time spent waiting for pool connections.")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
}

type poolCollector struct{ stats func() PoolStats }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquired, poolIdle, poolMax, poolTotal, poolAcquires, poolEmpty, poolCanceled, poolWait} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(poolAcquired, float64(s.Acquired))
	gauge(poolIdle, float64(s.Idle))
	gauge(poolMax, float64(s.Max))
	gauge(poolTotal, float64(s.Total))
	counter(poolAcquires, float64(s.AcquireCount))
	counter(poolEmpty, float64(s.EmptyAcquireCount))
	counter(poolCanceled, float64(s.CanceledAcquireCount))
	counter(poolWait, s.AcquireWait.Seconds())
}

// DefaultFleetInterval is the least time between two fleet queries.
const DefaultFleetInterval = 15 * time.Second

// fleetTimeout bounds one fleet query, so a slow database cannot hold a
// scrape (and the scrapes queued behind it) for long.
const fleetTimeout = 5 * time.Second

// FleetOptions configure the fleet figures.
type FleetOptions struct {
	// Query counts the nodes by generation and state: one aggregate
	// statement. It is called at most once per Interval, never more
	// often however many scrapes come.
	Query func(ctx context.Context) ([]registry.FleetCount, error)
	// Interval is the least time between two queries; default
	// DefaultFleetInterval.
	Interval time.Duration
	Logger   *slog.Logger
	Now      func() time.Time
}

// Fleet reports the nodes by hardware generation and state. The figures
// come from opts.Query at a scrape when the last query is at least
// Interval old; scrapes in between (and scrapes arriving while a query
// runs) share its answer. ctx bounds the queries: they stop with it.
func (m *Metrics) Fleet(ctx context.Context, opts FleetOptions) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultFleetInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m.register(&fleetCollector{ctx: ctx, opts: opts})
}

var (
	fleetNodes     = desc("fleet_nodes", `Nodes by hardware generation (its name; empty, i.e. no label, for nodes without one) and lifecycle state (gone, lost, draining, cordoned, busy, free).`, "hardware_generation", "state")
	fabricNodes    = desc("fabric_nodes", `Nodes by fabric (nodes without one are not counted here) and lifecycle state.`, "fabric", "state")
	fleetRefreshed = desc("fleet_refreshed_timestamp_seconds", "When the fleet figures were last counted, as a Unix time.")
	fleetQueries   = desc("fleet_queries_total", "Fleet counting queries run.")
	fleetErrors    = desc("fleet_query_errors_total", "Fleet counting queries that failed (the figures then stay as they were).")
)

type fleetCollector struct {
	ctx  context.Context
	opts FleetOptions

	mu        sync.Mutex // held through a query, so concurrent scrapes share it
	attempted time.Time  // last query, failed or not: failures wait the interval too
	refreshed time.Time  // last successful query
	counts    []registry.FleetCount
	queries   int64
	errors    int64
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fleetNodes
	ch <- fabricNodes
	ch <- fleetRefreshed
	ch <- fleetQueries
	ch <- fleetErrors
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if now := c.opts.Now(); c.attempted.IsZero() || now.Sub(c.attempted) >= c.opts.Interval {
		c.attempted = now
		c.queries++
		ctx, cancel := context.WithTimeout(c.ctx, fleetTimeout)
		counts, err := c.opts.Query(ctx)
		cancel()
		if err != nil {
			c.errors++
			c.opts.Logger.Warn("metrics: counting the fleet failed; its figures stay as they were", "err", err)
		} else {
			c.counts, c.refreshed = counts, c.opts.Now()
		}
	}
	counts, refreshed, queries, errs := c.counts, c.refreshed, c.queries, c.errors
	c.mu.Unlock()

	ch <- prometheus.MustNewConstMetric(fleetQueries, prometheus.CounterValue, float64(queries))
	ch <- prometheus.MustNewConstMetric(fleetErrors, prometheus.CounterValue, float64(errs))
	if refreshed.IsZero() {
		return // nothing counted yet: no figures rather than zeros
	}
	ch <- prometheus.MustNewConstMetric(fleetRefreshed, prometheus.GaugeValue, float64(refreshed.UnixNano())/1e9)
	// Every state of every generation, zero included, so that a series
	// goes to 0 rather than vanishing when its last node leaves.
	type key struct {
		gen   string
		state registry.State
	}
	byKey := map[key]int64{}
	var gens []string
	seen := map[string]bool{}
	for _, fc := range counts {
		if !seen[fc.Generation] {
			seen[fc.Generation] = true
			gens = append(gens, fc.Generation)
		}
		if fc.State != "" {
			byKey[key{fc.Generation, fc.State}] += fc.Nodes
		}
	}
	for _, g := range gens {
		for _, st := range registry.States {
			ch <- prometheus.MustNewConstMetric(fleetNodes, prometheus.GaugeValue, float64(byKey[key{g, st}]), g, string(st))
			delete(byKey, key{g, st})
		}
	}
	// A state the store knows and States does not yet: still shown.
	for k, n := range byKey {
		ch <- prometheus.MustNewConstMetric(fleetNodes, prometheus.GaugeValue, float64(n), k.gen, string(k.state))
	}
	collectFabrics(ch, counts)
}

// collectFabrics reports the nodes of each fabric by state, every state
// of every fabric the counts name (zero included).
func collectFabrics(ch chan<- prometheus.Metric, counts []registry.FleetCount) {
	type key struct {
		fabric string
		state  registry.State
	}
	byKey := map[key]int64{}
	var fabrics []string
	for _, fc := range counts {
		if fc.Fabric == "" || fc.State == "" {
			continue
		}
		if _, ok := byKey[key{fc.Fabric, registry.StateFree}]; !ok {
			fabrics = append(fabrics, fc.Fabric)
			for _, st := range registry.States {
				byKey[key{fc.Fabric, st}] += 0
			}
		}
		byKey[key{fc.Fabric, fc.State}] += fc.Nodes
	}
	for _, f := range fabrics {
		for _, st := range registry.States {
			ch <- prometheus.MustNewConstMetric(fabricNodes, prometheus.GaugeValue, float64(byKey[key{f, st}]), f, string(st))
		}
	}
}

// NodeCacheStats are the node cache's figures at one moment (what
// nodecache.Cache.Stats reports).
type NodeCacheStats struct {
	Hits, Misses, Bypassed int64 // reads by pk: from memory, read through and filled, read through (not serving)
	ListHits, ListMisses   int64 // list pages: from memory, from PostgreSQL
	Drops                  int64
	Nodes                  int
	Serving, Complete      bool
	// Consistent reads' waits for the cache to be proven current: in time,
	// or not (the read went to PostgreSQL).
	AwaitsProved, AwaitsBehind int64
}

// NodeCache reports the node cache's figures, read by stats at each scrape.
func (m *Metrics) NodeCache(stats func() NodeCacheStats) {
	m.register(&nodeCacheCollector{stats: stats})
}

var (
	cacheReads    = desc("node_cache_reads_total", "Reads of a node by pk (GET, Node-Id) by where they were answered: hit (memory), miss (PostgreSQL, then cached), bypass (PostgreSQL: the cache was not current).", "result")
	cacheLists    = desc("node_cache_list_pages_total", "List pages by where they were answered: memory or database.", "source")
	cacheDrops    = desc("node_cache_drops_total", "Times the node cache dropped everything after a gap in the change feed.")
	cacheNodes    = desc("node_cache_nodes", "Nodes in the node cache now.")
	cacheServing  = desc("node_cache_serving", "1 while the change feed is proven current and the cache answers reads.")
	cacheComplete = desc("node_cache_complete", "1 while the cache holds the whole fleet and answers list pages.")
	cacheAwaits   = desc("node_cache_awaits_total", "Consistent reads' waits for the node cache to apply every write acknowledged before they arrived, by result: proved (answered from memory) or behind (not in time; answered from PostgreSQL).", "result")
)

type nodeCacheCollector struct{ stats func() NodeCacheStats }

func (c *nodeCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cacheReads, cacheLists, cacheDrops, cacheNodes, cacheServing, cacheComplete, cacheAwaits} {
		ch <- d
	}
}

func (c *nodeCacheCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	metric(cacheReads, prometheus.CounterValue, float64(s.Hits), "hit")
	metric(cacheReads, prometheus.CounterValue, float64(s.Misses), "miss")
	metric(cacheReads, prometheus.CounterValue, float64(s.Bypassed), "bypass")
	metric(cacheLists, prometheus.CounterValue, float64(s.ListHits), "memory")
	metric(cacheLists, prometheus.CounterValue, float64(s.ListMisses), "database")
	metric(cacheDrops, prometheus.CounterValue, float64(s.Drops))
	metric(cacheNodes, prometheus.GaugeValue, float64(s.Nodes))
	metric(cacheServing, prometheus.GaugeValue, flag(s.Serving))
	metric(cacheComplete, prometheus.GaugeValue, flag(s.Complete))
	metric(cacheAwaits, prometheus.CounterValue, float64(s.AwaitsProved), "proved")
	metric(cacheAwaits, prometheus.CounterValue, float64(s.AwaitsBehind), "behind")
}
