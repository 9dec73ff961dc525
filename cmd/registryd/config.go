package main

import (
	"crypto"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/nodecache"
	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/watch"
)

// config is every setting, loaded once from the environment and validated.
type config struct {
	DatabaseURL  string        // REGISTRY_DATABASE_URL; empty: embedded PostgreSQL
	Listen       string        // REGISTRY_LISTEN
	DataDir      string        // REGISTRY_DATA_DIR (embedded PostgreSQL's data)
	DataDirSet   bool          // whether REGISTRY_DATA_DIR was given
	EmbeddedWait time.Duration // REGISTRY_EMBEDDED_WAIT: bound on a wait for another registryd's turn on the embedded PostgreSQL
	Migrate      bool          // REGISTRY_MIGRATE: migrate up at start
	LogLevel     slog.Level    // REGISTRY_LOG_LEVEL
	LogFormat    string        // REGISTRY_LOG_FORMAT: json or text
	// UnknownSettings are the warnings about REGISTRY_ variables of the
	// environment that no command reads (unknownSettings): the command's
	// logger says them first.
	UnknownSettings []string
	LogHeartbeats   bool          // REGISTRY_LOG_HEARTBEATS: an access log line for every successful ping too
	MaxConns        int32         // REGISTRY_DB_MAX_CONNS
	AcquireTimeout  time.Duration // REGISTRY_DB_ACQUIRE_TIMEOUT: bound on the wait for a pooled connection
	ShutdownTimeout time.Duration // REGISTRY_SHUTDOWN_TIMEOUT

	StatementTimeout time.Duration // REGISTRY_DB_STATEMENT_TIMEOUT: bound on one statement
	IdleInTxTimeout  time.Duration // REGISTRY_DB_IDLE_IN_TRANSACTION_TIMEOUT: bound on a transaction left idle
	LockTimeout      time.Duration // REGISTRY_DB_LOCK_TIMEOUT: bound on one wait for a lock
	IdempotencyKeep  time.Duration // REGISTRY_IDEMPOTENCY_KEEP: how long Idempotency-Key answers are kept
	LeaderTTL        time.Duration // REGISTRY_LEADER_TTL: how long the sweeper's and sync's leadership lasts unrenewed

	JWTSecret     []byte             // REGISTRY_JWT_SECRET or the file REGISTRY_JWT_SECRET_FILE names
	JWTPublicKeys []crypto.PublicKey // from the PEM file REGISTRY_JWT_PUBLIC_KEYS names
	JWTIssuer     string             // REGISTRY_JWT_ISSUER
	JWTAudience   string             // REGISTRY_JWT_AUDIENCE

	TokenLifetimes auth.Lifetimes // REGISTRY_TOKEN_MAX_TTL, REGISTRY_ADMIN_TOKEN_MAX_TTL
	AgentRequireIP bool           // REGISTRY_AGENT_REQUIRE_IP: agent tokens must carry "ips"
	TokenCache     int            // REGISTRY_TOKEN_CACHE: how many verified tokens are remembered; 0: none

	WatchRetention time.Duration // REGISTRY_WATCH_RETENTION: how long watch events stay resumable

	CORSOrigins []string // REGISTRY_CORS_ORIGINS: origins whose browser pages may call the API; none: CORS off

	// TLSCertFile and TLSKeyFile are serve's certificate and key
	// (REGISTRY_TLS_CERT_FILE, REGISTRY_TLS_KEY_FILE): both set, serve
	// speaks TLS; neither, plain HTTP.
	TLSCertFile, TLSKeyFile string

	limits // connections and watch streams

	Metrics metricsConfig // REGISTRY_METRICS_*

	SCP          scpConfig
	E2E          e2eConfig
	SyncInterval time.Duration // REGISTRY_SYNC_INTERVAL
	SyncTimeout  time.Duration // REGISTRY_SYNC_TIMEOUT
	// SyncMaxRemoval and SyncRemovalPasses are the mass-removal guard
	// (REGISTRY_SYNC_MAX_REMOVAL, REGISTRY_SYNC_REMOVAL_PASSES); the
	// guard lets removals through at once when SyncAllowRemoval
	// (`sync --once --allow-removal`).
	SyncMaxRemoval, SyncRemovalPasses int
	SyncAllowRemoval                  bool
	SyncMaxReadMiB                    int // REGISTRY_SYNC_MAX_READ_MIB

	NodeTTL time.Duration // REGISTRY_NODE_TTL: silence after which a watched node is lost

	NodeCache int // REGISTRY_NODE_CACHE: nodes kept in memory for reads by pk; 0: none

	embedded embeddedTuning // tests only; not from the environment
	// observeQuery is told of every statement the store runs (metrics);
	// set by serve, not from the environment.
	observeQuery func(class string)
	// observeGroup is told of every shared transaction of claims and
	// releases (metrics).
	observeGroup func(committed int, err error)
	// migrations replace the embedded ones (tests of upgrades: one
	// release's set, then the next's); not from the environment.
	migrations fs.FS
	// revocationsWait bounds serve's wait for the first load of the token
	// revocation list; 30s when zero. Tests only; not from the environment.
	revocationsWait time.Duration
}

