package main

import (
	"context"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
)

// `registryd token` caps --ttl per role (finding 8 of issue 8: a 100-year
// token was minted without a word).
func TestTokenTTLCap(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": "postgres://unused", "REGISTRY_JWT_SECRET": testSecret}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string // "" means success; otherwise a piece of the error
	}{
		{nil, []string{"--role", "reader", "--ttl", "876000h"}, "REGISTRY_TOKEN_MAX_TTL"},
		{nil, []string{"--role", "agent", "--ttl", "2160h"}, ""},
		{nil, []string{"--role", "agent", "--ttl", "2161h"}, "REGISTRY_TOKEN_MAX_TTL"},
		{nil, []string{"--role", "scheduler", "--ttl", "2161h"}, "REGISTRY_TOKEN_MAX_TTL"},
		{nil, []string{"--role", "admin"}, ""}, // the default 24h fits
		{nil, []string{"--role", "admin", "--ttl", "25h"}, "REGISTRY_ADMIN_TOKEN_MAX_TTL"},
		{map[string]string{"REGISTRY_ADMIN_TOKEN_MAX_TTL": "48h"}, []string{"--role", "admin", "--ttl", "48h"}, ""},
		{map[string]string{"REGISTRY_ADMIN_TOKEN_MAX_TTL": "1h"}, []string{"--role", "admin"}, "REGISTRY_ADMIN_TOKEN_MAX_TTL"},
		{map[string]string{"REGISTRY_TOKEN_MAX_TTL": "8760h"}, []string{"--role", "agent", "--ttl", "8760h"}, ""},
	} {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range tc.env {
			e[k] = v
		}
		out, stderr, err := runCmd(t, e, append([]string{"token", "--sub", "x"}, tc.args...)...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v %v: %v\n%s", tc.env, tc.args, err, stderr)
		case tc.want == "" && !strings.Contains(out, "valid until"):
			t.Errorf("%v %v: no token printed: %q", tc.env, tc.args, out)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v %v: error %v does not name %s", tc.env, tc.args, err, tc.want)
		}
	}
}

// The token settings are validated at start, naming the variable.
func TestTokenConfigErrors(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"REGISTRY_TOKEN_MAX_TTL": "forever"},
		{"REGISTRY_TOKEN_MAX_TTL": "30s"},
		{"REGISTRY_TOKEN_MAX_TTL": "9000h"},
		{"REGISTRY_ADMIN_TOKEN_MAX_TTL": "0"},
		{"REGISTRY_ADMIN_TOKEN_MAX_TTL": "-1h"},
		{"REGISTRY_AGENT_REQUIRE_IP": "maybe"},
	} {
		// Should a setting be accepted by mistake, the token command's
		// secret goes to a temporary folder, not into the source tree.
		withDir := maps.Clone(env)
		withDir["REGISTRY_DATA_DIR"] = t.TempDir()
		_, _, err := runCmd(t, withDir, "token", "--sub", "x", "--role", "reader")
		for k := range env {
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%v: error %v does not name %s", env, err, k)
			}
		}
	}
}

// tokenFrom splits `registryd token` output into the token and its id.
func tokenFrom(t *testing.T, out string) (tok, jti string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tok = lines[len(lines)-1]
	if _, id, ok := strings.Cut(lines[0], "id (jti) "); ok {
		jti = strings.TrimSpace(id)
	}
	if strings.Count(tok, ".") != 2 || jti == "" {
		t.Fatalf("token output %q", out)
	}
	return tok, jti
}

func mintCmd(t *testing.T, env map[string]string, args ...string) (tok, jti string) {
	t.Helper()
	out, stderr, err := runCmd(t, env, append([]string{"token"}, args...)...)
	if err != nil {
		t.Fatalf("token %v: %v\n%s", args, err, stderr)
	}
	return tokenFrom(t, out)
}

