package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"regexp"
)

// configFile is the contexts file's path and what it holds.
func (e *cliEnv) configFile() (string, cliConfig, error) {
	path, err := cliConfigPath(e.getenv, e.rawenv)
	if err != nil {
		return "", cliConfig{}, err
	}
	cfg, err := loadCLIConfig(path)
	return path, cfg, err
}

// oneName reads the one argument a config command takes: a context name.
func oneName(e *cliEnv, c command, fs *flag.FlagSet, args []string, want int) ([]string, error) {
	rest, err := parseArgs(e, c, fs, args)
	switch {
	case err != nil:
		return nil, err
	case len(rest) < want:
		return nil, usageError(e.stderr, c, errors.New("name the context"))
	case len(rest) > want:
		return nil, usageError(e.stderr, c, fmt.Errorf("unexpected argument %q", rest[want]))
	case want == 1 && !contextName.MatchString(rest[0]):
		return nil, usageError(e.stderr, c, fmt.Errorf("context name %q: use letters, digits, '.', '_' and '-' (at most 63)", rest[0]))
	}
	return rest, nil
}

// contextName is what a context may be called: shell completion offers
// the names, so none holds anything a shell would read as code.
var contextName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// configGetContexts is `registryd config get-contexts`.
func configGetContexts(_ context.Context, e *cliEnv, c command, args []string) error {
	fs, out := getContextsFlags()
	if _, err := oneName(e, c, fs, args, 0); err != nil {
		return err
	}
	if err := checkOutput(*out, outTable, outName); err != nil {
		return usageError(e.stderr, c, err)
	}
	_, cfg, err := e.configFile()
	if err != nil {
		return err
	}
	if *out == outName {
		// The names alone, for scripts and shell completion.
		for _, x := range cfg.Contexts {
			fmt.Fprintln(e.stdout, x.Name)
		}
		return nil
	}
	t := &table{header: []string{"CURRENT", "NAME", "SERVER", "TOKEN"}}
	for _, x := range cfg.Contexts {
		cur, tok := "", "-"
		if x.Name == cfg.CurrentContext {
			cur = "*"
		}
		switch {
		case x.TokenFile != "":
			tok = x.TokenFile
		case x.Token != "":
			tok = "(in the file)"
		}
		t.rows = append(t.rows, []string{cur, x.Name, x.Server, tok})
	}
	t.write(e.stdout, false)
	return nil
}

// getContextsFlags are config get-contexts' flags: -o table or name.
func getContextsFlags() (*flag.FlagSet, *string) {
	fs := newFlagSet("config get-contexts")
	out := new(string)
	outputFlag(fs, out, outTable, outName)
	return fs, out
}

// configCurrentContext is `registryd config current-context`.
func configCurrentContext(_ context.Context, e *cliEnv, c command, args []string) error {
	fs := newFlagSet(c.name)
	if _, err := oneName(e, c, fs, args, 0); err != nil {
		return err
	}
	path, cfg, err := e.configFile()
	if err != nil {
		return err
	}
	if cfg.CurrentContext == "" {
		return notFound(fmt.Errorf("%s names no current context", path))
	}
	fmt.Fprintln(e.stdout, cfg.CurrentContext)
	return nil
}

// configUseContext is `registryd config use-context NAME`.
func configUseContext(_ context.Context, e *cliEnv, c command, args []string) error {
	fs := newFlagSet(c.name)
	rest, err := oneName(e, c, fs, args, 1)
	if err != nil {
		return err
	}
	path, cfg, err := e.configFile()
	if err != nil {
		return err
	}
	if _, ok := cfg.find(rest[0]); !ok {
		return notFound(fmt.Errorf("%s has no context %q (registryd config get-contexts lists them)", path, rest[0]))
	}
	cfg.CurrentContext = rest[0]
	if err := cfg.save(path); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "switched to context %q\n", rest[0])
	return nil
}

// setContextFlags are config set-context's flags: the members to set.
func setContextFlags() (*flag.FlagSet, *cliContext) {
	x := &cliContext{}
	fs := newFlagSet("config set-context")
	fs.StringVar(&x.Server, "server", "", "the registry's base `URL`, such as https://registry.example.com")
	fs.StringVar(&x.TokenFile, "token-file", "", "a `FILE` holding the token, read for every request (replaces --token)")
	fs.StringVar(&x.Token, "token", "", "the token itself, kept in the contexts file (replaces --token-file)")
	fs.StringVar(&x.CAFile, "ca-file", "", "a PEM `FILE` of certificate authorities the server's certificate may be signed by")
	return fs, x
}

// configSetContext is `registryd config set-context NAME --server …`: it
// adds the context, or changes the members given of one that exists.
// The first context added becomes the current one.
func configSetContext(_ context.Context, e *cliEnv, c command, args []string) error {
	fs, set := setContextFlags()
	rest, err := oneName(e, c, fs, args, 1)
	if err != nil {
		return err
	}
	if set.Token != "" && set.TokenFile != "" {
		return usageError(e.stderr, c, errors.New("--token or --token-file, not both"))
	}
	if set.Server != "" {
		if _, err := parseServerURL(set.Server); err != nil {
			return usageError(e.stderr, c, fmt.Errorf("--server: %v", err))
		}
	}
	// Files are kept as absolute paths: the CLI runs from anywhere.
	for _, file := range []*string{&set.TokenFile, &set.CAFile} {
		if *file == "" {
			continue
		}
		if *file, err = filepath.Abs(*file); err != nil {
			return err
		}
	}
	path, cfg, err := e.configFile()
	if err != nil {
		return err
	}
	x, ok := cfg.find(rest[0])
	if !ok {
		cfg.Contexts = append(cfg.Contexts, cliContext{Name: rest[0]})
		x = &cfg.Contexts[len(cfg.Contexts)-1]
	}
	if set.Server != "" {
		x.Server = set.Server
	}
	if set.Token != "" || set.TokenFile != "" {
		x.Token, x.TokenFile = set.Token, set.TokenFile
	}
	if set.CAFile != "" {
		x.CAFile = set.CAFile
	}
	if x.Server == "" {
		return usageError(e.stderr, c, fmt.Errorf("context %q needs --server", rest[0]))
	}
	if cfg.CurrentContext == "" {
		cfg.CurrentContext = rest[0]
	}
	if err := cfg.save(path); err != nil {
		return err
	}
	verb := "modified"
	if !ok {
		verb = "created"
	}
	fmt.Fprintf(e.stdout, "context %q %s in %s\n", rest[0], verb, path)
	return nil
}