// scpConfig enables the Samsung SDS Cloud importer when Endpoint is set.
type scpConfig struct {
	Endpoint, AccessKey, SecretKey, AccountID string
	GPUTable                                  map[string]provider.GPUSpec
}

// e2eConfig enables the E2E Networks importer when Endpoint is set.
type e2eConfig struct {
	Endpoint, APIKey, Token, ProjectID, Location string
}

// secret reads NAME, or the file NAME_FILE names (container secrets).
func secret(getenv func(string) string, name string, errs *[]string) string {
	v, file := getenv(name), getenv(name+"_FILE")
	switch {
	case v != "" && file != "":
		*errs = append(*errs, fmt.Sprintf("set %s or %s_FILE, not both", name, name))
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			*errs = append(*errs, fmt.Sprintf("%s_FILE: %v", name, err))
		}
		return strings.TrimRight(string(b), "\r\n")
	}
	return v
}

// requireAll names every missing setting of an enabled provider.
func requireAll(errs *[]string, provider string, settings map[string]string) {
	var missing []string
	for name, v := range settings {
		if v == "" {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		*errs = append(*errs, fmt.Sprintf("%s import is enabled but %s not set", provider, strings.Join(missing, ", ")+map[bool]string{true: " is", false: " are"}[len(missing) == 1]))
	}
}

// loadConfig is serve's configuration, which is every server setting.
func loadConfig(getenv func(string) string) (config, error) {
	return loadCommandConfig(cmdServe, getenv)
}

// loadCommandConfig loads the settings cmd reads (see settings); the
// others keep their defaults, unchecked. Defaults come from settings.
// Each subsystem's settings are read and checked by a function of its
// own; the error names every problem found.
func loadCommandConfig(cmd cmdSet, rawenv func(string) string) (config, error) {
	getenv := commandEnv(cmd, rawenv)
	var c config
	var errs []string
	c.loadDatabase(getenv, rawenv, &errs)
	c.LogLevel, c.LogFormat = loadLogging(getenv, defaultLogFormat(cmd), &errs)
	c.LogHeartbeats = envBool(getenv, "REGISTRY_LOG_HEARTBEATS", &errs)
	c.loadServing(getenv, &errs)
	c.Metrics = loadMetricsConfig(getenv, &errs)
	c.loadSync(getenv, &errs)
	c.NodeTTL = loadNodeTTL(getenv, &errs)
	c.NodeCache = loadNodeCache(getenv, &errs)
	c.loadAuth(getenv, &errs)
	if len(errs) > 0 {
		return c, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// loadDatabase reads where the database is (a URL, or the embedded
// PostgreSQL's data folder and how long to wait for a turn on it),
// whether to migrate at start, and the bounds of the connection pool.
func (c *config) loadDatabase(getenv, rawenv func(string) string, errs *[]string) {
	c.DatabaseURL = getenv("REGISTRY_DATABASE_URL")
	c.DataDir = getenv("REGISTRY_DATA_DIR")
	c.DataDirSet = rawenv("REGISTRY_DATA_DIR") != ""
	if c.DatabaseURL != "" {
		if msg := databaseURLProblem(c.DatabaseURL); msg != "" {
			*errs = append(*errs, "REGISTRY_DATABASE_URL: "+msg)
		}
	}
	c.Migrate = envBool(getenv, "REGISTRY_MIGRATE", errs)
	if v := getenv("REGISTRY_DB_MAX_CONNS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_DB_MAX_CONNS=%q: want a positive integer", v))
		}
		c.MaxConns = int32(n)
	}
	c.AcquireTimeout = envDuration(getenv, "REGISTRY_DB_ACQUIRE_TIMEOUT", 0, 10*time.Millisecond, 0,
		"want a duration of at least 10ms, such as 10s", errs)
	c.StatementTimeout = envDuration(getenv, "REGISTRY_DB_STATEMENT_TIMEOUT", 0, 100*time.Millisecond, time.Hour,
		"want a duration between 100ms and 1h, such as 30s", errs)
	c.IdleInTxTimeout = envDuration(getenv, "REGISTRY_DB_IDLE_IN_TRANSACTION_TIMEOUT", 0, 100*time.Millisecond, time.Hour,
		"want a duration between 100ms and 1h, such as 5s", errs)
	c.LockTimeout = envDuration(getenv, "REGISTRY_DB_LOCK_TIMEOUT", 0, 10*time.Millisecond, time.Hour,
		"want a duration between 10ms and 1h, such as 10s", errs)
	c.EmbeddedWait = envDuration(getenv, "REGISTRY_EMBEDDED_WAIT", 0, time.Second, time.Hour,
		"want a duration between 1s and 1h, such as 1m", errs)
}

