// Command registryd is the worker-node registry of a GPU fleet.
//
//	registryd serve                    the HTTP server
//	registryd migrate up|down|status   schema migrations
//	registryd token --sub S --role R   a signed bearer token
//	registryd token revoke --sub S     stop tokens before they expire
//	registryd sync --once              one import pass of every provider
//	registryd agent                    the GPU host agent
//	registryd healthcheck              probe a running server (containers)
//
// Configuration comes from REGISTRY_* environment variables; see README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "registryd:", err)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

const usage = `usage: registryd <command> [flags]

commands:
  serve                    run the HTTP server (REGISTRY_LISTEN, default 127.0.0.1:8080)
  migrate up|down|status   apply, roll back one, or list schema migrations
  token --sub NAME --role ROLE [--ttl 24h] [--ip ADDR|CIDR ...]
                           print a signed token (admin, scheduler, agent, reader);
                           --ip binds an agent token to its hosts
  token revoke --sub NAME | --jti ID
                           revoke a principal's tokens, or one token
  sync --once [--no-wait]  import the inventory of every configured cloud once
                           (waits for another replica's pass unless --no-wait)
  agent [--once]           the GPU host agent: discover, register, heartbeat
                           (REGISTRY_SERVER, REGISTRY_TOKEN; registryd agent --help)
  healthcheck [--path /readyz]
                           ask the local registryd for /healthz; exit 0 if healthy

Without REGISTRY_DATABASE_URL, registryd runs its own PostgreSQL in
REGISTRY_DATA_DIR (default ./.data). See README.md for every setting.
`

// run is the whole program, minus process plumbing, so tests drive the real
// wiring in-process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	if args[0] == "agent" {
		// The agent has settings of its own and runs on GPU hosts, where
		// the server's settings (database, token keys) are neither set
		// nor to be checked.
		return agentCmd(ctx, args[1:], getenv, stdout, stderr)
	}
	if args[0] == "healthcheck" {
		// Runs in the server's container, next to settings it has no need
		// to check (it only asks the server over HTTP).
		return healthcheckCmd(ctx, args[1:], getenv, stdout, stderr)
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	switch args[0] {
	case "serve":
		return serve(ctx, cfg, args[1:], stdout, stderr)
	case "migrate":
		return migrate(ctx, cfg, args[1:], stdout, stderr)
	case "token":
		return token(ctx, cfg, args[1:], stdout, stderr)
	case "sync":
		return syncCmd(ctx, cfg, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "registryd: unknown command %q\n\n%s", args[0], usage)
		return errUsage
	}
}
