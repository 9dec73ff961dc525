package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/agent"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// defaultAgentState is where the agent remembers its nodes' pks; the
// systemd unit's StateDirectory= makes the folder.
const defaultAgentState = "/var/lib/registryd-agent/state.json"

// agentConfig is every setting of `registryd agent`, loaded once from the
// environment and validated. It is the agent's own: the agent runs on GPU
// hosts, far from the database and the token keys, so none of the
// server's settings are read or required.
type agentConfig struct {
	Server *url.URL // REGISTRY_SERVER: the registry's base URL
	// InsecureHTTP lets Server be plain http to another host
	// (REGISTRY_AGENT_INSECURE_HTTP); without it only loopback may be.
	InsecureHTTP bool
	// RootCAs are the certificate authorities an https Server may be
	// signed by: the system's and REGISTRY_AGENT_CA_FILE's; nil: the
	// system's alone.
	RootCAs   *x509.CertPool
	Token     string          // REGISTRY_TOKEN
	TokenFile string          // REGISTRY_TOKEN_FILE: read for every request
	IP        string          // REGISTRY_AGENT_IP; empty: the route to the server's
	Interval  time.Duration   // REGISTRY_AGENT_INTERVAL
	Fabric    string          // REGISTRY_AGENT_FABRIC
	Labels    registry.Labels // REGISTRY_AGENT_LABELS
	StatePath string          // REGISTRY_AGENT_STATE
	Path      string          // PATH, where nvidia-smi is looked up
	LogLevel  slog.Level      // REGISTRY_LOG_LEVEL
	LogFormat string          // REGISTRY_LOG_FORMAT

	// Tests only; not from the environment.
	memInfo                string
	backoffMin, backoffMax time.Duration
	tokenCheck             time.Duration // the keeper's longest wait between checks
	refresh                time.Duration
	afterPass              func(agent.Report)
}

// agentSettings are the environment variables `registryd agent` reads,
// and all of them (see settings); the deploy files are checked against
// this list.
var agentSettings = func() (names []string) {
	for _, s := range settingsFor(cmdAgent) {
		names = append(names, s.Name)
	}
	return names
}()

const (
	minAgentInterval = time.Second
	maxAgentInterval = time.Hour
)

func loadAgentConfig(rawenv func(string) string) (agentConfig, error) {
	getenv := commandEnv(cmdAgent, rawenv) // defaults from settings
	c := agentConfig{
		StatePath: getenv("REGISTRY_AGENT_STATE"),
		Path:      getenv("PATH"),
		TokenFile: getenv("REGISTRY_TOKEN_FILE"),
	}
	var errs []string
	c.LogLevel, c.LogFormat = loadLogging(getenv, defaultLogFormat(cmdAgent), &errs)

	c.InsecureHTTP = envBool(getenv, "REGISTRY_AGENT_INSECURE_HTTP", &errs)
	switch raw := getenv("REGISTRY_SERVER"); {
	case raw == "":
		errs = append(errs, "REGISTRY_SERVER is not set: the registry's base URL, such as https://registry.example.com")
	default:
		u, err := parseServerURL(raw)
		if err != nil {
			shown := fmt.Sprintf("REGISTRY_SERVER=%q", raw)
			if strings.Contains(raw, "@") {
				shown = "REGISTRY_SERVER" // user:password@ perhaps: never quoted
			}
			errs = append(errs, fmt.Sprintf("%s: %v", shown, err))
		}
		c.Server = u
		if u != nil && u.Scheme == "http" && !isLoopback(u.Hostname()) && !c.InsecureHTTP {
			errs = append(errs, fmt.Sprintf("REGISTRY_SERVER is plain http to %s, which is not this host: the agent's token would cross the network readable; use https (or set REGISTRY_AGENT_INSECURE_HTTP=true on a network you trust)", u.Host))
		}
	}

	if file := getenv("REGISTRY_AGENT_CA_FILE"); file != "" {
		pool, err := loadAgentCAs(file)
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("REGISTRY_AGENT_CA_FILE=%s: %v", file, err))
		case c.Server != nil && c.Server.Scheme != "https":
			errs = append(errs, "REGISTRY_AGENT_CA_FILE is set but REGISTRY_SERVER is not https: no certificate is checked over plain http")
		}
		c.RootCAs = pool
	}

	tok := getenv("REGISTRY_TOKEN")
	switch {
	case tok != "" && c.TokenFile != "":
		errs = append(errs, "set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE, not both")
	case tok == "" && c.TokenFile == "":
		errs = append(errs, "set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE to an agent token (registryd token --sub NAME --role agent --ip ADDR)")
	case tok != "":
		c.Token = strings.TrimSpace(tok)
		if c.Token == "" || strings.ContainsAny(c.Token, " \t\r\n") {
			errs = append(errs, "REGISTRY_TOKEN must be the token alone")
		}
	default:
		// Read once now, so a wrong path stops the start; the agent reads
		// it again for every request (a rotated token needs no restart).
		if _, err := client.TokenFile(c.TokenFile)(context.Background()); err != nil {
			errs = append(errs, "REGISTRY_TOKEN_FILE: "+err.Error())
		}
	}

	if v := getenv("REGISTRY_AGENT_IP"); v != "" {
		ip, err := registry.CanonicalIP(v)
		if err != nil { // a host's address: not unspecified, broadcast or multicast
			errs = append(errs, fmt.Sprintf("REGISTRY_AGENT_IP=%q: %v", v, err))
		}
		c.IP = ip
	}
	if v := getenv("REGISTRY_AGENT_FABRIC"); v != "" {
		spec := registry.NodeSpec{IP: "127.0.0.1", Fabric: &v}
		for _, fe := range registry.FieldsOf(spec.Normalize()) {
			errs = append(errs, fmt.Sprintf("REGISTRY_AGENT_FABRIC=%q: %s", v, fe.Message))
		}
		c.Fabric = v
	}
	if v := getenv("REGISTRY_AGENT_LABELS"); v != "" {
		labels, err := parseAgentLabels(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("REGISTRY_AGENT_LABELS: %v", err))
		}
		c.Labels = labels
	}
	c.Interval = envDuration(getenv, "REGISTRY_AGENT_INTERVAL", 0, minAgentInterval, maxAgentInterval,
		fmt.Sprintf("want a duration between %s and %s, such as 10s", minAgentInterval, maxAgentInterval), &errs)
	if fi, err := os.Stat(c.StatePath); err == nil && fi.IsDir() {
		errs = append(errs, fmt.Sprintf("REGISTRY_AGENT_STATE=%q is a directory; name a file in it, such as %s", c.StatePath, filepath.Join(c.StatePath, "state.json")))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// loadAgentCAs is the system's certificate authorities (none where the
// system has no pool) and those of the PEM file, which must hold at least
// one certificate.
func loadAgentCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("holds no PEM certificate")
	}
	return pool, nil
}