// loadServing reads the HTTP server's settings: its address, TLS, shutdown,
// CORS, the limits on what clients can make it hold, and how long watch
// events stay resumable.
func (c *config) loadServing(getenv func(string) string, errs *[]string) {
	c.Listen = getenv("REGISTRY_LISTEN")
	c.TLSCertFile, c.TLSKeyFile = loadTLSFiles(getenv, errs)
	c.ShutdownTimeout = envDuration(getenv, "REGISTRY_SHUTDOWN_TIMEOUT", 0, time.Nanosecond, 0,
		"want a duration such as 15s", errs)
	c.WatchRetention = envDuration(getenv, "REGISTRY_WATCH_RETENTION", 0, time.Minute, 0,
		"want a duration of at least 1m, such as 24h", errs)
	c.IdempotencyKeep = envDuration(getenv, "REGISTRY_IDEMPOTENCY_KEEP", 0, time.Minute, 720*time.Hour,
		"want a duration between 1m and 720h, such as 24h", errs)
	c.LeaderTTL = envDuration(getenv, "REGISTRY_LEADER_TTL", 0, time.Second, time.Minute,
		"want a duration between 1s and 1m, such as 5s", errs)
	if v := getenv("REGISTRY_CORS_ORIGINS"); v != "" {
		origins, err := api.ParseCORSOrigins(v)
		if err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_CORS_ORIGINS=%q: %v", v, err))
		}
		c.CORSOrigins = origins
	}
	c.limits = loadLimits(getenv, errs)
}

