package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The test binary doubles as registryd for tests that need a process
	// of its own (signals, exit status): see runAsRegistryd.
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	pgtest.Main(m)
}

func envFunc(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

var servingRE = regexp.MustCompile(`serving on (https?://\S+)`)

// server is registryd running in-process through run.
type server struct {
	url    string
	stdout *apitest.Buffer
	stderr *apitest.Buffer
	stop   func() error  // cancels run and returns its error
	done   chan struct{} // closed when run has returned
}

// startServer runs `registryd serve` with env and waits until it listens.
func startServer(t *testing.T, env map[string]string) *server {
	t.Helper()
	env["REGISTRY_LISTEN"] = "127.0.0.1:0"
	return startServing(t, func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, []string{"serve"}, envFunc(env), stdout, stderr)
	})
}

// startServing runs serveFn, a way to call serve, and waits until it
// listens.
func startServing(t *testing.T, serveFn func(ctx context.Context, stdout, stderr io.Writer) error) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &apitest.Buffer{}, &apitest.Buffer{}
	done := make(chan struct{})
	var runErr error
	go func() { runErr = serveFn(ctx, stdout, stderr); close(done) }()
	deadline := time.After(60 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(stdout.String()); m != nil {
			s := &server{url: m[1], stdout: stdout, stderr: stderr, done: done}
			s.stop = func() error {
				cancel()
				<-done
				return runErr
			}
			t.Cleanup(func() { s.stop() })
			return s
		}
		select {
		case <-done:
			cancel()
			t.Fatalf("serve exited before listening: %v\nstderr:\n%s", runErr, stderr.String())
		case <-deadline:
			cancel()
			t.Fatalf("serve did not start in time; stderr:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func runCmd(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb apitest.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = run(ctx, args, envFunc(env), &out, &errb)
	return out.String(), errb.String(), err
}

// testSecret is the REGISTRY_JWT_SECRET of these tests.
const testSecret = "cmd-test-secret-0123456789abcdef0123456789"

// adminToken mints an admin token through the real `registryd token`.
func adminToken(t *testing.T, env map[string]string) string {
	t.Helper()
	out, stderr, err := runCmd(t, env, "token", "--sub", "test-admin", "--role", "admin")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func call(t *testing.T, method, url, body string, token ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if len(token) > 0 {
		req.Header.Set("Authorization", "Bearer "+token[0])
	}
	resp, err := apitest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServeExternalDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)

	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_JWT_SECRET": testSecret}
	tok := adminToken(t, env)

	// An unmigrated database is refused with a message that says what to do.
	_, _, err := runCmd(t, env, "serve")
	if err == nil || !strings.Contains(err.Error(), "registryd migrate up") {
		t.Fatalf("serve on an empty database: %v", err)
	}

	// REGISTRY_MIGRATE=true migrates, then serves the API end to end.
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_MIGRATE": "true", "REGISTRY_JWT_SECRET": testSecret})
	if code, body := call(t, "GET", srv.url+"/readyz", ""); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
	if code, _ := call(t, "POST", srv.url+"/v1/nodes/list", ""); code != 401 {
		t.Fatalf("list without a token: %d", code)
	}
	code, body := call(t, "POST", srv.url+"/v1/nodes/create",
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, tok)
	if code != 201 {
		t.Fatalf("create %d %s", code, body)
	}
	if code, body := call(t, "POST", srv.url+"/v1/nodes/list", "", tok); code != 200 || !strings.Contains(body, `"10.0.0.1"`) {
		t.Fatalf("list %d %s", code, body)
	}
	if err := srv.stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	if !strings.Contains(srv.stderr.String(), `"msg":"stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", srv.stderr.String())
	}

	// The data outlives the server; a second start needs no migration.
	srv = startServer(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret})
	if code, body := call(t, "POST", srv.url+"/v1/nodes/list", "", tok); code != 200 || !strings.Contains(body, `"10.0.0.1"`) {
		t.Fatalf("list after restart %d %s", code, body)
	}
}

func TestServeRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(context.Background(), `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, true)`)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = runCmd(t, map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_JWT_SECRET": testSecret}, "serve")
	if err == nil || !strings.Contains(err.Error(), "newer than this registryd knows") {
		t.Fatalf("serve on a newer schema: %v", err)
	}
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.NewEmpty(t)}
	out, _, err := runCmd(t, env, "migrate", "status")
	if err != nil || !strings.Contains(out, "pending") {
		t.Fatalf("status before: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, env, "migrate", "up")
	if err != nil || !strings.Contains(out, "00001_init.sql") {
		t.Fatalf("up: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, env, "migrate", "up")
	if err != nil || !strings.Contains(out, "no pending migrations") {
		t.Fatalf("second up: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, env, "migrate", "status")
	if err != nil || !strings.Contains(out, "applied") || strings.Contains(out, "pending") {
		t.Fatalf("status after: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, env, "migrate", "down")
	if err != nil || !strings.Contains(out, "down") {
		t.Fatalf("down: %v\n%s", err, out)
	}
	if _, _, err = runCmd(t, env, "migrate", "sideways"); !errors.Is(err, errUsage) {
		t.Fatalf("bad subcommand: %v", err)
	}
}

func TestUsageAndConfigErrors(t *testing.T) {
	t.Parallel()
	if _, stderr, err := runCmd(t, map[string]string{}); !errors.Is(err, errUsage) || !strings.Contains(stderr, "usage") {
		t.Errorf("no args: %v %q", err, stderr)
	}
	if _, stderr, err := runCmd(t, map[string]string{}, "frobnicate"); !errors.Is(err, errUsage) || !strings.Contains(stderr, "unknown command") {
		t.Errorf("unknown command: %v %q", err, stderr)
	}
	for _, env := range []map[string]string{
		{"REGISTRY_MIGRATE": "maybe"},
		{"REGISTRY_LOG_LEVEL": "loud"},
		{"REGISTRY_LOG_FORMAT": "xml"},
		{"REGISTRY_DB_MAX_CONNS": "0"},
		{"REGISTRY_DB_ACQUIRE_TIMEOUT": "0s"},
		{"REGISTRY_SHUTDOWN_TIMEOUT": "soon"},
	} {
		// Should a setting be accepted by mistake, serve fails fast on a
		// database that is not there rather than starting one in the
		// checkout on the default port.
		withDB := maps.Clone(env)
		withDB["REGISTRY_DATABASE_URL"] = "postgres://registry@127.0.0.1:1/registry?connect_timeout=2"
		withDB["REGISTRY_LISTEN"] = "127.0.0.1:0"
		_, _, err := runCmd(t, withDB, "serve")
		for k := range env {
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%v: error %v does not name %s", env, err, k)
			}
		}
	}
	// A taken port fails at once with the setting to change.
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret})
	addr := strings.TrimPrefix(srv.url, "http://")
	_, _, err := runCmd(t, map[string]string{"REGISTRY_LISTEN": addr}, "serve")
	if err == nil || !strings.Contains(err.Error(), "REGISTRY_LISTEN") {
		t.Errorf("taken port: %v", err)
	}
}

func TestServeUnreachableDatabase(t *testing.T) {
	t.Parallel()
	_, _, err := runCmd(t, map[string]string{
		"REGISTRY_DATABASE_URL": "postgres://registry:s3cret-password@127.0.0.1:1/registry?connect_timeout=2",
		"REGISTRY_LISTEN":       "127.0.0.1:0",
	}, "serve")
	if err == nil {
		t.Fatal("serve started without a database")
	}
	if strings.Contains(err.Error(), "s3cret-password") {
		t.Errorf("error leaks the password: %v", err)
	}
}

// The embedded default: no database URL, a data directory, a cluster
// started from the server binaries, data kept across restarts.
func TestServeEmbedded(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "registryd-embedded-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // the postgres user must pass through
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	srv := startServer(t, map[string]string{"REGISTRY_DATA_DIR": data})
	// The embedded default hands out a working admin token at start.
	m := regexp.MustCompile(`export REGISTRY_TOKEN=(\S+)`).FindStringSubmatch(srv.stdout.String())
	if m == nil {
		t.Fatalf("no admin token printed:\n%s", srv.stdout.String())
	}
	printed := m[1]
	code, body := call(t, "POST", srv.url+"/v1/hardware/create", `{"name":"H100"}`, printed)
	if code != 201 {
		t.Fatalf("create hardware %d %s", code, body)
	}
	// The secret it signs with lives in the data directory, owner-only.
	if fi, err := os.Stat(filepath.Join(data, "jwt-secret")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("jwt-secret: %v %v", fi, err)
	}
	// `registryd token` uses the same secret without any configuration.
	tok := adminToken(t, map[string]string{"REGISTRY_DATA_DIR": data})
	if err := srv.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	srv = startServer(t, map[string]string{"REGISTRY_DATA_DIR": data})
	for _, tk := range []string{printed, tok} {
		if code, body := call(t, "POST", srv.url+"/v1/hardware/list", "", tk); code != 200 || !strings.Contains(body, `"H100"`) {
			t.Fatalf("after restart %d %s", code, body)
		}
	}
	if err := srv.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// Stopped cleanly: no server left holding the data directory.
	if _, err := os.Stat(filepath.Join(data, "postgres", "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("postmaster.pid left behind: %v", err)
	}
}

func TestServeEmbeddedWithoutBinaries(t *testing.T) {
	// Not parallel: it changes the environment of the whole process.
	empty := t.TempDir()
	t.Setenv("PG_BINDIR", empty)
	_, _, err := runCmd(t, map[string]string{"REGISTRY_DATA_DIR": filepath.Join(empty, "data"), "REGISTRY_LISTEN": "127.0.0.1:0"}, "serve")
	if err == nil {
		t.Fatal("started without server binaries")
	}
	for _, way := range []string{"apt-get install postgresql", "REGISTRY_DATABASE_URL", "docker compose up"} {
		if !strings.Contains(err.Error(), way) {
			t.Errorf("error does not name %q: %v", way, err)
		}
	}
}

func TestServeRequiresTokenKeys(t *testing.T) {
	t.Parallel()
	_, _, err := runCmd(t, map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_LISTEN": "127.0.0.1:0"}, "serve")
	if err == nil || !strings.Contains(err.Error(), "REGISTRY_JWT_SECRET") {
		t.Fatalf("serve without keys: %v", err)
	}
	// A weak secret is refused, and the message never repeats it.
	_, _, err = runCmd(t, map[string]string{"REGISTRY_JWT_SECRET": "hunter2-hunter2"}, "serve")
	if err == nil || !strings.Contains(err.Error(), "at least 32") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("short secret: %v", err)
	}
	file := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(file, []byte(testSecret+"\n"), 0o600)
	if _, _, err := runCmd(t, map[string]string{"REGISTRY_JWT_SECRET": testSecret, "REGISTRY_JWT_SECRET_FILE": file}, "serve"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("secret and file: %v", err)
	}
}

func TestTokenCommand(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(file, []byte(testSecret+"\n"), 0o600)
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET_FILE": file}
	out, _, err := runCmd(t, env, "token", "--sub", "sched-1", "--role", "scheduler", "--ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tok := lines[len(lines)-1]
	if strings.Count(tok, ".") != 2 || strings.Contains(tok, " ") {
		t.Fatalf("last line is not a token alone: %q", tok)
	}
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": env["REGISTRY_DATABASE_URL"], "REGISTRY_JWT_SECRET": testSecret})
	if code, body := call(t, "POST", srv.url+"/v1/nodes/list", "", tok); code != 200 {
		t.Fatalf("scheduler list: %d %s", code, body)
	}
	if code, _ := call(t, "POST", srv.url+"/v1/hardware/create", `{"name":"X"}`, tok); code != 403 {
		t.Fatalf("scheduler creating hardware: %d", code)
	}
	for _, args := range [][]string{
		{"token"}, {"token", "--sub", "x"}, {"token", "--role", "admin"}, {"token", "--sub", "x", "--role", "root"},
		{"token", "--sub", "x", "--role", "admin", "--ttl", "-1h"},
	} {
		if _, _, err := runCmd(t, env, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
	// With an external database and no secret there is nothing to sign with.
	if _, _, err := runCmd(t, map[string]string{"REGISTRY_DATABASE_URL": env["REGISTRY_DATABASE_URL"]}, "token", "--sub", "x", "--role", "admin"); err == nil {
		t.Error("token without a secret succeeded")
	}
}

// Tokens minted by an external identity provider verify with
// REGISTRY_JWT_PUBLIC_KEYS alone; registryd then has nothing to sign with.
func TestServePublicKeysOnly(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keys := filepath.Join(t.TempDir(), "idp.pem")
	os.WriteFile(keys, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_PUBLIC_KEYS": keys,
		"REGISTRY_JWT_ISSUER": "https://idp.example", "REGISTRY_JWT_AUDIENCE": "registryd"}
	srv := startServer(t, env)
	mint := func(iss string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{
			"sub": "ci-bot", "role": "reader", "iss": iss, "aud": "registryd", "exp": time.Now().Add(time.Hour).Unix(),
		}).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if code, body := call(t, "POST", srv.url+"/v1/nodes/list", "", mint("https://idp.example")); code != 200 {
		t.Fatalf("RS256 token from the identity provider: %d %s", code, body)
	}
	if code, _ := call(t, "POST", srv.url+"/v1/nodes/list", "", mint("https://other.example")); code != 401 {
		t.Fatalf("token from another issuer: %d", code)
	}
	if _, _, err := runCmd(t, env, "token", "--sub", "x", "--role", "admin"); err == nil || !strings.Contains(err.Error(), "identity provider") {
		t.Errorf("token with public keys only: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not a key"), 0o644)
	if _, _, err := runCmd(t, map[string]string{"REGISTRY_JWT_PUBLIC_KEYS": bad}, "serve"); err == nil || !strings.Contains(err.Error(), "REGISTRY_JWT_PUBLIC_KEYS") {
		t.Errorf("bad key file: %v", err)
	}
}

// When the token revocation list cannot be loaded, serve gives up and
// returns its error: every loop it had started (the watch hub, the
// revocation list, heartbeats) stops with it, whichever way serve returns,
// rather than keeping it from returning at all.
func TestServeGivesUpWithoutRevocationList(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// The schema version is current, so serve gets as far as loading the
	// list, which then fails on every try.
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "ALTER TABLE token_revocations RENAME TO token_revocations_hidden"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_LISTEN": "127.0.0.1:0"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg.revocationsWait = 500 * time.Millisecond
	errc := make(chan error, 1)
	go func() { errc <- serve(context.Background(), cfg, nil, io.Discard, io.Discard) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "token revocation list") {
			t.Fatalf("serve returned %v, want the revocation list's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return within 20s of giving up on the revocation list")
	}
}

// A clean stop (SIGTERM, here its context ending) logs no warning: what
// ends with the replica (the notification connection, the node cache) is
// not a fault.
func TestServeCleanStopLogsNoWarning(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_LOG_FORMAT": "json"}
	srv := startServer(t, env)
	tok := adminToken(t, env)
	if code, body := call(t, "POST", srv.url+"/v1/nodes/create",
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`, tok); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	// The node cache takes the node up once the change feed is proven
	// current: then a stop has something to drop.
	apitest.Eventually(t, 20*time.Second, "the node cache filled", func() bool {
		resp, err := http.Get(srv.url + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "registryd_node_cache_nodes 1")
	})
	if err := srv.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	_, after, found := strings.Cut(srv.stderr.String(), `"msg":"shutting down"`)
	if !found {
		t.Fatalf("no shutdown in the log:\n%s", srv.stderr.String())
	}
	for line := range strings.Lines(after) {
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("logged at a clean stop: %s", line)
		}
	}
}