// refusedWithin waits, at most 5s, until the server refuses tok.
func refusedWithin(t *testing.T, url, tok string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := call(t, "GET", url+"/v1/nodes/ping", "", tok)
		if code == 401 {
			if !strings.Contains(body, "revoked") {
				t.Fatalf("401 without the reason: %s", body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked token still gets %d after 5s", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// `registryd token revoke` against the database a running server uses:
// the server refuses the tokens within 5s, the audit log names the
// operator, tokens issued afterwards work.
func TestTokenRevokeCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret}
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret})

	one, oneID := mintCmd(t, env, "--sub", "agent-cli", "--role", "agent")
	two, _ := mintCmd(t, env, "--sub", "agent-cli", "--role", "agent")
	for _, tok := range []string{one, two} {
		if code, body := call(t, "GET", srv.url+"/v1/nodes/ping", "", tok); code != 200 {
			t.Fatalf("before revoking: %d %s", code, body)
		}
	}
	out, stderr, err := runCmd(t, env, "token", "revoke", "--jti", oneID, "--until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if err != nil || !strings.Contains(out, "revoked the token with id "+`"`+oneID+`"`) {
		t.Fatalf("revoke --jti: %v %q\n%s", err, out, stderr)
	}
	refusedWithin(t, srv.url, one)
	if code, _ := call(t, "GET", srv.url+"/v1/nodes/ping", "", two); code != 200 {
		t.Errorf("the other token after revoking one: %d", code)
	}

	out, stderr, err = runCmd(t, env, "token", "revoke", "--sub", "agent-cli")
	if err != nil {
		t.Fatalf("revoke --sub: %v\n%s", err, stderr)
	}
	_, rest, _ := strings.Cut(out, "issued before ")
	stamp, _, _ := strings.Cut(rest, ";")
	before, err := time.Parse(time.RFC3339, stamp)
	if err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	refusedWithin(t, srv.url, two)
	after, err := auth.Signer{Secret: []byte(testSecret)}.Sign("agent-cli", registry.RoleAgent, time.Hour, before)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := call(t, "GET", srv.url+"/v1/nodes/ping", "", after); code != 200 {
		t.Errorf("a token issued after the revocation: %d %s", code, body)
	}

	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM audit_log
		WHERE action = 'token.revoke' AND target_type = 'token' AND principal LIKE 'cli%' AND role = 'system'`).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d audit entries by the command line: %v", n, err)
	}

	for _, args := range [][]string{
		{"token", "revoke"}, {"token", "revoke", "--sub", "a", "--jti", "b"}, {"token", "revoke", "--sub", "a", "--until", "2030-01-01T00:00:00Z"},
		{"token", "revoke", "--jti", "b", "--until", "soon"}, {"token", "revoke", "--sub", "a", "extra"}, {"token", "revoke", "--sub", "a\x01"},
	} {
		if _, _, err := runCmd(t, env, args...); err == nil {
			t.Errorf("%q succeeded", args)
		}
	}
}

// A token-id revocation without an expiry (what `token revoke --jti`
// stores without --until) must outlive any token it could stop: serve
// prunes only those older than the longest token lifetime. Its first
// prune, at start, takes a revocation whose token expired, and keeps one
// of a day ago whose token may still have 89 days to live.
func TestServeKeepsRevocationsOfUnknownExpiry(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret}
	tok, jti := mintCmd(t, env, "--sub", "agent-kept", "--role", "agent")
	if _, stderr, err := runCmd(t, env, "token", "revoke", "--jti", jti); err != nil {
		t.Fatalf("revoke --jti: %v\n%s", err, stderr)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE token_revocations SET revoked_at = now() - interval '1 day' WHERE jti = $1`, jti); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO token_revocations (jti, until, revoked_at) VALUES ('long-expired', now() - interval '1 day', now() - interval '100 days')`); err != nil {
		t.Fatal(err)
	}
	count := func(jti string) int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM token_revocations WHERE jti = $1`, jti).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	srv := startServer(t, env)
	apitest.Eventually(t, 10*time.Second, "the first prune removes the expired token's revocation", func() bool {
		return count("long-expired") == 0
	})
	if count(jti) != 1 {
		t.Fatal("the prune removed a revocation whose token may still be valid")
	}
	if code, body := call(t, "GET", srv.url+"/v1/nodes/ping", "", tok); code != http.StatusUnauthorized || !strings.Contains(body, "revoked") {
		t.Errorf("the revoked token: %d %s", code, body)
	}
}

// `registryd token --ip` binds an agent token to its hosts; with
// REGISTRY_AGENT_REQUIRE_IP the server refuses agent tokens without.
func TestTokenBoundToHosts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret}
	out, stderr, err := runCmd(t, env, "token", "--sub", "agent-7", "--role", "agent", "--ip", "10.0.0.7", "--ip", "::ffff:10.1.0.0/120")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(out, "bound to 10.0.0.7, 10.1.0.0/24") {
		t.Errorf("output does not say what the token is bound to: %q", out)
	}
	bound, _ := tokenFrom(t, out)
	unbound, _ := mintCmd(t, env, "--sub", "agent-8", "--role", "agent")
	for _, args := range [][]string{
		{"--sub", "r", "--role", "reader", "--ip", "10.0.0.1"},
		{"--sub", "a", "--role", "admin", "--ip", "10.0.0.1"},
		{"--sub", "a", "--role", "agent", "--ip", "10.0.0.7/24"},
		{"--sub", "a", "--role", "agent", "--ip", "gpu-7"},
	} {
		if _, _, err := runCmd(t, env, append([]string{"token"}, args...)...); err == nil {
			t.Errorf("token %q succeeded", args)
		}
	}
	node := func(ip string) string {
		return `{"ip":"` + ip + `","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`
	}
	required := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_AGENT_REQUIRE_IP": "true"}
	srv := startServer(t, required)
	if code, body := call(t, "POST", srv.url+"/v1/nodes/create", node("10.1.0.5"), bound); code != 201 {
		t.Errorf("bound agent inside its set: %d %s", code, body)
	}
	if code, body := call(t, "POST", srv.url+"/v1/nodes/create", node("10.0.0.8"), bound); code != 403 {
		t.Errorf("bound agent outside its set: %d %s", code, body)
	}
	if code, body := call(t, "GET", srv.url+"/v1/nodes/ping", "", unbound); code != 401 || !strings.Contains(body, "REGISTRY_AGENT_REQUIRE_IP") {
		t.Errorf("unbound agent with REGISTRY_AGENT_REQUIRE_IP: %d %s", code, body)
	}
	if _, _, err := runCmd(t, required, "token", "--sub", "a", "--role", "agent"); err == nil || !strings.Contains(err.Error(), "--ip") {
		t.Errorf("minting an unbound agent token with REGISTRY_AGENT_REQUIRE_IP: %v", err)
	}
}
