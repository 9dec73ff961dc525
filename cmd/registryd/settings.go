package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// cmdSet names the commands that read a setting.
type cmdSet uint8

const (
	cmdServe cmdSet = 1 << iota
	cmdMigrate
	cmdToken  // registryd token (minting)
	cmdRevoke // registryd token revoke
	cmdSync
	cmdAgent
	cmdHealthcheck // registryd healthcheck
	cmdCLI         // the admins' CLI: nodes, audit, fabrics, hardware, config

	// cmdDB are the commands that open the database.
	cmdDB = cmdServe | cmdMigrate | cmdRevoke | cmdSync
	// cmdServer are the commands run where the server runs.
	cmdServer = cmdDB | cmdToken
	cmdAll    = cmdServer | cmdAgent | cmdHealthcheck
)

// setting is one environment variable registryd reads.
type setting struct {
	Name string
	// Default is the default as docs/operating.md's configuration table words it
	// (without its markdown); "" when there is none.
	Default string
	// value is what the configuration loader uses when the variable is
	// unset (or not read by the command at hand): a literal in the
	// variable's own syntax, "" when the default is derived at start.
	value   string
	Meaning string // one line, for --help
	Cmds    cmdSet
	// Secret values are never printed, not even in an error about them.
	Secret bool
}

