package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
}

// target is the registry a command talks to: the current context, with
// REGISTRY_SERVER and REGISTRY_TOKEN or REGISTRY_TOKEN_FILE overriding
// its members (either token variable replaces both of the context's).
func (e *cliEnv) target() (cliContext, error) {
	var ctx cliContext
	path, err := cliConfigPath(e.getenv, e.rawenv)
	if err == nil {
		cfg, err := loadCLIConfig(path)
		if err != nil {
			return ctx, err
		}
		if cfg.CurrentContext != "" {
			c, ok := cfg.find(cfg.CurrentContext)
			if !ok {
				return ctx, fmt.Errorf("%s: current context %q is not among its contexts", path, cfg.CurrentContext)
			}
			ctx = *c
		}
	}
	if s := e.getenv("REGISTRY_SERVER"); s != "" {
		ctx.Server = s
	}
	tok, file := strings.TrimSpace(e.getenv("REGISTRY_TOKEN")), e.getenv("REGISTRY_TOKEN_FILE")
	switch {
	case tok != "" && file != "":
		return ctx, errors.New("set REGISTRY_TOKEN or REGISTRY_TOKEN_FILE, not both")
	case tok != "":
		ctx.Token, ctx.TokenFile = tok, ""
	case file != "":
		ctx.Token, ctx.TokenFile = "", file
	}
	if ctx.Server == "" {
		return ctx, errors.New("no registry: set REGISTRY_SERVER, or a context (registryd config set-context NAME --server URL --token-file FILE, then registryd config use-context NAME)")
	}
	if _, err := parseServerURL(ctx.Server); err != nil {
		return ctx, fmt.Errorf("server %q: %v", ctx.Server, err)
	}
	return ctx, nil
}

// client is a client of the target registry.
func (e *cliEnv) client(ctx context.Context) (*client.Client, error) {
	t, err := e.target()
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
	if t.CAFile != "" {
		pool, err := loadAgentCAs(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file %s: %w", t.CAFile, err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		opts = append(opts, client.WithHTTPClient(&http.Client{Transport: tr}))
	}
	return client.New(t.Server, opts...)
}
