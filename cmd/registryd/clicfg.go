package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd/client"
)

// cliConfig is the CLI's contexts file, as kubeconfig is kubectl's: the
// registries an admin talks to, and which one is current.
type cliConfig struct {
	CurrentContext string       `yaml:"current_context,omitempty"`
	Contexts       []cliContext `yaml:"contexts"`
}

// cliContext is one registry and how to reach it. Token and TokenFile
// are exclusive; a TokenFile is read for every request.
type cliContext struct {
	Name      string `yaml:"name"`
	Server    string `yaml:"server"`
	Token     string `yaml:"token,omitempty"`
	TokenFile string `yaml:"token_file,omitempty"`
	// CAFile is a PEM file of certificate authorities the server's
	// certificate may be signed by, trusted besides the system's.
	CAFile string `yaml:"ca_file,omitempty"`
}

// maxConfigBytes bounds the contexts file.
const maxConfigBytes = 1 << 20

// cliConfigPath is where the contexts file is: REGISTRY_CONFIG, else
// under $XDG_CONFIG_HOME, else under ~/.config. It reads HOME and
// XDG_CONFIG_HOME raw: they are the system's, not registryd's settings.
func cliConfigPath(getenv, rawenv func(string) string) (string, error) {
	if p := getenv("REGISTRY_CONFIG"); p != "" {
		return p, nil
	}
	if x := rawenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "registryd", "config.yaml"), nil
	}
	if h := rawenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "registryd", "config.yaml"), nil
	}
	return "", errors.New("no contexts file: set REGISTRY_CONFIG, XDG_CONFIG_HOME or HOME")
}

// loadCLIConfig reads the contexts file at path; a file that does not
// exist is an empty configuration.
func loadCLIConfig(path string) (cliConfig, error) {
	var cfg cliConfig
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return cfg, nil
	case err != nil:
		return cfg, err
	case len(b) > maxConfigBytes:
		return cfg, fmt.Errorf("%s: larger than %d bytes", path, maxConfigBytes)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	for i, c := range cfg.Contexts {
		// A token pasted with its newline would make an invalid header.
		cfg.Contexts[i].Token = strings.TrimSpace(c.Token)
		if c.Name == "" {
			return cfg, fmt.Errorf("%s: context %d has no name", path, i+1)
		}
		if c.Token != "" && c.TokenFile != "" {
			return cfg, fmt.Errorf("%s: context %q has both token and token_file", path, c.Name)
		}
	}
	return cfg, nil
}

// save writes cfg to path with mode 0600 (it may hold tokens), through a
// temporary file renamed over it, so a reader sees the old file or the
// new one. The folder is made 0700 when missing.
func (cfg cliConfig) save(path string) error {
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".config-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// find returns the context named name.
func (cfg cliConfig) find(name string) (*cliContext, bool) {
	i := slices.IndexFunc(cfg.Contexts, func(c cliContext) bool { return c.Name == name })
	if i < 0 {
		return nil, false
	}
	return &cfg.Contexts[i], true
}

// cliEnv is what every CLI command needs: where output goes, the
// environment, and a client of the registry once one is asked for.
type cliEnv struct {
	getenv func(string) string // the CLI's settings (commandEnv)
	rawenv func(string) string // the whole environment (HOME, NO_COLOR)
	stdout io.Writer
	stderr io.Writer
	// docs are the node documents the API sent, as sent (client).
	docs *nodeDocs
}

// target is the registry a command talks to: the current context, with
// REGISTRY_SERVER and REGISTRY_TOKEN or REGISTRY_TOKEN_FILE overriding
// its members (either token variable replaces both of the context's).
// A context's token and CA file go to its own server only: a
// REGISTRY_SERVER naming another one takes its token from the
// environment too, or is refused. With server and token both from the
// environment the file's current context is not needed.
func (e *cliEnv) target() (cliContext, error) {
	envServer := e.getenv("REGISTRY_SERVER")
	tok, file := strings.TrimSpace(e.getenv("REGISTRY_TOKEN")), e.getenv("REGISTRY_TOKEN_FILE")
	if tok != "" && file != "" {
		return cliContext{}, errors.New("set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE, not both")
	}
	envOnly := envServer != "" && (tok != "" || file != "")
	var ctx cliContext
	path, err := cliConfigPath(e.getenv, e.rawenv)
	if err == nil {
		cfg, err := loadCLIConfig(path)
		if err != nil {
			return ctx, err
		}
		if cfg.CurrentContext != "" {
			c, ok := cfg.find(cfg.CurrentContext)
			switch {
			case ok:
				ctx = *c
			case !envOnly:
				return ctx, notFound(fmt.Errorf("%s: current context %q is not among its contexts (registryd config use-context NAME)", path, cfg.CurrentContext))
			}
		}
	}
	if envServer != "" && !sameServer(envServer, ctx.Server) {
		if ctx.Server != "" && (ctx.Token != "" || ctx.TokenFile != "") && tok == "" && file == "" {
			return ctx, fmt.Errorf("REGISTRY_SERVER %s is not context %q's server %s: that context's token is not sent to another server; set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE for it too",
				redactURL(envServer), ctx.Name, redactURL(ctx.Server))
		}
		// Another server: nothing of the context's applies to it.
		ctx = cliContext{Name: ctx.Name, Server: envServer}
	}
	switch {
	case tok != "":
		ctx.Token, ctx.TokenFile = tok, ""
	case file != "":
		ctx.Token, ctx.TokenFile = "", file
	}
	if ca := e.getenv("REGISTRY_CA_FILE"); ca != "" {
		ctx.CAFile = ca
	}
	if ctx.Server == "" {
		return ctx, errors.New("no registry: set REGISTRY_SERVER, or a context (registryd config set-context NAME --server URL --token-file FILE, then registryd config use-context NAME)")
	}
	u, err := parseServerURL(ctx.Server)
	if err != nil {
		return ctx, fmt.Errorf("server %s: %v", redactURL(ctx.Server), err)
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		insecure, err := strconv.ParseBool(cmp.Or(e.getenv("REGISTRY_INSECURE_HTTP"), "false"))
		switch {
		case err != nil:
			return ctx, fmt.Errorf("REGISTRY_INSECURE_HTTP=%q: want true or false", e.getenv("REGISTRY_INSECURE_HTTP"))
		case !insecure:
			return ctx, fmt.Errorf("server %s is plain http to another host: the token would cross the network readable; use https (or set REGISTRY_INSECURE_HTTP=true on a network you trust)", u.Redacted())
		}
	}
	return ctx, nil
}

// redactURL is raw with any password replaced, for messages: a
// REGISTRY_SERVER of https://admin:pw@host is never echoed whole.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if strings.Contains(raw, "@") {
			return "(a URL that does not parse)"
		}
		return strconv.Quote(raw)
	}
	return strconv.Quote(u.Redacted())
}