// settings is every environment variable registryd reads: configuration
// loading takes defaults from it and shows each command only its own
// variables, --help lists it, and tests check it against the sources and
// against docs/operating.md's configuration table.
var settings = []setting{
	{Name: "REGISTRY_DATABASE_URL", Default: "(unset: embedded PostgreSQL)", Cmds: cmdServer, Secret: true,
		Meaning: "PostgreSQL URL (postgres://USER:PASSWORD@HOST:5432/DB?sslmode=require) or key=value DSN"},
	{Name: "REGISTRY_LISTEN", Default: "127.0.0.1:8080", value: "127.0.0.1:8080", Cmds: cmdServe | cmdHealthcheck,
		Meaning: "address the HTTP server listens on"},
	{Name: "REGISTRY_TLS_CERT_FILE", Default: "(unset: plain HTTP)", Cmds: cmdServe | cmdHealthcheck,
		Meaning: "PEM certificate (chain) serve presents: with REGISTRY_TLS_KEY_FILE, serve speaks TLS 1.2+ only, and reads both files again when they change"},
	{Name: "REGISTRY_TLS_KEY_FILE", Default: "(unset: plain HTTP)", Cmds: cmdServe,
		Meaning: "PEM private key of REGISTRY_TLS_CERT_FILE; the two are set together or not at all"},
	{Name: "REGISTRY_DATA_DIR", Default: "./.data", value: "./.data", Cmds: cmdServer,
		Meaning: "the embedded default's data: its PostgreSQL cluster and token secret"},
	{Name: "REGISTRY_EMBEDDED_WAIT", Default: "1m", value: "1m", Cmds: cmdDB,
		Meaning: "how long a command waits for its turn on the embedded PostgreSQL (1s..1h)"},
	{Name: "REGISTRY_MIGRATE", Default: "false", value: "false", Cmds: cmdServe | cmdRevoke | cmdSync,
		Meaning: "migrate the database up at start"},
	{Name: "REGISTRY_DB_MAX_CONNS", Default: "pgx default (max(4, CPUs))", Cmds: cmdDB,
		Meaning: "connection pool size per replica"},
	{Name: "REGISTRY_DB_ACQUIRE_TIMEOUT", Default: "10s", value: "10s", Cmds: cmdDB,
		Meaning: "how long a request waits for a pooled connection before 503 (at least 10ms)"},
	{Name: "REGISTRY_DB_STATEMENT_TIMEOUT", Default: "30s", value: "30s", Cmds: cmdDB,
		Meaning: "how long one statement may take before it fails (100ms..1h)"},
	{Name: "REGISTRY_DB_IDLE_IN_TRANSACTION_TIMEOUT", Default: "5s", value: "5s", Cmds: cmdDB,
		Meaning: "how long a session of ours may sit idle inside a transaction before the database ends it and frees its locks (100ms..1h)"},
	{Name: "REGISTRY_DB_LOCK_TIMEOUT", Default: "10s", value: "10s", Cmds: cmdDB,
		Meaning: "how long a statement waits for a lock another session holds before it fails (a request: 503, Retry-After: 1) (10ms..1h)"},
	{Name: "REGISTRY_LOG_LEVEL", Default: "info", value: "info", Cmds: cmdAll,
		Meaning: "debug, info, warn or error"},
	{Name: "REGISTRY_LOG_FORMAT", Default: "json for serve, text for every other command", Cmds: cmdAll,
		Meaning: "json or text; logs go to stderr"},
	{Name: "REGISTRY_SHUTDOWN_TIMEOUT", Default: "15s", value: "15s", Cmds: cmdServe,
		Meaning: "how long in-flight requests may finish after SIGINT/SIGTERM"},
	{Name: "PG_BINDIR", Default: "(discovered)", Cmds: cmdDB,
		Meaning: "where the embedded default finds initdb and postgres"},
	{Name: "REGISTRY_JWT_SECRET", Default: "(embedded default: generated)", Cmds: cmdServe | cmdToken, Secret: true,
		Meaning: "HS256 token key, at least 32 bytes (openssl rand -hex 32); the same on every replica"},
	{Name: "REGISTRY_JWT_SECRET_FILE", Cmds: cmdServe | cmdToken,
		Meaning: "the JWT secret from a file (container secrets)"},
	{Name: "REGISTRY_JWT_PUBLIC_KEYS", Cmds: cmdServe | cmdToken,
		Meaning: "PEM file of public keys whose tokens are accepted too (an identity provider's)"},
	{Name: "REGISTRY_JWT_ISSUER", Cmds: cmdServe | cmdToken,
		Meaning: "when set, tokens must carry this iss"},
	{Name: "REGISTRY_JWT_AUDIENCE", Cmds: cmdServe | cmdToken,
		Meaning: "when set, tokens must carry this aud"},
	{Name: "REGISTRY_TOKEN_MAX_TTL", Default: "2160h (90 days)", value: "2160h", Cmds: cmdServe | cmdToken,
		Meaning: "the longest a reader, scheduler or agent token may live (1m..8760h)"},
	{Name: "REGISTRY_ADMIN_TOKEN_MAX_TTL", Default: "24h", value: "24h", Cmds: cmdServe | cmdToken,
		Meaning: "the longest an admin token may live (1m..8760h)"},
	{Name: "REGISTRY_AGENT_REQUIRE_IP", Default: "false", value: "false", Cmds: cmdServe | cmdToken,
		Meaning: "true: agent tokens must be bound to addresses (registryd token --ip)"},
	{Name: "REGISTRY_TOKEN_CACHE", Default: "10000", value: "10000", Cmds: cmdServe,
		Meaning: "how many verified tokens serve remembers (by SHA-256; still checked for expiry and revocation on every use); 0: off"},
	{Name: "REGISTRY_WATCH_RETENTION", Default: "24h", value: "24h", Cmds: cmdServe,
		Meaning: "how long node change events stay resumable (at least 1m)"},
	{Name: "REGISTRY_MAX_CONNECTIONS", Default: "soft RLIMIT_NOFILE (raised to the hard limit at start) − (pool size + 64), at least 16", Cmds: cmdServe,
		Meaning: "HTTP connections held at once"},
	{Name: "REGISTRY_WATCH_MAX_STREAMS", Default: "half the connection limit, at most 10,000", Cmds: cmdServe,
		Meaning: "watch streams per replica"},
	{Name: "REGISTRY_WATCH_MAX_PER_PRINCIPAL", Default: "64", value: "64", Cmds: cmdServe,
		Meaning: "watch streams of one principal per replica"},
	{Name: "REGISTRY_WATCH_BUFFER_BYTES", Default: "1048576 (1 MiB)", value: "1048576", Cmds: cmdServe,
		Meaning: "how far a watcher may lag, in bytes of events, before its stream ends (at least 16384)"},
	{Name: "REGISTRY_WATCH_BACKFILL_CONCURRENCY", Default: "a quarter of the pool, at least 1", Cmds: cmdServe,
		Meaning: "how many resuming watchers read the change log at once"},
	{Name: "REGISTRY_SCP_ENDPOINT", Cmds: cmdServe | cmdSync,
		Meaning: "Samsung SDS Cloud base URL; enables the SCP import"},
	{Name: "REGISTRY_SCP_ACCESS_KEY", Cmds: cmdServe | cmdSync, Secret: true, Meaning: "SCP access key"},
	{Name: "REGISTRY_SCP_ACCESS_KEY_FILE", Cmds: cmdServe | cmdSync, Meaning: "or a file holding it"},
	{Name: "REGISTRY_SCP_SECRET_KEY", Cmds: cmdServe | cmdSync, Secret: true, Meaning: "SCP secret key"},
	{Name: "REGISTRY_SCP_SECRET_KEY_FILE", Cmds: cmdServe | cmdSync, Meaning: "or a file holding it"},
	{Name: "REGISTRY_SCP_ACCOUNT_ID", Cmds: cmdServe | cmdSync, Meaning: "SCP account id (optional)"},
	{Name: "REGISTRY_SCP_GPU_TABLE", Default: "built in", Cmds: cmdServe | cmdSync,
		Meaning: "GPU memory and count per model, e.g. H100=80x8,B300=268x8"},
	{Name: "REGISTRY_E2E_ENDPOINT", Cmds: cmdServe | cmdSync,
		Meaning: "E2E Networks base URL; enables the E2E import"},
	{Name: "REGISTRY_E2E_API_KEY", Cmds: cmdServe | cmdSync, Secret: true, Meaning: "E2E apikey"},
	{Name: "REGISTRY_E2E_API_KEY_FILE", Cmds: cmdServe | cmdSync, Meaning: "or a file holding it"},
	{Name: "REGISTRY_E2E_TOKEN", Cmds: cmdServe | cmdSync, Secret: true, Meaning: "E2E bearer token"},
	{Name: "REGISTRY_E2E_TOKEN_FILE", Cmds: cmdServe | cmdSync, Meaning: "or a file holding it"},
	{Name: "REGISTRY_E2E_PROJECT_ID", Cmds: cmdServe | cmdSync, Meaning: "E2E project"},
	{Name: "REGISTRY_E2E_LOCATION", Cmds: cmdServe | cmdSync, Meaning: "E2E location (Delhi, Chennai)"},
	{Name: "REGISTRY_SYNC_INTERVAL", Default: "5m", value: "5m", Cmds: cmdServe,
		Meaning: "how often serve imports when a provider is enabled"},
	{Name: "REGISTRY_SYNC_TIMEOUT", Default: "10m", value: "10m", Cmds: cmdServe | cmdSync,
		Meaning: "bound on one import pass"},
	{Name: "REGISTRY_SYNC_MAX_REMOVAL", Default: "10", value: "10", Cmds: cmdServe | cmdSync,
		Meaning: "percent of a provider's nodes one pass may take away; a pass that would take more takes none (100: no limit)"},
	{Name: "REGISTRY_SYNC_REMOVAL_PASSES", Default: "3", value: "3", Cmds: cmdServe | cmdSync,
		Meaning: "passes in a row that must find a removal over the limit before it goes ahead"},
	{Name: "REGISTRY_SYNC_MAX_READ_MIB", Default: "256", value: "256", Cmds: cmdServe | cmdSync,
		Meaning: "MiB one provider's pass may read from it, all answers together; a pass past it fails and changes nothing"},
	{Name: "REGISTRY_METRICS_LISTEN", Default: "(unset: on REGISTRY_LISTEN)", Cmds: cmdServe,
		Meaning: "host:port of a separate listener for /metrics (then not served on the API port)"},
	{Name: "REGISTRY_METRICS_FLEET_INTERVAL", Default: "15s", value: "15s", Cmds: cmdServe,
		Meaning: "least time between two counts of the fleet for /metrics (15s..1h)"},
	{Name: "REGISTRY_LOG_HEARTBEATS", Default: "false", value: "false", Cmds: cmdServe,
		Meaning: "true: an access log line for every successful GET /v1/nodes/ping too (by default only failed pings are logged)"},
	{Name: "REGISTRY_PPROF", Default: "false", value: "false", Cmds: cmdServe,
		Meaning: "true: serve Go profiles at /debug/pprof/ on REGISTRY_METRICS_LISTEN, which must be loopback"},
	{Name: "REGISTRY_NODE_TTL", Default: "60s", value: "60s", Cmds: cmdServe,
		Meaning: "how long a node with an agent (or that has heartbeated) may stay silent before it is lost (5s..24h)"},
	{Name: "REGISTRY_LEADER_TTL", Default: "5s", value: "5s", Cmds: cmdServe,
		Meaning: "how long the sweeper's and sync's leadership lasts unrenewed: a frozen leader is replaced within about this plus a second (1s..1m)"},
	{Name: "REGISTRY_IDEMPOTENCY_KEEP", Default: "24h", value: "24h", Cmds: cmdServe,
		Meaning: "how long the answer of a claim, release, renew, cordon or uncordon sent with an Idempotency-Key is kept for its retries (1m..720h)"},
	{Name: "REGISTRY_NODE_CACHE", Default: "200000", value: "200000", Cmds: cmdServe,
		Meaning: "nodes kept in memory for reads by pk, Node-Id checks and (holding the whole fleet) list pages; 0 turns the cache off (0..10000000)"},
	{Name: "REGISTRY_CORS_ORIGINS", Default: "(unset: CORS off)", Cmds: cmdServe,
		Meaning: "origins whose browser pages may call the API, comma-separated; * for any"},
	{Name: "REGISTRY_SERVER", Cmds: cmdAgent | cmdCLI,
		Meaning: "the registry's base URL (required), e.g. https://registry.example.com; the CLI's overrides its context's"},
	{Name: "REGISTRY_TOKEN", Cmds: cmdAgent | cmdCLI, Secret: true,
		Meaning: "the bearer token: the agent's (registryd token --sub NAME --role agent --ip ADDR), or an admin's or reader's for the CLI"},
	{Name: "REGISTRY_TOKEN_FILE", Cmds: cmdAgent | cmdCLI,
		Meaning: "or a file holding it, read for every request (not both)"},
	{Name: "REGISTRY_CONFIG", Default: "(unset: $XDG_CONFIG_HOME/registryd/config.yaml or ~/.config/registryd/config.yaml)", Cmds: cmdCLI,
		Meaning: "the CLI's contexts file (server, token or token file, CA file per context); registryd config writes it, mode 0600"},
	{Name: "REGISTRY_CA_FILE", Default: "(unset: the context's ca_file, else the system's)", Cmds: cmdCLI,
		Meaning: "PEM file of certificate authorities an https server may be signed by, trusted besides the system's; overrides the context's ca_file"},
	{Name: "REGISTRY_INSECURE_HTTP", Default: "false", value: "false", Cmds: cmdCLI,
		Meaning: "allow an http:// server on another host (the token then crosses the network readable)"},
	{Name: "REGISTRY_REQUEST_TIMEOUT", Default: "30s", value: "30s", Cmds: cmdCLI,
		Meaning: "how long the CLI waits for each answer (a watch: for its stream to open); 0 waits for ever"},
	{Name: "REGISTRY_AGENT_IP", Default: "the local address of the route to REGISTRY_SERVER's host", Cmds: cmdAgent,
		Meaning: "this host's address in the registry"},
	{Name: "REGISTRY_AGENT_INSECURE_HTTP", Default: "false", value: "false", Cmds: cmdAgent,
		Meaning: "allow an http:// REGISTRY_SERVER on another host (the token then crosses the network readable)"},
	{Name: "REGISTRY_AGENT_CA_FILE", Default: "(unset: the system's)", Cmds: cmdAgent,
		Meaning: "PEM file of certificate authorities an https REGISTRY_SERVER may be signed by, trusted besides the system's (a private CA)"},
	{Name: "REGISTRY_AGENT_FABRIC", Default: "(unset)", Cmds: cmdAgent,
		Meaning: "this host's fabric (its InfiniBand or RoCE domain), for hosts no cloud import describes"},
	{Name: "REGISTRY_AGENT_LABELS", Default: "(unset)", Cmds: cmdAgent,
		Meaning: "labels for this host's nodes, key=value pairs separated by commas, e.g. rack=r12,team=research"},
	{Name: "REGISTRY_AGENT_INTERVAL", Default: "10s", value: "10s", Cmds: cmdAgent,
		Meaning: "time between passes, 1s..1h"},
	{Name: "REGISTRY_AGENT_STATE", Default: defaultAgentState, value: defaultAgentState, Cmds: cmdAgent,
		Meaning: "the file that remembers the nodes' pks"},
	{Name: "PATH", Default: "(inherited)", Cmds: cmdAgent, Meaning: "where nvidia-smi is looked up"},
}