// loadSync reads the sync worker's settings: its pace and the providers
// it imports from, each enabled by its endpoint.
func (c *config) loadSync(getenv func(string) string, errs *[]string) {
	const want = "want a duration of at least 1s, such as 5m"
	c.SyncInterval = envDuration(getenv, "REGISTRY_SYNC_INTERVAL", 0, time.Second, 0, want, errs)
	c.SyncTimeout = envDuration(getenv, "REGISTRY_SYNC_TIMEOUT", 0, time.Second, 0, want, errs)
	c.SyncMaxRemoval = envIntIn(getenv, "REGISTRY_SYNC_MAX_REMOVAL", 1, 100, "want a percentage between 1 and 100 (no limit), such as 10", errs)
	c.SyncRemovalPasses = envIntIn(getenv, "REGISTRY_SYNC_REMOVAL_PASSES", 1, 100, "want a number of passes between 1 and 100, such as 3", errs)
	c.SyncMaxReadMiB = envIntIn(getenv, "REGISTRY_SYNC_MAX_READ_MIB", 1, 1<<16, "want a number of MiB between 1 and 65536, such as 256", errs)
	c.SCP = scpConfig{
		Endpoint:  getenv("REGISTRY_SCP_ENDPOINT"),
		AccessKey: secret(getenv, "REGISTRY_SCP_ACCESS_KEY", errs),
		SecretKey: secret(getenv, "REGISTRY_SCP_SECRET_KEY", errs),
		AccountID: getenv("REGISTRY_SCP_ACCOUNT_ID"),
	}
	if c.SCP.Endpoint != "" {
		requireAll(errs, "SCP", map[string]string{"REGISTRY_SCP_ACCESS_KEY": c.SCP.AccessKey, "REGISTRY_SCP_SECRET_KEY": c.SCP.SecretKey})
	}
	table, err := provider.ParseGPUTable(getenv("REGISTRY_SCP_GPU_TABLE"))
	if err != nil {
		*errs = append(*errs, "REGISTRY_SCP_GPU_TABLE: "+err.Error())
	}
	c.SCP.GPUTable = table
	c.E2E = e2eConfig{
		Endpoint:  getenv("REGISTRY_E2E_ENDPOINT"),
		APIKey:    secret(getenv, "REGISTRY_E2E_API_KEY", errs),
		Token:     secret(getenv, "REGISTRY_E2E_TOKEN", errs),
		ProjectID: getenv("REGISTRY_E2E_PROJECT_ID"),
		Location:  getenv("REGISTRY_E2E_LOCATION"),
	}
	if c.E2E.Endpoint != "" {
		requireAll(errs, "E2E", map[string]string{"REGISTRY_E2E_API_KEY": c.E2E.APIKey, "REGISTRY_E2E_TOKEN": c.E2E.Token,
			"REGISTRY_E2E_PROJECT_ID": c.E2E.ProjectID, "REGISTRY_E2E_LOCATION": c.E2E.Location})
	}
}

// loadAuth reads the token settings: the keys that verify (and sign)
// them, their issuer and audience, the caps on their lifetimes, the cache
// of verified tokens and whether agent tokens must name their addresses.
func (c *config) loadAuth(getenv func(string) string, errs *[]string) {
	c.JWTIssuer = getenv("REGISTRY_JWT_ISSUER")
	c.JWTAudience = getenv("REGISTRY_JWT_AUDIENCE")
	c.JWTSecret = loadJWTSecret(getenv, errs)
	if path := getenv("REGISTRY_JWT_PUBLIC_KEYS"); path != "" {
		b, err := os.ReadFile(path)
		if err == nil {
			c.JWTPublicKeys, err = auth.ParsePublicKeys(b)
		}
		if err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_JWT_PUBLIC_KEYS: %v", err))
		}
	}
	want := fmt.Sprintf("want a duration between 1m and %s, such as 24h", auth.FormatDuration(maxTokenTTL))
	c.TokenLifetimes = auth.Lifetimes{
		Max:   envDuration(getenv, "REGISTRY_TOKEN_MAX_TTL", auth.DefaultMaxTTL, time.Minute, maxTokenTTL, want, errs),
		Admin: envDuration(getenv, "REGISTRY_ADMIN_TOKEN_MAX_TTL", auth.DefaultAdminMaxTTL, time.Minute, maxTokenTTL, want, errs),
	}
	c.TokenCache = loadTokenCache(getenv, errs)
	c.AgentRequireIP = envBool(getenv, "REGISTRY_AGENT_REQUIRE_IP", errs)
}

