package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/registryd/registryd/client"
)

// Exit statuses of the admins' CLI besides 0 (done), 1 (failed: the
// server refused or could not be reached) and 2 (usage). Scripts rely on
// them: docs/cli.md lists them.
const (
	exitDeadline = 3 // nodes drain: the deadline came with nodes still held
	exitNotFound = 4 // a node, job, context or hardware generation named does not exist
)

// exitError is a failure with an exit status of its own.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// notFound marks err as naming something that does not exist (exit 4).
func notFound(err error) error { return &exitError{code: exitNotFound, err: err} }

// cliRunner runs one CLI command on its arguments (flags not yet parsed).
type cliRunner func(ctx context.Context, e *cliEnv, c command, args []string) error

// cliRunners are the commands of the admins' CLI. They run without the
// server's settings (database, token keys): only the CLI's are read.
var cliRunners = map[string]cliRunner{
	"nodes list":             nodesList,
	"nodes get":              nodesGet,
	"nodes cordon":           nodesCordon,
	"nodes uncordon":         nodesUncordon,
	"nodes drain":            nodesDrain,
	"nodes label":            nodesLabel,
	"nodes claim":            nodesClaim,
	"nodes release":          nodesRelease,
	"nodes renew":            nodesRenew,
	"nodes delete":           nodesDelete,
	"audit list":             auditList,
	"fabrics list":           fabricsList,
	"hardware list":          hardwareList,
	"config get-contexts":    configGetContexts,
	"config current-context": configCurrentContext,
	"config use-context":     configUseContext,
	"config set-context":     configSetContext,
	"completion":             completionCmd,
}

// runCLI runs a CLI command and words its failure: a server's refusal as
// its problem (status, title, detail, fields and request id), with the
// exit status that says what kind of failure it is.
func runCLI(ctx context.Context, c command, run cliRunner, args []string, rawenv func(string) string, stdout, stderr io.Writer) error {
	e := &cliEnv{getenv: commandEnv(cmdCLI, rawenv), rawenv: rawenv, stdout: stdout, stderr: stderr}
	for _, w := range unknownSettings(environ()) {
		fmt.Fprintln(stderr, "registryd: warning:", w)
	}
	err := run(ctx, e, c, args)
	var ce *client.Error
	switch {
	case err == nil || errors.Is(err, errUsage):
		return err
	case errors.As(err, &ce):
		wrapped := fmt.Errorf("%s: %s", c.name, problemText(ce))
		if ce.Status == 404 {
			return notFound(wrapped)
		}
		return &exitError{code: 1, err: wrapped}
	}
	return fmt.Errorf("%s: %w", c.name, err)
}

// problemText is a server's problem for people: "403 Forbidden: role
// reader may not cordon nodes (request 01J…)".
func problemText(e *client.Error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", e.Status, e.Title)
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	for i, f := range e.Fields {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(f.Field + " " + f.Message)
		if i == len(e.Fields)-1 {
			b.WriteString(")")
		}
	}
	if e.RequestID != "" {
		b.WriteString(" [request " + e.RequestID + "]")
	}
	return b.String()
}

// parseArgs parses a CLI command's flags and arguments; a mistake is a
// usage error, reported with the command's synopsis.
func parseArgs(e *cliEnv, c command, fs *flag.FlagSet, args []string) ([]string, error) {
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, usageError(e.stderr, c, err)
	}
	return rest, nil
}

// startFlagsOnly parses the flags of a command that takes no arguments,
// checks them with check (a failure is a usage error), and makes the
// client that acts.
func startFlagsOnly(ctx context.Context, e *cliEnv, c command, fs *flag.FlagSet, args []string, check func() error) (*client.Client, error) {
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return nil, err
	}
	err = check()
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected argument %q", rest[0])
	}
	if err != nil {
		return nil, usageError(e.stderr, c, err)
	}
	return e.client(ctx)
}

// outputFlag adds -o/--output, taking the formats allowed.
func outputFlag(fs *flag.FlagSet, out *string, formats ...string) {
	usage := "output `FORMAT`: " + strings.Join(formats, ", ")
	fs.StringVar(out, "output", outTable, usage)
	fs.StringVar(out, "o", outTable, "short for --output")
}

// checkOutput is a usage error unless out is one of formats.
func checkOutput(out string, formats ...string) error {
	if !slices.Contains(formats, out) {
		return fmt.Errorf("-o %s: want one of %s", out, strings.Join(formats, ", "))
	}
	return nil
}
