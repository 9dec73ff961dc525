// Command registryd-bench measures registryd's hot paths through HTTP
// against PostgreSQL's own rate for the same SQL (pgbench), on a seeded
// fleet: `make bench-http`. See internal/bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/registryd/registryd/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "registryd-bench:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "registryd-bench:", err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// envList is a repeatable NAME=VALUE flag.
type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }

func (e *envList) Set(v string) error {
	if name, _, ok := strings.Cut(v, "="); !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, not %q", v)
	}
	*e = append(*e, v)
	return nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("registryd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: registryd-bench [flags]

Starts registryd serve on the embedded PostgreSQL in a temporary folder
(or, with -url, targets a running registryd: then REGISTRY_DATABASE_URL
names its database, and REGISTRY_JWT_SECRET its token secret or, without
it, REGISTRY_TOKEN an admin token used for everything), seeds an empty
registry with -nodes nodes (through SQL, with -seed api through the API,
with -seed sync by registryd sync --once from a fake SCP API), runs each
workload through HTTP
and its SQL through pgbench at the same concurrency, and prints one JSON
line per workload and a markdown table. Exit 1 when a workload had
errors.

`)
		fs.PrintDefaults()
	}
	var (
		nodes     = fs.Int("nodes", 100_000, "nodes to seed (8 per host)")
		agents    = fs.Int("agents", 1000, "hosts owned by an agent each (the heartbeat workload's nodes)")
		duration  = fs.Duration("duration", 10*time.Second, "how long each workload runs, on each side")
		clients   = fs.Int("clients", 32, "concurrent clients (gang always uses 16 schedulers)")
		workloads = fs.String("workloads", strings.Join(bench.AllWorkloads, ","), "workloads to run, comma-separated (with -url, startup is left out of the default: it restarts the server)")
		jsonOnly  = fs.Bool("json", false, "print only the JSON lines")
		seedMode  = fs.String("seed", bench.SeedSQL, "how the fleet gets in: sql (one transaction, then the server restarts on it) api (created through the running server's API, measured as it is afterwards), or sync (imported from a fake SCP API by registryd sync --once while the server runs; no heartbeat workload: no agents)")
		settle    = fs.Bool("settle", false, "run the workloads twice: right after the seed, and again once autovacuum has vacuumed and analyzed the nodes table")
		registryd = fs.String("registryd", "", "the registryd binary to start (default: built from this module with go build)")
		url       = fs.String("url", "", "a running registryd to target instead of starting one")
		replica   = fs.String("replica-url", "", "with -url: a second replica on the same database, for the replica workload")
		pgbench   = fs.String("pgbench", "", "the pgbench binary (default: next to the PostgreSQL server binaries, or on PATH)")
		workDir   = fs.String("workdir", "", "keep the server's data, its log and the pgbench scripts here (default: a temporary folder, removed)")
		client    = fs.String("client", "", "what drives heartbeat, retrieve and free page: wrk, go (the harness's own client), or empty for wrk when installed")
		serverEnv envList
	)
	fs.Var(&serverEnv, "server-env", "NAME=VALUE added to the environment of the server it starts (repeatable), e.g. -server-env REGISTRY_NODE_CACHE=0")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cfg := bench.Config{
		Nodes: *nodes, Agents: *agents, Duration: *duration, Clients: *clients,
		JSONOnly: *jsonOnly, Seed: *seedMode, Settle: *settle, URL: *url, ReplicaURL: *replica, Pgbench: *pgbench, WorkDir: *workDir,
		RequirePgbench: getenv("CI") != "", ServerEnv: serverEnv, Client: *client,
		Stdout: stdout, Stderr: stderr,
	}
	// Unset, the list is bench's default, which leaves startup out for a
	// server the harness does not start.
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "workloads" {
			return
		}
		for _, w := range strings.Split(*workloads, ",") {
			if w = strings.TrimSpace(w); w != "" {
				cfg.Workloads = append(cfg.Workloads, w)
			}
		}
	})
	if *url != "" {
		cfg.DatabaseURL, cfg.Secret, cfg.Token = getenv("REGISTRY_DATABASE_URL"), []byte(getenv("REGISTRY_JWT_SECRET")), getenv("REGISTRY_TOKEN")
	} else {
		cfg.Registryd = *registryd
		if cfg.Registryd == "" {
			dir, err := os.MkdirTemp("", "registryd-bench-bin")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			cfg.Registryd = filepath.Join(dir, "registryd")
			fmt.Fprintln(stderr, "bench: building registryd")
			build := exec.CommandContext(ctx, "go", "build", "-o", cfg.Registryd, "github.com/registryd/registryd/cmd/registryd")
			build.Stdout, build.Stderr = stderr, stderr
			if err := build.Run(); err != nil {
				return fmt.Errorf("go build registryd: %w", err)
			}
		}
	}
	_, err := bench.Run(ctx, cfg)
	return err
}