// loadJWTSecret reads REGISTRY_JWT_SECRET or the file
// REGISTRY_JWT_SECRET_FILE names; nil when neither is set. Unlike secret,
// a file that is set but empty (or unreadable) gives an empty secret,
// which the length check then refuses too.
func loadJWTSecret(getenv func(string) string, errs *[]string) []byte {
	var key []byte
	value, file := getenv("REGISTRY_JWT_SECRET"), getenv("REGISTRY_JWT_SECRET_FILE")
	switch {
	case value != "" && file != "":
		*errs = append(*errs, "set REGISTRY_JWT_SECRET or REGISTRY_JWT_SECRET_FILE, not both")
	case value != "":
		key = []byte(value)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_JWT_SECRET_FILE: %v", err))
		}
		key = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	if key != nil && len(key) < auth.MinSecretBytes {
		// Never print the secret itself, only its length.
		*errs = append(*errs, fmt.Sprintf("the JWT secret (REGISTRY_JWT_SECRET or _FILE) is %d bytes; it must be at least %d (e.g. openssl rand -hex 32)", len(key), auth.MinSecretBytes))
	}
	return key
}

// envBool reads the setting name as true or false; false when unset.
func envBool(getenv func(string) string, name string, errs *[]string) bool {
	v := getenv(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		*errs = append(*errs, fmt.Sprintf("%s=%q: want true or false", name, v))
	}
	return b
}

// envDuration reads the setting name as a duration; def when unset. A
// value that is not a duration, or is below lo or above hi (hi 0: no
// bound), is reported as "NAME=value: " followed by want.
func envDuration(getenv func(string) string, name string, def, lo, hi time.Duration, want string, errs *[]string) time.Duration {
	v := getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || hi > 0 && d > hi {
		*errs = append(*errs, fmt.Sprintf("%s=%q: %s", name, v, want))
	}
	return d
}

// defaultLogFormat is REGISTRY_LOG_FORMAT's default: JSON for serve's log
// collectors, text for the commands people run at a terminal (and the
// agent, whose deploy files choose for themselves).
func defaultLogFormat(cmd cmdSet) string {
	if cmd == cmdServe {
		return "json"
	}
	return "text"
}

// loadLogging reads REGISTRY_LOG_LEVEL and REGISTRY_LOG_FORMAT, which the
// server's commands and the agent share; format is def when unset.
func loadLogging(getenv func(string) string, def string, errs *[]string) (level slog.Level, format string) {
	if v := getenv("REGISTRY_LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			*errs = append(*errs, fmt.Sprintf("REGISTRY_LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	format = or(getenv("REGISTRY_LOG_FORMAT"), def)
	if format != "json" && format != "text" {
		*errs = append(*errs, fmt.Sprintf("REGISTRY_LOG_FORMAT=%q: want json or text", format))
	}
	return level, format
}

// envIntIn reads the integer setting name, which must lie in [lo, hi]; 0
// when unset (a command that does not read it: its default is in the
// settings table).
func envIntIn(getenv func(string) string, name string, lo, hi int, want string, errs *[]string) int {
	v := getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		*errs = append(*errs, fmt.Sprintf("%s=%q: %s", name, v, want))
		return 0
	}
	return n
}

// maxNodeCache bounds REGISTRY_NODE_CACHE: ten million nodes take
// several GB; more is a typo.
const maxNodeCache = 10_000_000