// lookupSetting finds a setting by its variable's name.
func lookupSetting(name string) (setting, bool) {
	i := slices.IndexFunc(settings, func(s setting) bool { return s.Name == name })
	if i < 0 {
		return setting{}, false
	}
	return settings[i], true
}

// settingsFor are the settings cmd reads, in the table's order.
func settingsFor(cmd cmdSet) []setting {
	var out []setting
	for _, s := range settings {
		if s.Cmds&cmd != 0 {
			out = append(out, s)
		}
	}
	return out
}

// commandEnv is getenv as cmd sees it: a setting cmd does not read is as
// if unset, so a command neither depends on nor stops at another
// command's variables; an unset setting reads as its default value.
func commandEnv(cmd cmdSet, getenv func(string) string) func(string) string {
	return func(name string) string {
		s, ok := lookupSetting(name)
		switch {
		case !ok:
			return getenv(name) // not in the table: a test fails
		case s.Cmds&cmd == 0:
			return s.value
		}
		if v := getenv(name); v != "" {
			return v
		}
		return s.value
	}
}

// printSettings writes the settings of cmd, for --help.
func printSettings(w io.Writer, cmd cmdSet) {
	fmt.Fprintln(w, "environment:")
	for _, s := range settingsFor(cmd) {
		fmt.Fprintf(w, "  %s%s\n      %s\n", s.Name, defaultNote(s), s.Meaning)
	}
}

