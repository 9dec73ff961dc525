package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// token prints a signed JWT. The last line of stdout is the token alone, so
// scripts can take it with `| tail -n1`.
func token(_ context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sub := fs.String("sub", "", "the principal (token subject), e.g. agent-gpu-17")
	role := fs.String("role", "", "admin, scheduler, agent or reader")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *sub == "" || *role == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: registryd token --sub NAME --role admin|scheduler|agent|reader [--ttl 24h]")
		return errUsage
	}
	r, ok := registry.ParseRole(*role)
	if !ok {
		return fmt.Errorf("unknown role %q: want admin, scheduler, agent or reader", *role)
	}
	if cfg.JWTSecret == nil && len(cfg.JWTPublicKeys) > 0 {
		return fmt.Errorf("only REGISTRY_JWT_PUBLIC_KEYS is configured: tokens come from your identity provider; registryd signs only with REGISTRY_JWT_SECRET")
	}
	secret, _, err := tokenSecret(cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	tok, err := auth.Signer{Secret: secret, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience}.Sign(*sub, r, *ttl, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# %s token for %q, valid until %s\n%s\n", r, *sub, time.Now().Add(*ttl).UTC().Format(time.RFC3339), tok)
	return nil
}
