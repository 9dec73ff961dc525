package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// command is one of registryd's commands as its --help describes it.
type command struct {
	name     string // as typed after registryd: "serve", "migrate up"
	synopsis string // its usage, after "registryd "
	summary  string // one line for the list of commands
	about    string // what --help says of it, before flags and settings
	reads    cmdSet // whose settings it reads; 0: none
	// flags makes the command's flag set, the one it parses its
	// arguments with; nil: it takes none.
	flags func() *flag.FlagSet
	// group commands only name their subcommands (migrate).
	group bool
}

var commands = []command{
	{name: "serve", synopsis: "serve [--listen ADDR] [--migrate]", reads: cmdServe,
		summary: "run the HTTP server (REGISTRY_LISTEN, default 127.0.0.1:8080)",
		about: `Runs the HTTP server: the Nodes API, heartbeats, claims, watch streams
and, when a provider is configured, the cloud import every
REGISTRY_SYNC_INTERVAL. Without REGISTRY_DATABASE_URL it runs its own
PostgreSQL in REGISTRY_DATA_DIR, migrates it, and prints an admin token.
SIGINT or SIGTERM drain requests for REGISTRY_SHUTDOWN_TIMEOUT, then stop.
Logs are JSON unless REGISTRY_LOG_FORMAT=text.`,
		flags: func() *flag.FlagSet { return serveFlags(&config{}) }},
	{name: "migrate", synopsis: "migrate up|down|status", reads: cmdMigrate, group: true,
		summary: "apply, roll back one, or list schema migrations",
		about: `Manages the database schema (migrations embedded in the binary). They
take an advisory lock, so replicas started together do not race.
  migrate up       apply every pending migration
  migrate down     roll back the newest one
  migrate status   list them, applied or pending`},
	{name: "migrate up", synopsis: "migrate up", reads: cmdMigrate,
		about: "Applies every pending migration and prints each."},
	{name: "migrate down", synopsis: "migrate down", reads: cmdMigrate,
		about: "Rolls back the newest applied migration."},
	{name: "migrate status", synopsis: "migrate status", reads: cmdMigrate,
		about: "Lists every migration, applied (and when) or pending."},
	{name: "token", synopsis: "token --sub NAME --role ROLE [--ttl 24h] [--ip ADDR|CIDR ...]", reads: cmdToken,
		summary: "print a signed token (admin, scheduler, agent, reader)",
		about: `Prints a token signed with REGISTRY_JWT_SECRET (or the embedded
default's secret in REGISTRY_DATA_DIR), with its id (jti). The last line
of stdout is the token alone: TOKEN=$(registryd token ... | tail -1).
Revoke tokens with registryd token revoke.`,
		flags: func() *flag.FlagSet { fs, _ := tokenFlags(); return fs }},
	{name: "token revoke", synopsis: "token revoke --sub NAME | --jti ID [--until TIME]", reads: cmdRevoke,
		summary: "revoke a principal's tokens, or one token",
		about: `Stores a revocation in the database (audited); every replica refuses
the tokens within seconds. --sub revokes every token of a principal
issued until now, --jti one token. Over HTTP: POST /v1/tokens/revoke.`,
		flags: func() *flag.FlagSet { fs, _ := revokeFlags(); return fs }},
	{name: "sync", synopsis: "sync --once [--no-wait] [--allow-removal]", reads: cmdSync,
		summary: "import the inventory of every configured cloud once",
		about: `Runs one import pass of every configured provider (REGISTRY_SCP_*,
REGISTRY_E2E_*), prints a summary each, and exits 1 if any failed.
serve runs the same pass every REGISTRY_SYNC_INTERVAL. While another
registryd is in the middle of a pass, it waits for that pass to end (at
most REGISTRY_SYNC_TIMEOUT) and then runs its own; --no-wait refuses at
once instead. A pass that would take away more than
REGISTRY_SYNC_MAX_REMOVAL percent of a provider's nodes takes away none
until REGISTRY_SYNC_REMOVAL_PASSES passes in a row have found as much;
--allow-removal lets this pass take them.`,
		flags: func() *flag.FlagSet { fs, _, _, _ := syncFlags(); return fs }},
	{name: "agent", synopsis: "agent [--once]", reads: cmdAgent,
		summary: "the GPU host agent: discover, register, heartbeat",
		about: `Runs on a GPU host: finds its GPUs (nvidia-smi on PATH; without it, or
with no device, the host is CPU-only: one node), registers one node per
GPU, heartbeats them every interval, updates a changed driver version,
deletes the node of a GPU that is gone, registers again a node an admin
deleted, and backs off while the registry is down. SIGTERM stops it
(exit 0); its nodes stay registered and the next start takes them up.
It reads only the settings below, none of the server's.`,
		flags: func() *flag.FlagSet { fs, _ := agentFlags(); return fs }},
	{name: "healthcheck", synopsis: "healthcheck [--path /healthz|/readyz] [--url URL] [--timeout 5s]", reads: cmdHealthcheck,
		summary: "ask the local registryd for /healthz; exit 0 if healthy",
		about: `Asks a running registryd whether it is healthy: exits 0 when the answer is
2xx, 1 otherwise. For container health checks in images without curl. The
address is REGISTRY_LISTEN's (an unspecified host such as 0.0.0.0 is asked
on the loopback), unless --url names one.`,
		flags: func() *flag.FlagSet { fs, _, _, _ := healthcheckFlags(); return fs }},
	{name: "version", synopsis: "version", summary: "print the version, VCS revision and Go version (also --version)",
		about: `Prints the module version and VCS revision this binary was built from
(with whether the tree had uncommitted changes, and the commit time),
the build time when the build recorded one, and the Go version.`},
	{name: "help", synopsis: "help [COMMAND]", summary: "this list, or a command's help (as COMMAND --help)",
		about: "Prints the list of commands, or with a command its help."},
}