// parseAgentLabels reads REGISTRY_AGENT_LABELS: key=value pairs
// separated by commas (blanks around them ignored), at most
// registry.MaxLabels, none under registry.ReservedDomain.
func parseAgentLabels(text string) (registry.Labels, error) {
	set := map[string]*string{}
	for part := range strings.SplitSeq(text, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return registry.Labels{}, fmt.Errorf("%q is not key=value", part)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if _, dup := set[k]; dup {
			return registry.Labels{}, fmt.Errorf("label %q is given twice", k)
		}
		set[k] = &v
	}
	return registry.LabelPatch{Set: true, Values: set}.Apply(registry.Labels{})
}

// parseServerURL reads REGISTRY_SERVER: an http or https URL of the
// registry, possibly under a path prefix (a reverse proxy's), without
// credentials, query or fragment.
func parseServerURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, errors.New("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("want an http:// or https:// URL")
	case u.Host == "" || u.Hostname() == "":
		return nil, errors.New("names no host")
	case u.User != nil:
		return nil, errors.New("must not carry credentials; the token goes in REGISTRY_TOKEN or REGISTRY_TOKEN_FILE")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, errors.New("must not have a query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errors.New("port must be between 1 and 65535")
		}
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// agentCmd is `registryd agent`.
func agentCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, once := agentFlags()
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		c, _ := findCommand("agent")
		return usageError(stderr, c, err)
	}
	cfg, err := loadAgentConfig(getenv)
	if err != nil {
		return err
	}
	return runAgent(ctx, cfg, *once, stdout, stderr)
}

// runAgent runs the agent until ctx ends (a signal), which is a clean exit,
// or for one pass with once.
func runAgent(ctx context.Context, cfg agentConfig, once bool, stdout, stderr io.Writer) error {
	logger := newLogger(config{LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat, UnknownSettings: unknownSettings(environ())}, stderr)
	// The state's folder is made now, owner-only, so a place the agent
	// cannot write stops the start rather than every pass.
	if err := os.MkdirAll(filepath.Dir(cfg.StatePath), 0o700); err != nil {
		return fmt.Errorf("REGISTRY_AGENT_STATE: %w", err)
	}
	if cfg.Server.Scheme == "http" && !isLoopback(cfg.Server.Hostname()) {
		logger.Warn("REGISTRY_SERVER is plain http to another host (REGISTRY_AGENT_INSECURE_HTTP=true): the token crosses the network readable; use https", "server", cfg.Server.Redacted())
	}
	api, keeper, err := newAgentAPI(cfg, logger)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Config{
		API:        api,
		Server:     cfg.Server,
		IP:         cfg.IP,
		Interval:   cfg.Interval,
		StatePath:  cfg.StatePath,
		Fabric:     cfg.Fabric,
		Labels:     cfg.Labels,
		Path:       cfg.Path,
		MemInfo:    cfg.memInfo,
		BackoffMin: cfg.backoffMin,
		Refresh:    cfg.refresh,
		BackoffMax: cfg.backoffMax,
		Logger:     logger,
		AfterPass:  cfg.afterPass,
	})
	if err != nil {
		return err
	}
	if !once {
		stopKeeper := lifecycle.Go(ctx, func(ctx context.Context) { keeper.Run(ctx, api.renewToken) })
		defer stopKeeper()
		return a.Run(ctx)
	}
	rep := a.RunOnce(ctx)
	for _, k := range slices.SortedFunc(maps.Keys(rep.Nodes), agent.CompareKeys) {
		fmt.Fprintf(stdout, "node %d: %s index %d\n", rep.Nodes[k], k.IP, k.Index)
	}
	for _, k := range slices.Sorted(maps.Keys(problemsByName(rep.Problems))) {
		fmt.Fprintf(stdout, "problem: %s\n", k)
	}
	switch {
	case rep.Err != nil:
		return fmt.Errorf("agent pass: %w", rep.Err)
	case len(rep.Problems) > 0:
		return fmt.Errorf("agent pass: %d node(s) could not be registered or deleted", len(rep.Problems))
	}
	return nil
}

func problemsByName(p map[agent.Key]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range p {
		out[v] = true
	}
	return out
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}