// defaultRequestTimeout bounds each request when REGISTRY_REQUEST_TIMEOUT
// is unset.
const defaultRequestTimeout = 30 * time.Second

// requestTimeout is REGISTRY_REQUEST_TIMEOUT: how long one request may
// wait for its answer (0: for ever).
func (e *cliEnv) requestTimeout() (time.Duration, error) {
	v := e.getenv("REGISTRY_REQUEST_TIMEOUT")
	if v == "" {
		return defaultRequestTimeout, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("REGISTRY_REQUEST_TIMEOUT=%q: want a duration such as 30s (0: none)", v)
	}
	return d, nil
}

// client is a client of the target registry. Every request but the
// watch stream's must be answered within the request timeout; the
// stream, which lives until Ctrl-C, must connect and send its headers
// within it.
func (e *cliEnv) client(ctx context.Context) (*client.Client, error) {
	t, err := e.target()
	if err != nil {
		return nil, err
	}
	timeout, err := e.requestTimeout()
	if err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithUserAgent("registryd-cli")}
	switch {
	case t.Token != "":
		opts = append(opts, client.WithToken(t.Token))
	case t.TokenFile != "":
		src := client.TokenFile(t.TokenFile)
		if _, err := src(ctx); err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		opts = append(opts, client.WithTokenSource(src))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if timeout > 0 {
		tr.DialContext = (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext
		tr.TLSHandshakeTimeout = timeout
		tr.ResponseHeaderTimeout = timeout
	}
	if t.CAFile != "" {
		pool, err := loadAgentCAs(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file %s: %w", t.CAFile, err)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if e.docs == nil {
		e.docs = &nodeDocs{}
	}
	rt := &timeoutTransport{next: &recordTransport{next: tr, docs: e.docs}, timeout: timeout}
	// The API never redirects; following one could carry the token to
	// another scheme or host than the one checked above.
	noRedirect := func(*http.Request, []*http.Request) error {
		return errors.New("the server answered with a redirect, which registryd never sends; not followed (is REGISTRY_SERVER the registry's own URL?)")
	}
	opts = append(opts, client.WithHTTPClient(&http.Client{Transport: rt, CheckRedirect: noRedirect}))
	return client.New(t.Server, opts...)
}

// timeoutTransport ends a request (its answer's body included) that
// takes longer than timeout, except the watch stream's, and says so.
type timeoutTransport struct {
	next    http.RoundTripper
	timeout time.Duration
}

func (d *timeoutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.timeout <= 0 {
		return d.next.RoundTrip(r)
	}
	// The caller's own context decides whose timeout it was: while it is
	// live, a timeout is ours (the transport's header timeout and this
	// deadline are the same length, and either may fire first).
	parent := r.Context()
	cancel := context.CancelFunc(func() {})
	if !strings.HasSuffix(r.URL.Path, "/watch") {
		var ctx context.Context
		ctx, cancel = context.WithTimeout(parent, d.timeout)
		r = r.WithContext(ctx)
	}
	resp, err := d.next.RoundTrip(r)
	if err != nil {
		cancel()
		if parent.Err() == nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("no answer from %s within %s (REGISTRY_REQUEST_TIMEOUT): %w", r.URL.Host, d.timeout, err)
			}
		}
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody ends its request's timeout when it is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// sameServer reports whether two base URLs name one server: scheme and
// host compared without case, a default port the same as none, a path
// without its trailing slash.
func sameServer(a, b string) bool {
	norm := func(s string) string {
		u, err := url.Parse(s)
		if err != nil {
			return s
		}
		host := strings.ToLower(u.Hostname())
		port := u.Port()
		scheme := strings.ToLower(u.Scheme)
		if port == map[string]string{"http": "80", "https": "443"}[scheme] {
			port = ""
		}
		if port != "" {
			host = net.JoinHostPort(host, port)
		}
		return scheme + "://" + host + strings.TrimRight(u.EscapedPath(), "/")
	}
	return norm(a) == norm(b)
}