func findCommand(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// resolve finds the command args name (a subcommand takes the second
// word) and the arguments left for its flags.
func resolve(args []string) (command, []string, bool) {
	if len(args) > 1 {
		if c, ok := findCommand(args[0] + " " + args[1]); ok {
			return c, args[2:], true
		}
	}
	c, ok := findCommand(args[0])
	return c, args[1:], ok
}

// usage is the list of commands.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: registryd <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		switch {
		case c.summary == "":
		case len(c.synopsis) > 24:
			fmt.Fprintf(&b, "  %s\n  %-24s %s\n", c.synopsis, "", c.summary)
		default:
			fmt.Fprintf(&b, "  %-24s %s\n", c.synopsis, c.summary)
		}
	}
	b.WriteString(`
registryd COMMAND --help shows a command's flags and the environment
variables it reads; registryd serve --help lists every server setting.
Without REGISTRY_DATABASE_URL, registryd runs its own PostgreSQL in
REGISTRY_DATA_DIR (default ./.data). Exit status: 0 done, 1 failed,
2 usage error (unknown command or flag, missing argument).
`)
	return b.String()
}

// printHelp writes c's --help.
func printHelp(w io.Writer, c command) {
	fmt.Fprintf(w, "usage: registryd %s\n\n%s\n", c.synopsis, c.about)
	if c.group {
		fmt.Fprintf(w, "\nregistryd %s SUBCOMMAND --help shows a subcommand's help.\n", c.name)
	}
	fmt.Fprintln(w, "\nflags:")
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if c.flags != nil {
		c.flags().VisitAll(func(f *flag.Flag) {
			arg, text := flag.UnquoteUsage(f)
			if arg != "" {
				arg = " " + arg
			}
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
				text += " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(tw, "  --%s%s\t%s\n", f.Name, arg, text)
		})
	}
	fmt.Fprintf(tw, "  -h, --help\t%s\n", "show this help")
	tw.Flush()
	fmt.Fprintln(w)
	if c.reads == 0 {
		fmt.Fprintln(w, "environment: none read")
		return
	}
	printSettings(w, c.reads)
	if c.reads == cmdServe {
		// Every setting, so that this is the one list: the agent's too.
		fmt.Fprintln(w, "\nread by `registryd agent` only (registryd agent --help):")
		for _, s := range settings {
			if s.Cmds&cmdServe == 0 {
				fmt.Fprintf(w, "  %s%s\n", s.Name, defaultNote(s))
			}
		}
	}
}

