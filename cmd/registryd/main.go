// Command registryd is the worker-node registry of a GPU fleet.
//
//	registryd serve                    the HTTP server
//	registryd migrate up|down|status   schema migrations
//	registryd token --sub S --role R   a signed bearer token
//	registryd token revoke --sub S     stop tokens before they expire
//	registryd sync --once              one import pass of every provider
//	registryd agent                    the GPU host agent
//	registryd healthcheck              probe a running server (containers)
//	registryd nodes list|get|cordon|…  the admins' CLI (also audit, fabrics,
//	                                   hardware, config, completion)
//	registryd version                  the version and VCS revision
//
// Configuration comes from REGISTRY_* environment variables (the table in
// settings.go; registryd COMMAND --help lists a command's); see docs/operating.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, errUsage) {
		// The messages name variables, not secret values; this is a net
		// under that rule, not the rule.
		fmt.Fprintln(os.Stderr, "registryd:", redactSecrets(err.Error(), os.Getenv))
	}
	os.Exit(exitCode(err))
}

// environ is the environment's variables (NAME=VALUE), for the warning
// about unknown settings.
var environ = os.Environ

// errUsage is a command line registryd does not understand; the usage has
// been printed.
var errUsage = errors.New("usage")

// exitCode is the process's exit status for run's error: 0, 2 for a usage
// error (as flag and most Unix tools do), the status an *exitError
// carries (the CLI's 3 and 4), 1 for any other failure.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ee):
		return ee.code
	}
	return 1
}

// run is the whole program, minus process plumbing, so tests drive the real
// wiring in-process. The command line is checked, and --help answered,
// before the configuration is loaded: help works whatever the environment
// holds.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return nil
	case "-version", "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	c, rest, ok := resolve(args)
	if !ok {
		fmt.Fprintf(stderr, "registryd: unknown command %q\n\n%s", args[0], usage())
		return errUsage
	}
	if c.name == "help" {
		return helpCmd(rest, stdout, stderr)
	}
	help, err := parseCommandLine(c, rest)
	if err != nil {
		return usageError(stderr, c, err)
	}
	if help {
		printHelp(stdout, c)
		return nil
	}
	switch c.name {
	case "version":
		fmt.Fprint(stdout, versionText(linkerStamps(), readBuildInfo()))
		return nil
	case "agent":
		// The agent has settings of its own and runs on GPU hosts, where
		// the server's settings (database, token keys) are neither set
		// nor to be checked.
		return warnOnFailure(agentCmd(ctx, rest, getenv, stdout, stderr), stderr)
	case "healthcheck":
		// Runs in the server's container, next to settings it has no need
		// to check (it only asks the server over HTTP).
		return healthcheckCmd(ctx, rest, getenv, stdout, stderr)
	}
	if cli, ok := cliRunners[c.name]; ok {
		// The admins' CLI runs on admins' machines: it reads its own
		// settings (server, token, contexts), none of the server's.
		return runCLI(ctx, c, cli, rest, getenv, stdout, stderr)
	}
	cfg, err := loadCommandConfig(c.reads, getenv)
	if err != nil {
		return warnOnFailure(err, stderr)
	}
	cfg.UnknownSettings = unknownSettings(environ())
	switch strings.Fields(c.name)[0] {
	case "serve":
		return serve(ctx, cfg, rest, stdout, stderr)
	case "migrate":
		return migrate(ctx, cfg, args[1:], stdout, stderr)
	case "token":
		return warnOnFailure(token(ctx, cfg, args[1:], stdout, stderr), stderr)
	case "sync":
		return syncCmd(ctx, cfg, rest, stdout, stderr)
	}
	return fmt.Errorf("command %q is not wired", c.name)
}

// warnOnFailure returns err, first writing to stderr the warnings about
// unknown settings when it is a failure: a command that stops before its
// logger says them (a setting missing because it was misspelt) still
// names the misspelling.
func warnOnFailure(err error, stderr io.Writer) error {
	if err != nil && !errors.Is(err, errUsage) {
		for _, w := range unknownSettings(environ()) {
			fmt.Fprintln(stderr, "registryd: warning:", w)
		}
	}
	return err
}

// helpCmd is `registryd help [COMMAND]`.
func helpCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage())
		return nil
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		args = []string{"help"}
	}
	c, rest, ok := resolve(args)
	if !ok || len(rest) > 0 {
		fmt.Fprintf(stderr, "registryd help: no command %q\n\n%s", strings.Join(args, " "), usage())
		return errUsage
	}
	printHelp(stdout, c)
	return nil
}
