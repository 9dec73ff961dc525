package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/user"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// token prints a signed JWT. The last line of stdout is the token alone, so
// scripts can take it with `| tail -n1`.
func token(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "revoke" {
		return revokeCmd(ctx, cfg, args[1:], stdout, stderr)
	}
	fs, o := tokenFlags()
	c, _ := findCommand("token")
	if err := fs.Parse(args); err != nil {
		return usageError(stderr, c, err)
	}
	if o.sub == "" || o.role == "" || fs.NArg() > 0 {
		return usageError(stderr, c, errors.New("--sub and --role are required"))
	}
	sub, role, ttl, ips := &o.sub, &o.role, &o.ttl, o.ips
	r, ok := registry.ParseRole(*role)
	if !ok {
		return fmt.Errorf("unknown role %q: want admin, scheduler, agent or reader", *role)
	}
	switch {
	case ips != nil && r != registry.RoleAgent:
		return fmt.Errorf("--ip binds agent tokens only; a %s token may not carry addresses", r)
	case ips == nil && r == registry.RoleAgent && cfg.AgentRequireIP:
		return errors.New("REGISTRY_AGENT_REQUIRE_IP is on: agent tokens need --ip ADDR (or a CIDR prefix; repeatable) naming the hosts the agent runs on")
	}
	if cfg.JWTSecret == nil && len(cfg.JWTPublicKeys) > 0 {
		return fmt.Errorf("only REGISTRY_JWT_PUBLIC_KEYS is configured: tokens come from your identity provider; registryd signs only with REGISTRY_JWT_SECRET")
	}
	// Never a new secret: no server would accept what it signs (most
	// likely run from another folder than the server's; ./.data is
	// relative).
	secret, err := existingTokenSecret(cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	signer := auth.Signer{Secret: secret, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Lifetimes: cfg.TokenLifetimes}
	m, err := signer.Mint(auth.TokenSpec{Sub: *sub, Role: r, TTL: *ttl, IPs: ips}, time.Now())
	var le *auth.LifetimeError
	if errors.As(err, &le) {
		name := "REGISTRY_TOKEN_MAX_TTL"
		if le.Role == registry.RoleAdmin {
			name = "REGISTRY_ADMIN_TOKEN_MAX_TTL"
		}
		return fmt.Errorf("--ttl %s is longer than %s tokens may live (%s); choose a shorter --ttl or raise %s",
			auth.FormatDuration(le.TTL), le.Role, auth.FormatDuration(le.Max), name)
	}
	if err != nil {
		return err
	}
	bound := ""
	if ips != nil {
		set, _ := registry.ParseIPSet(ips) // Mint has accepted them
		bound = ", bound to " + registry.FormatIPSet(set)
	}
	renews := ""
	if r == registry.RoleAgent && ips != nil {
		renews = "; registryd agent renews it while it runs"
	}
	fmt.Fprintf(stdout, "# %s token for %q%s, valid until %s, id (jti) %s%s\n%s\n",
		r, *sub, bound, m.Expires.UTC().Format(time.RFC3339), m.ID, renews, m.Token)
	return nil
}

// revokeCmd is `registryd token revoke`: it stores a revocation in the
// database (audited, every replica refuses the tokens within seconds).
func revokeCmd(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs, o := revokeFlags()
	c, _ := findCommand("token revoke")
	if err := fs.Parse(args); err != nil {
		return usageError(stderr, c, err)
	}
	sub, jti, until := &o.sub, &o.jti, &o.until
	if (*sub == "") == (*jti == "") || fs.NArg() > 0 || (*until != "" && *jti == "") {
		return usageError(stderr, c, errors.New("give --sub or --jti (one of them); --until goes with --jti"))
	}
	rev := registry.Revocation{Sub: *sub, JTI: *jti}
	if *until != "" {
		t, err := time.Parse(time.RFC3339, *until)
		if err != nil {
			return fmt.Errorf("--until %q: want an RFC 3339 time such as 2026-12-31T00:00:00Z", *until)
		}
		rev.Until = &t
	}
	if err := rev.Normalize(time.Now()); err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	db, err := openMigrated(ctx, cfg, logger, "token revoke", nil)
	if err != nil {
		return err
	}
	defer db.close()
	out, err := db.store.RevokeTokens(ctx, registry.Actor{Principal: registry.Principal{Sub: cliPrincipal(), Role: registry.RoleSystem}}, rev)
	if err != nil {
		return err
	}
	if out.Sub != "" {
		fmt.Fprintf(stdout, "revoked every token of %q issued before %s; tokens issued from then on are accepted\n",
			out.Sub, out.Before.UTC().Format(time.RFC3339))
		return nil
	}
	kept := "for the longest token lifetime"
	if out.Until != nil {
		kept = "until " + out.Until.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(stdout, "revoked the token with id %q (the revocation is kept %s)\n", out.JTI, kept)
	return nil
}

// cliPrincipal names the operator in the audit log: "cli:<os user>".
func cliPrincipal() string {
	if u, err := user.Current(); err == nil && u.Username != "" && registry.CheckLabel(u.Username, 100) == "" &&
		!strings.ContainsAny(u.Username, " ") {
		return "cli:" + u.Username
	}
	return "cli"
}