// defaultNote is s's default as --help shows it after the name.
func defaultNote(s setting) string {
	switch {
	case strings.HasPrefix(s.Default, "("):
		return " " + s.Default
	case s.Default != "":
		return " (default: " + s.Default + ")"
	}
	return ""
}

// redactSecrets replaces in msg every value of a secret setting that the
// environment holds, for a message that might quote one.
func redactSecrets(msg string, getenv func(string) string) string {
	for _, s := range settings {
		if v := getenv(s.Name); s.Secret && len(v) >= 4 {
			msg = strings.ReplaceAll(msg, v, "[redacted]")
		}
	}
	return msg
}

// unknownSettings are warnings, one per REGISTRY_ variable of environ
// (NAME=VALUE pairs) that is no setting of any command, naming the setting
// it is most likely a typo of when one is close enough: a misspelt
// REGISTRY_LISTN would otherwise be ignored without a word.
func unknownSettings(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "REGISTRY_") || slices.ContainsFunc(settings, func(s setting) bool { return s.Name == name }) {
			continue
		}
		msg := name + " is not a setting registryd reads; it is ignored"
		if near := closestSetting(name); near != "" {
			msg += "; did you mean " + near + "?"
		}
		out = append(out, msg)
	}
	slices.Sort(out)
	return out
}

// closestSetting is the setting whose name is fewest edits from name,
// when that is at most a third of name's length after the prefix (ties:
// the first in the table); "" when none is.
func closestSetting(name string) string {
	best, bestD := "", len(strings.TrimPrefix(name, "REGISTRY_"))/3+1
	for _, s := range settings {
		if d := editDistance(name, s.Name); d < bestD {
			best, bestD = s.Name, d
		}
	}
	return best
}
