package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

const healthcheckUsage = `usage: registryd healthcheck [--path /healthz|/readyz] [--url URL] [--timeout 5s]

Asks a running registryd whether it is healthy: exits 0 when the answer is
2xx, 1 otherwise. For container health checks in images without curl. The
address is REGISTRY_LISTEN's (an unspecified host such as 0.0.0.0 is asked
on the loopback), unless --url names one.
`

// healthcheckCmd is `registryd healthcheck`. It reads REGISTRY_LISTEN only,
// so it runs in a container whatever else the server's settings need.
func healthcheckCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, healthcheckUsage); fs.PrintDefaults() }
	path := fs.String("path", "/healthz", "the path to ask: /healthz (alive) or /readyz (ready to serve)")
	url := fs.String("url", "", "the full URL to ask instead (overrides REGISTRY_LISTEN and --path)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 || *timeout <= 0 {
		fs.Usage()
		return errUsage
	}
	target := *url
	if target == "" {
		base, err := listenURL(or(getenv("REGISTRY_LISTEN"), "127.0.0.1:8080"))
		if err != nil {
			return err
		}
		target = base + *path
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("healthcheck: %s answered %s: %s", target, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "%s: %s\n", target, resp.Status)
	return nil
}

// listenURL is the http:// base URL at which a server listening on listen
// (REGISTRY_LISTEN) is reached from the same host.
func listenURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" || port == "0" {
		return "", fmt.Errorf("REGISTRY_LISTEN=%q: want host:port with a fixed port, such as 0.0.0.0:8080 (or pass --url)", listen)
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