// loadNodeCache reads REGISTRY_NODE_CACHE: how many nodes the node cache
// keeps (0 turns it off).
func loadNodeCache(getenv func(string) string, errs *[]string) int {
	v := getenv("REGISTRY_NODE_CACHE")
	if v == "" {
		return nodecache.DefaultSize
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxNodeCache {
		*errs = append(*errs, fmt.Sprintf("REGISTRY_NODE_CACHE=%q: want a number of nodes between 0 (no cache) and %d", v, maxNodeCache))
		return 0
	}
	return n
}

// maxNodeTTL bounds REGISTRY_NODE_TTL: a host silent for a day is lost by
// any measure.
const maxNodeTTL = 24 * time.Hour

// loadNodeTTL reads REGISTRY_NODE_TTL: how long a node with an agent (or
// that has heartbeated) may stay silent before the sweeper marks it lost.
func loadNodeTTL(getenv func(string) string, errs *[]string) time.Duration {
	return envDuration(getenv, "REGISTRY_NODE_TTL", registry.DefaultNodeTTL, registry.MinNodeTTL, maxNodeTTL,
		fmt.Sprintf("want a duration between %s and %s, such as 60s", registry.MinNodeTTL, auth.FormatDuration(maxNodeTTL)), errs)
}

// maxTokenCache bounds REGISTRY_TOKEN_CACHE: an entry takes a few hundred
// bytes, so a million is a few hundred MiB, more than any fleet needs.
const maxTokenCache = 1_000_000

// loadTokenCache reads REGISTRY_TOKEN_CACHE: how many verified tokens
// serve remembers (auth.Config.CacheSize); 0 turns the cache off.
func loadTokenCache(getenv func(string) string, errs *[]string) int {
	v := getenv("REGISTRY_TOKEN_CACHE")
	if v == "" {
		return 0 // a command that does not read it
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxTokenCache {
		*errs = append(*errs, fmt.Sprintf("REGISTRY_TOKEN_CACHE=%q: want a number of tokens between 0 (off) and %d, such as %d",
			v, maxTokenCache, auth.DefaultCacheSize))
	}
	return n
}

// maxTokenTTL bounds the token lifetime caps: a year is already more than
// a bearer token should live.
const maxTokenTTL = 365 * 24 * time.Hour

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// limits bound what clients can make the server hold. Zero means derived
// at start (see deriveLimits).
type limits struct {
	MaxConnections           int // REGISTRY_MAX_CONNECTIONS; 0: from RLIMIT_NOFILE
	WatchMaxStreams          int // REGISTRY_WATCH_MAX_STREAMS; 0: half the connection limit, at most 10,000
	WatchMaxPerPrincipal     int // REGISTRY_WATCH_MAX_PER_PRINCIPAL
	WatchBufferBytes         int // REGISTRY_WATCH_BUFFER_BYTES: how far a watcher may lag, in bytes
	WatchBackfillConcurrency int // REGISTRY_WATCH_BACKFILL_CONCURRENCY; 0: a quarter of the pool, at least 1
}

// loadLimits reads the limits' settings; those unset are derived at start
// or take the watch hub's defaults.
func loadLimits(getenv func(string) string, errs *[]string) limits {
	l := limits{WatchMaxPerPrincipal: watch.DefaultMaxPerPrincipal, WatchBufferBytes: watch.DefaultMaxPending}
	for _, v := range []struct {
		name string
		min  int
		dst  *int
	}{
		{"REGISTRY_MAX_CONNECTIONS", 1, &l.MaxConnections},
		{"REGISTRY_WATCH_MAX_STREAMS", 1, &l.WatchMaxStreams},
		{"REGISTRY_WATCH_MAX_PER_PRINCIPAL", 1, &l.WatchMaxPerPrincipal},
		{"REGISTRY_WATCH_BUFFER_BYTES", 16 << 10, &l.WatchBufferBytes},
		{"REGISTRY_WATCH_BACKFILL_CONCURRENCY", 1, &l.WatchBackfillConcurrency},
	} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < v.min {
			*errs = append(*errs, fmt.Sprintf("%s=%q: want an integer of at least %d", v.name, s, v.min))
		}
		*v.dst = n
	}
	return l
}
