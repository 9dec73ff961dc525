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
	// positional commands take arguments besides their flags (nodes get
	// PK…), anywhere among them.
	positional bool
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
	{name: "nodes", synopsis: "nodes list|get|cordon|uncordon|drain|label|claim|release|renew|delete", reads: cmdCLI, group: true,
		about: `The admins' CLI over the Nodes API (docs/cli.md). It reaches the registry
named by REGISTRY_SERVER with REGISTRY_TOKEN or REGISTRY_TOKEN_FILE, or by
the current context of the contexts file (registryd config); the
environment overrides the file. Exit status: 0 done, 1 failed (the server
refused: its problem is printed), 2 usage, 3 drain deadline reached,
4 not found.
  nodes list       nodes, filtered, sorted, as a table, JSON, YAML; --watch
  nodes get        nodes by pk
  nodes cordon     take nodes out of scheduling
  nodes uncordon   put them back
  nodes drain      cordon, then wait until their jobs release them
  nodes label      set and remove labels
  nodes claim      claim nodes for a job, as a scheduler would
  nodes release    give a job's nodes back
  nodes renew      extend a job's leases
  nodes delete     delete nodes

Example:
  registryd nodes list --state cordoned,draining -o wide`},
	{name: "nodes list", synopsis: "nodes list [filters] [-o table|wide|json|yaml|name] [--sort-by KEY] [--watch]", reads: cmdCLI,
		summary: "list nodes (filters, -o table|wide|json|yaml|name, --watch)",
		about: `Lists the nodes the filters select (all of them by default), paging
through the fleet by pk, as a table (SEEN is when the node last acted),
a wider table (-o wide), the API's documents (-o json, -o yaml: a list)
or node/PK lines (-o name). --watch prints the list, then every node
again each time it changes (a deleted one as "deleted", one that leaves
the filters once more as it now is) until Ctrl-C; with -o json or yaml
as events, {"type": "added|modified|deleted", "object": NODE} (json: one
a line; yaml: a --- document each), with -o name "node/PK deleted" for a
deletion. --limit does not apply to --watch. States are coloured on a
terminal unless NO_COLOR is set.

Examples:
  registryd nodes list --free --min-gpu-mem 80Gi --fabric ib-a
  registryd nodes list --ip 10.0.0.0/24 --sort-by host -o wide
  registryd nodes list --selector team=research -o json | jq length
  registryd nodes list --state cordoned,draining --watch`,
		flags: func() *flag.FlagSet { fs, _ := listFlags(); return fs }, positional: true},
	{name: "nodes get", synopsis: "nodes get PK... [-o table|wide|json|yaml|name]", reads: cmdCLI,
		summary: "show nodes by pk (exit 4 when one does not exist)",
		about: `Shows the nodes named. One node with -o json or yaml is its document;
more are a list. A pk that names no node is reported on stderr after
the others are shown, and the exit status is 4.

Examples:
  registryd nodes get 42 43 -o wide
  registryd nodes get 42 -o json | jq .state`,
		flags: func() *flag.FlagSet { fs, _ := getFlags(); return fs }, positional: true},
	{name: "nodes cordon", synopsis: "nodes cordon PK... | [filters] [--reason TEXT]", reads: cmdCLI,
		summary: "take nodes out of scheduling (by pk or filters)",
		about: `Cordons the nodes named, or those the filters select: no claim takes
them. A node a job holds drains: the job keeps it until it releases it.
--reason replaces the reason of nodes already cordoned; without it they
keep theirs. Prints each node and its state; a pk that names no node is
reported on stderr, and the exit status is 4. Admins only.

Examples:
  registryd nodes cordon 42 43 --reason "fan failure"
  registryd nodes cordon --selector rack=r12 --reason "kernel upgrade"`,
		flags: func() *flag.FlagSet { fs, _ := cordonFlags("nodes cordon"); return fs }, positional: true},
	{name: "nodes uncordon", synopsis: "nodes uncordon PK... | [filters]", reads: cmdCLI,
		summary: "put cordoned nodes back into scheduling",
		about: `Uncordons the nodes named, or the cordoned and draining nodes the
filters select. A node that was not cordoned is said so, and is no
failure; a pk that names no node is (exit 4). Admins only.

Examples:
  registryd nodes uncordon 42 43
  registryd nodes uncordon --selector rack=r12`,
		flags: func() *flag.FlagSet { fs, _ := cordonFlags("nodes uncordon"); return fs }, positional: true},
	{name: "nodes drain", synopsis: "nodes drain PK... | [filters] [--reason TEXT] [--deadline 2h] [--interval 2s]", reads: cmdCLI,
		summary: "cordon nodes and wait until their jobs release them (exit 3 at --deadline)",
		about: `Cordons the nodes, as nodes cordon does, then waits until no job holds
any of them, printing a line whenever that changes ("3 of 8 nodes still
held by jobs 41, 42"). Exits 0 once every node is released; at the
deadline it exits 3, naming which job still holds which nodes. The nodes
stay cordoned either way (nodes uncordon puts them back). A node someone
uncordons meanwhile is not drained (exit 1); a registry that does not
answer for a while is waited for. Admins only.

Example:
  registryd nodes drain --selector rack=r12 --reason "PSU swap" --deadline 2h`,
		flags: func() *flag.FlagSet { fs, _ := cordonFlags("nodes drain"); return fs }, positional: true},
	{name: "nodes label", synopsis: "nodes label PK... KEY=VALUE... KEY-...", reads: cmdCLI,
		summary: "set (KEY=VALUE) and remove (KEY-) labels of nodes",
		about: `Changes the labels of each node named, as one merge patch: KEY=VALUE
sets a label, KEY- removes one, the node's other labels stay. A pk that
names no node exits 4.

Example:
  registryd nodes label 42 43 team=research tier=gold old-`,
		positional: true},
	{name: "nodes claim", synopsis: "nodes claim --job J [--count N] [--per-host N] [--same-host] [--same-fabric] [--lease 10m] [filters]", reads: cmdCLI,
		summary: "claim free nodes for a job, as a scheduler does (debugging)",
		about: `Claims --count free nodes matching the filters for the job, all or
none, and shows them. For debugging schedulers: the claim is the one a
scheduler would send, and a refusal prints the server's reason (409
insufficient_capacity, no_fabric_fit …). Schedulers and admins.

Example:
  registryd nodes claim --job 4711 --count 8 --per-host 8 --same-fabric --lease 10m`,
		flags: func() *flag.FlagSet { fs, _ := jobFlags("nodes claim"); return fs }, positional: true},
	{name: "nodes release", synopsis: "nodes release --job J [PK...]", reads: cmdCLI,
		summary: "give back a job's nodes (all, or those named)",
		about: `Releases the nodes named, or every node the job holds, and shows them.
Nodes the job does not hold are reported on stderr (exit 4 for a pk
that names no node). The job's owner or an admin.

Example:
  registryd nodes release --job 4711`,
		flags: func() *flag.FlagSet { fs, _ := jobFlags("nodes release"); return fs }, positional: true},
	{name: "nodes renew", synopsis: "nodes renew --job J --lease 10m", reads: cmdCLI,
		summary: "extend every lease of a job",
		about: `Extends every lease the job holds to --lease from now and shows the
job's nodes. A job that holds nothing exits 4.

Example:
  registryd nodes renew --job 4711 --lease 10m`,
		flags: func() *flag.FlagSet { fs, _ := jobFlags("nodes renew"); return fs }, positional: true},
	{name: "nodes delete", synopsis: "nodes delete PK... [--force]", reads: cmdCLI,
		summary: "delete nodes (--force: even one a job holds)",
		about: `Deletes the nodes named. A node a job holds is kept (409) unless --force
(admins). A pk that names no node exits 4 after the others are deleted.

Example:
  registryd nodes delete 42 --force`,
		flags: func() *flag.FlagSet { fs, _ := deleteFlags(); return fs }, positional: true},
	{name: "audit", synopsis: "audit list", reads: cmdCLI, group: true,
		about: `The audit log: every write, who made it, and the row before and after.
  audit list   the newest entries, filtered

Example:
  registryd audit list --target-type node --target-pk 42`},
	{name: "audit list", synopsis: "audit list [--target-type T] [--target-pk PK] [--action A] [--principal P] [--role R] [--since 1h] [--limit N]", reads: cmdCLI,
		summary: "list audit log entries, filtered (admins)",
		about: `Lists the newest --limit (100; 0 for all) audit log entries the filters
select, oldest first, paging by id to the end of the log; when there
were more, stderr says so. --since takes an RFC 3339 time or a span back
from now (1h, 7d). -o json and yaml print the entries as
the API sends them, with each row's before and after. Admins only.

Examples:
  registryd audit list --action node.cordon --since 24h
  registryd audit list --target-type node --target-pk 42 -o json`,
		flags: func() *flag.FlagSet { fs, _ := auditFlags(); return fs }, positional: true},
	{name: "fabrics", synopsis: "fabrics list", reads: cmdCLI, group: true,
		about: `Fabrics: the interconnect domains hosts are wired into.
  fabrics list   per fabric, hosts and nodes by state

Example:
  registryd fabrics list --min-gpu-mem 80Gi`},
	{name: "fabrics list", synopsis: "fabrics list [filters] [-o table|json|yaml]", reads: cmdCLI,
		summary: "per fabric: hosts, nodes by state, hosts by free nodes",
		about: `Lists, per fabric, what the nodes the filters select hold: hosts, nodes
by state, and how many hosts have each number of free nodes (FREE:HOSTS,
what a claim of whole groups per host can find). Nodes without a fabric
come last, as (none).

Example:
  registryd fabrics list --hardware H100`,
		flags: func() *flag.FlagSet { fs, _, _ := fabricsFlags(); return fs }, positional: true},
	{name: "hardware", synopsis: "hardware list", reads: cmdCLI, group: true,
		about: `Hardware generations: the GPU models nodes point at.
  hardware list   every generation, with how many nodes use it

Example:
  registryd hardware list`},
	{name: "hardware list", synopsis: "hardware list [--name NAME] [-o table|json|yaml]", reads: cmdCLI,
		summary: "list hardware generations and how many nodes use each",
		about: `Lists the hardware generations (or the one named), with how many nodes
use each.

Example:
  registryd hardware list -o json | jq '.[].name'`,
		flags: func() *flag.FlagSet { fs, _, _ := hardwareFlags(); return fs }, positional: true},
	{name: "config", synopsis: "config get-contexts|current-context|use-context|set-context", reads: cmdCLI, group: true,
		about: `The CLI's contexts, as kubeconfig is kubectl's: each a registry's server,
a token or a token file, and a CA file. The file is REGISTRY_CONFIG, else
$XDG_CONFIG_HOME/registryd/config.yaml, else ~/.config/registryd/config.yaml,
written with mode 0600. REGISTRY_SERVER, REGISTRY_TOKEN and
REGISTRY_TOKEN_FILE override the current context's.
  config get-contexts      list the contexts, * the current one
  config current-context   print the current context's name
  config use-context       make a context the current one
  config set-context       add a context or change one

Example:
  registryd config set-context prod --server https://registry.example.com --token-file ~/.registry-token`},
	{name: "config get-contexts", synopsis: "config get-contexts [-o table|name]", reads: cmdCLI,
		summary: "list the CLI's contexts (* marks the current one)",
		about: `Lists the contexts of the contexts file; * marks the current one.
-o name prints their names alone.

Examples:
  registryd config get-contexts
  registryd config get-contexts -o name`,
		flags: func() *flag.FlagSet { fs, _ := getContextsFlags(); return fs }, positional: true},
	{name: "config current-context", synopsis: "config current-context", reads: cmdCLI,
		summary: "print the current context's name (exit 4 when none)",
		about: `Prints the current context's name; exits 4 when there is none.

Example:
  registryd config current-context`, positional: true},
	{name: "config use-context", synopsis: "config use-context NAME", reads: cmdCLI,
		summary: "make a context the current one (exit 4 when it does not exist)",
		about: `Makes the context NAME the current one: later commands talk to its
registry. A name the file does not have exits 4.

Example:
  registryd config use-context staging`, positional: true},
	{name: "config set-context", synopsis: "config set-context NAME [--server URL] [--token-file FILE | --token TOKEN] [--ca-file FILE]", reads: cmdCLI,
		summary: "add a context, or change one's server, token or CA file",
		about: `Adds the context NAME, or changes the members given of the one that
exists; the first context becomes the current one. Prefer --token-file:
the file is read for every request, so a rotated token needs no edit.

Example:
  registryd config set-context prod --server https://registry.example.com --token-file ~/.registry-token`,
		flags: func() *flag.FlagSet { fs, _ := setContextFlags(); return fs }, positional: true},
	{name: "completion", synopsis: "completion bash|zsh|fish",
		summary: "print a shell completion script (commands, subcommands, flags)",
		about: `Prints a script that completes registryd's commands, subcommands, flags
and the values of -o, --state and --sort-by in bash, zsh or fish.

Examples:
  source <(registryd completion bash)          # in ~/.bashrc
  source <(registryd completion zsh)           # in ~/.zshrc
  registryd completion fish | source           # in ~/.config/fish/config.fish`,
		flags: completionFlags, positional: true},
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
2 usage error (unknown command or flag, missing argument); the admins'
CLI adds 3 (nodes drain reached its deadline) and 4 (not found).
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
	if c.positional {
		_, err := parseInterspersed(fs, args)
		return errors.Is(err, flag.ErrHelp), ignoreHelp(err)
	}
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

// parseInterspersed parses args with fs, flags and arguments in any
// order (nodes cordon 3 4 --reason x), and returns the arguments. "--"
// ends the flags: everything after it is an argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if used := len(args) - len(left); used > 0 && args[used-1] == "--" {
			return append(rest, left...), nil
		}
		if len(left) == 0 {
			return rest, nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// ignoreHelp is err unless it is a request for help.
func ignoreHelp(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
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
