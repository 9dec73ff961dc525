package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// healthcheckFlags are healthcheck's flags.
func healthcheckFlags() (fs *flag.FlagSet, path, url *string, timeout *time.Duration) {
	fs = newFlagSet("healthcheck")
	path = fs.String("path", "/healthz", "the path to ask: /healthz (alive) or /readyz (ready to serve)")
	url = fs.String("url", "", "the full URL to ask instead (overrides REGISTRY_LISTEN and --path)")
	timeout = fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	return fs, path, url, timeout
}

// healthcheckCmd is `registryd healthcheck`. It reads REGISTRY_LISTEN and
// REGISTRY_TLS_CERT_FILE only, so it runs in a container whatever else the
// server's settings need.
func healthcheckCmd(ctx context.Context, args []string, rawenv func(string) string, stdout, stderr io.Writer) error {
	fs, path, url, timeout := healthcheckFlags()
	c, _ := findCommand("healthcheck")
	if err := fs.Parse(args); err != nil {
		return usageError(stderr, c, err)
	}
	if fs.NArg() > 0 {
		return usageError(stderr, c, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if *timeout <= 0 {
		return usageError(stderr, c, errors.New("--timeout must be positive"))
	}
	getenv := commandEnv(cmdHealthcheck, rawenv)
	target, client := *url, http.DefaultClient
	if target == "" {
		base, err := listenURL(getenv("REGISTRY_LISTEN"))
		if err != nil {
			return err
		}
		target = base + *path
		if getenv("REGISTRY_TLS_CERT_FILE") != "" {
			target = "https" + strings.TrimPrefix(target, "http")
			client = localTLSClient()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := client.Do(req)
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

// localTLSClient asks a serve on this host that speaks TLS. Its
// certificate names the registry's public host, not the loopback address
// asked, so it is not verified: the check sends no credentials and trusts
// nothing it reads but the status.
func localTLSClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: t}
}