// usageError reports a command line that does not parse: on stderr, with
// the command's synopsis and where to find more.
func usageError(stderr io.Writer, c command, err error) error {
	fmt.Fprintf(stderr, "registryd %s: %v\nusage: registryd %s\nrun `registryd %s --help` for its flags and settings\n",
		c.name, err, c.synopsis, c.name)
	return errUsage
}

// parseCommandLine checks args against c's flags before anything is
// loaded, so that --help works whatever the environment holds and a
// mistyped flag is a usage error. help reports --help or -h.
func parseCommandLine(c command, args []string) (help bool, err error) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	if c.flags != nil {
		fs = c.flags()
	}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return true, nil
	case err != nil:
		return false, err
	case c.group:
		if fs.NArg() > 0 {
			return false, fmt.Errorf("unknown subcommand %q", fs.Arg(0))
		}
		return false, errors.New("a subcommand is needed")
	case fs.NArg() > 0:
		return false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return false, nil
}

// newFlagSet is a command's flag set: errors are returned, not printed
// (run reports them with the command's usage).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// serveFlags are serve's flags, which override cfg's settings.
func serveFlags(cfg *config) *flag.FlagSet {
	fs := newFlagSet("serve")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "`ADDR` to listen on, host:port (overrides REGISTRY_LISTEN)")
	fs.BoolVar(&cfg.Migrate, "migrate", cfg.Migrate, "apply pending migrations at start (overrides REGISTRY_MIGRATE)")
	return fs
}

// tokenOptions are token's flags.
type tokenOptions struct {
	sub, role string
	ttl       time.Duration
	ips       []string
}

func tokenFlags() (*flag.FlagSet, *tokenOptions) {
	o := &tokenOptions{}
	fs := newFlagSet("token")
	fs.StringVar(&o.sub, "sub", "", "the principal (token subject), e.g. agent-gpu-17 (required)")
	fs.StringVar(&o.role, "role", "", "admin, scheduler, agent or reader (required)")
	fs.DurationVar(&o.ttl, "ttl", 24*time.Hour, "how long the token is valid (at most REGISTRY_TOKEN_MAX_TTL, admins REGISTRY_ADMIN_TOKEN_MAX_TTL)")
	fs.Func("ip", "agent tokens: an `ADDR|CIDR` the agent may register nodes at (repeatable)", func(v string) error {
		o.ips = append(o.ips, v)
		return nil
	})
	return fs, o
}

// revokeOptions are token revoke's flags.
type revokeOptions struct{ sub, jti, until string }

func revokeFlags() (*flag.FlagSet, *revokeOptions) {
	o := &revokeOptions{}
	fs := newFlagSet("token revoke")
	fs.StringVar(&o.sub, "sub", "", "revoke every token of this principal issued until now")
	fs.StringVar(&o.jti, "jti", "", "revoke the one token with this id (its jti)")
	fs.StringVar(&o.until, "until", "", "with --jti: when that token expires (RFC 3339), so the revocation can be forgotten after; default: kept for the longest token lifetime")
	return fs, o
}

func syncFlags() (fs *flag.FlagSet, once, noWait, allowRemoval *bool) {
	fs = newFlagSet("sync")
	once = fs.Bool("once", false, "run one pass of every configured provider and exit (required)")
	noWait = fs.Bool("no-wait", false, "while another registryd is in the middle of a pass, fail at once instead of waiting for it (at most REGISTRY_SYNC_TIMEOUT)")
	allowRemoval = fs.Bool("allow-removal", false, "take away the nodes a provider no longer lists even when they are more than REGISTRY_SYNC_MAX_REMOVAL percent of its fleet (after checking that they are really gone)")
	return fs, once, noWait, allowRemoval
}

func agentFlags() (*flag.FlagSet, *bool) {
	fs := newFlagSet("agent")
	return fs, fs.Bool("once", false, "run one pass, print the nodes and problems, and exit (status 1 if the pass failed or a node could not be registered or deleted)")
}
