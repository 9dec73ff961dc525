package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

// gate holds a fake provider's answers until opened.
type gate struct {
	arrived chan struct{} // a value each time a request is held
	open    chan struct{}
	once    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan struct{}, 16), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *gate) hold(r *http.Request) {
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-r.Context().Done():
	}
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// waitArrived waits (bounded) until the gate holds a request.
func (g *gate) waitArrived(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no request reached the provider within 30s", what)
	}
}

// heldSCP is the fake SCP of these tests, every list held by g.
func heldSCP(t *testing.T, g *gate) *scptest.Server {
	s := fakeSCP(t)
	s.Lock()
	s.Hold = g.hold
	s.Unlock()
	return s
}

func scpEnv(env map[string]string, s *scptest.Server) map[string]string {
	env["REGISTRY_SCP_ENDPOINT"] = s.URL
	env["REGISTRY_SCP_ACCESS_KEY"] = scptest.AccessKey
	env["REGISTRY_SCP_SECRET_KEY"] = scptest.SecretKey
	env["REGISTRY_SCP_ACCOUNT_ID"] = scptest.AccountID
	return env
}

// process is registryd run as a process of its own (the test binary
// doubling as registryd, see TestMain).
type process struct {
	cmd    *exec.Cmd
	stdout *apitest.Buffer
	stderr *apitest.Buffer
	done   chan struct{} // closed once it has exited; err is then set
	err    error
}

func startProcess(t *testing.T, env map[string]string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "REGISTRY_LOG_FORMAT=text"}
	if v := os.Getenv("PG_BINDIR"); v != "" {
		cmd.Env = append(cmd.Env, "PG_BINDIR="+v)
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &process{cmd: cmd, stdout: &apitest.Buffer{}, stderr: &apitest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// serving waits until the process serves and returns its URL.
func (p *process) serving(t *testing.T) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(p.stdout.String()); m != nil {
			return m[1]
		}
		select {
		case <-p.done:
			t.Fatalf("serve exited before serving: %v\nstderr:\n%s", p.err, p.stderr.String())
		case <-deadline:
			t.Fatalf("serve did not start within 60s; stderr:\n%s", p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits (bounded) for the exit status.
func (p *process) stop(t *testing.T) error {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit within 30s of SIGTERM; stderr:\n%s", p.stderr.String())
		return nil
	}
}

// A live `registryd serve` on the embedded default shares its PostgreSQL:
// migrate status, sync --once, token and token revoke run against the same
// data folder all work (they used to fail with "another PostgreSQL …
// stop it with pg_ctl"), leave the server's database running, and serve
// keeps answering. A second serve on that folder is refused at once,
// naming the first one's pid and the folder.
func TestEmbeddedSharedWithServe(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	g := newGate(t)
	g.release() // nothing held in this test
	env := scpEnv(map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_LISTEN": "127.0.0.1:0",
		"REGISTRY_SYNC_INTERVAL": "1h"}, heldSCP(t, g))
	srv := startProcess(t, env, "serve")
	url := srv.serving(t)
	// The token lines follow the "serving on" line: wait for them too.
	tokenRE := regexp.MustCompile(`export REGISTRY_TOKEN=(\S+)\n`)
	var m []string
	for wait := time.Now().Add(10 * time.Second); m == nil; {
		if m = tokenRE.FindStringSubmatch(srv.stdout.String()); m == nil {
			if time.Now().After(wait) {
				t.Fatalf("no admin token printed within 10s:\n%s", srv.stdout.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	printed := m[1]
	cluster := filepath.Join(data, "postgres")
	pid := postmasterPid(t, cluster, 0)

	out, stderr, err := runCmd(t, env, "migrate", "status")
	if err != nil || !strings.Contains(out, "VERSION") || !strings.Contains(out, "applied") {
		t.Fatalf("migrate status beside serve: %v\n%s\n%s", err, out, stderr)
	}
	out, stderr, err = runCmd(t, env, "sync", "--once")
	// (serve's own first pass may have imported them already)
	if err != nil || !strings.Contains(out, "scp: 2 hosts seen → 8 nodes: ") {
		t.Fatalf("sync --once beside serve: %v\n%s\n%s", err, out, stderr)
	}
	// The token command signs with serve's secret; the nodes sync --once
	// wrote are in serve's database.
	tok := adminToken(t, env)
	if code, body := call(t, "POST", url+"/v1/nodes/list", `{"source":"scp"}`, tok); code != 200 || strings.Count(body, `"source":"scp"`) != 8 {
		t.Fatalf("list with the minted token: %d %s", code, body)
	}
	out, stderr, err = runCmd(t, env, "token", "revoke", "--sub", "test-admin")
	if err != nil {
		t.Fatalf("token revoke beside serve: %v\n%s\n%s", err, out, stderr)
	}
	eventually(t, 10*time.Second, 401, "POST", url+"/v1/nodes/list", tok)

	// Still the same postmaster, never stopped or restarted.
	if now := postmasterPid(t, cluster, 0); now != pid {
		t.Errorf("postmaster pid %d became %d: the commands stopped serve's database", pid, now)
	}
	if code, body := call(t, "POST", url+"/v1/nodes/list", `{"source":"scp"}`, printed); code != 200 {
		t.Fatalf("serve after the commands: %d %s", code, body)
	}
	if code, _ := call(t, "GET", url+"/healthz", ""); code != 200 {
		t.Errorf("/healthz after the commands: %d", code)
	}

	// A second serve (another port) is refused quickly, naming the first.
	start := time.Now()
	second := startProcess(t, env, "serve")
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the second serve neither refused nor exited within 10s; stderr:\n%s", second.stderr.String())
	}
	var exit *exec.ExitError
	if !errors.As(second.err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("second serve: %v, want exit status 1", second.err)
	}
	msg := second.stderr.String()
	for _, want := range []string{"pid " + strconv.Itoa(srv.cmd.Process.Pid), "REGISTRY_DATA_DIR=" + data} {
		if !strings.Contains(msg, want) {
			t.Errorf("second serve's refusal does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "pg_ctl") || strings.Contains(msg, "stop it") {
		t.Errorf("the refusal advises stopping the live server's database:\n%s", msg)
	}
	t.Logf("second serve refused in %s", time.Since(start).Round(time.Millisecond))
	// On the same port (two `make run`s), the refusal is the same.
	samePort := map[string]string{"REGISTRY_LISTEN": strings.TrimPrefix(url, "http://")}
	for k, v := range env {
		if _, ok := samePort[k]; !ok {
			samePort[k] = v
		}
	}
	if _, _, err := runCmd(t, samePort, "serve"); err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(srv.cmd.Process.Pid)) ||
		!strings.Contains(err.Error(), "REGISTRY_DATA_DIR="+data) {
		t.Errorf("second serve on the same port: %v, want a refusal naming the first serve's pid and folder", err)
	}
	if code, _ := call(t, "POST", url+"/v1/nodes/list", "", printed); code != 200 {
		t.Errorf("serve after the second one's refusal: %d", code)
	}

	if err := srv.stop(t); err != nil {
		t.Errorf("serve exit: %v\n%s", err, srv.stderr.String())
	}
	if _, ok := pglocal.Running(cluster); ok {
		t.Error("PostgreSQL still running after serve stopped")
	}
}

// With no serve running, a one-shot command starts the embedded PostgreSQL
// for its run. A serve started meanwhile waits for it to finish (saying
// so) instead of failing or having its database stopped under it, then
// starts the cluster itself.
func TestServeWaitsForOneShotCommand(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	g := newGate(t)
	env := scpEnv(map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_SYNC_INTERVAL": "1h"}, heldSCP(t, g))

	type result struct {
		out, stderr string
		err         error
	}
	synced := make(chan result, 1)
	go func() {
		out, stderr, err := runCmd(t, env, "sync", "--once")
		synced <- result{out, stderr, err}
	}()
	g.waitArrived(t, "sync --once")

	serveEnv := map[string]string{"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_EMBEDDED_WAIT": "1s"}
	for k, v := range env {
		serveEnv[k] = v
	}
	// The wait is bounded: after REGISTRY_EMBEDDED_WAIT serve gives up,
	// naming what it waited for.
	impatient := startProcess(t, serveEnv, "serve")
	select {
	case <-impatient.done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve with REGISTRY_EMBEDDED_WAIT=1s still waiting after 30s")
	}
	if msg := impatient.stderr.String(); impatient.err == nil || !strings.Contains(msg, "waited 1s (REGISTRY_EMBEDDED_WAIT) for `registryd sync --once`") {
		t.Errorf("impatient serve: %v\n%s", impatient.err, msg)
	}
	serveEnv["REGISTRY_EMBEDDED_WAIT"] = "1m"
	srv := startProcess(t, serveEnv, "serve")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(srv.stderr.String(), "waiting for another registryd command to finish") {
		select {
		case <-srv.done:
			t.Fatalf("serve exited while sync --once used the database: %v\n%s", srv.err, srv.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve does not say it waits:\n%s", srv.stderr.String())
		}
	}
	if !strings.Contains(srv.stderr.String(), "sync --once") {
		t.Errorf("serve's wait does not name the command:\n%s", srv.stderr.String())
	}
	g.release()
	select {
	case r := <-synced:
		if r.err != nil {
			t.Fatalf("sync --once: %v\n%s\n%s", r.err, r.out, r.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sync --once did not finish within 60s")
	}
	url := srv.serving(t)
	tok := adminToken(t, env)
	if code, body := call(t, "POST", url+"/v1/nodes/list", `{"source":"scp"}`, tok); code != 200 || strings.Count(body, `"source":"scp"`) != 8 {
		t.Fatalf("serve after waiting: %d %s", code, body)
	}
}

// Commands started at the same moment on a stopped embedded default start
// one PostgreSQL between them, all succeed, and leave it stopped.
func TestEmbeddedConcurrentStart(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	env := map[string]string{"REGISTRY_DATA_DIR": data}
	// Made by serve's first start; migrate does not need it, but it
	// must not make it either.
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([]string, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			var stderr string
			outs[i], stderr, errs[i] = runCmd(t, env, "migrate", "up")
			if errs[i] != nil {
				errs[i] = errors.New(errs[i].Error() + "\n" + stderr)
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("command %d: %v", i, err)
		}
	}
	if _, ok := pglocal.Running(filepath.Join(data, "postgres")); ok {
		t.Error("PostgreSQL left running after every command ended")
	}
	if _, err := os.Stat(filepath.Join(data, "jwt-secret")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a command other than serve made the token secret: %v", err)
	}
	if t.Failed() {
		t.Logf("outputs: %q", outs)
	}
}

// `sync --once` while a serving replica is in the middle of a pass waits
// for that pass and then runs its own; --no-wait refuses at once; the
// wait is bounded by REGISTRY_SYNC_TIMEOUT.
func TestSyncOnceWaitsForPass(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	scp := heldSCP(t, g)
	env := scpEnv(map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_MIGRATE": "true",
		"REGISTRY_JWT_SECRET": testSecret, "REGISTRY_SYNC_INTERVAL": "1h"}, scp)
	startServer(t, env) // its first pass starts at once, and is held
	g.waitArrived(t, "serve's pass")

	start := time.Now()
	_, _, err := runCmd(t, env, "sync", "--once", "--no-wait")
	if err == nil || !strings.Contains(err.Error(), "in the middle of a sync pass") {
		t.Errorf("--no-wait during a pass: %v, want an immediate refusal", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("--no-wait took %s", d)
	}

	// Bounded: with a REGISTRY_SYNC_TIMEOUT of 1s it gives up after 1s.
	short := map[string]string{"REGISTRY_SYNC_TIMEOUT": "1s"}
	for k, v := range env {
		if _, ok := short[k]; !ok {
			short[k] = v
		}
	}
	start = time.Now()
	_, stderr, err := runCmd(t, short, "sync", "--once")
	if d := time.Since(start); err == nil || !strings.Contains(err.Error(), "did not end within 1s") || d < time.Second || d > 15*time.Second {
		t.Errorf("bounded wait: %v after %s, want a refusal after 1s\n%s", err, d, stderr)
	}

	type result struct {
		out, stderr string
		err         error
	}
	done := make(chan result, 1)
	errb := &apitest.Buffer{}
	go func() {
		var out apitest.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		err := run(ctx, []string{"sync", "--once"}, envFunc(env), &out, errb)
		done <- result{out.String(), errb.String(), err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(errb.String(), "waiting for it to end") {
		if time.Now().After(deadline) {
			t.Fatalf("sync --once does not say it waits:\n%s", errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("sync --once ended while serve's pass was held: %v\n%s\n%s", r.err, r.out, r.stderr)
	case <-time.After(300 * time.Millisecond):
	}
	g.release() // serve's pass ends, then the waiting one runs
	select {
	case r := <-done:
		if r.err != nil || !strings.Contains(r.out, "scp: 2 hosts seen → 8 nodes: 0 added, 0 updated, 8 unchanged") {
			t.Fatalf("sync --once after waiting: %v\n%s\n%s", r.err, r.out, r.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sync --once did not run within 60s of the other pass ending")
	}
}

// `registryd token` never makes a secret: with no key configured and none
// in the data folder it exits 1, naming the folder it looked in (found as
// serve finds it) and what to set, and creates nothing.
func TestTokenNeverMakesASecret(t *testing.T) {
	t.Parallel()
	base := pgtest.TempDir(t)
	empty := filepath.Join(base, "empty")
	mkdir(t, empty, 0o711) // the postgres user passes through, as serve needs
	for _, data := range []string{empty, filepath.Join(base, "missing")} {
		_, _, err := runCmd(t, map[string]string{"REGISTRY_DATA_DIR": data}, "token", "--sub", "x", "--role", "reader")
		if err == nil {
			t.Fatalf("%s: token minted without a secret", data)
		}
		for _, want := range []string{data, "REGISTRY_JWT_SECRET", "REGISTRY_DATA_DIR", "registryd serve"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", data, err, want)
			}
		}
	}
	if entries, err := os.ReadDir(empty); err != nil || len(entries) != 0 {
		t.Errorf("token wrote into the data folder: %v %v", entries, err)
	}
	if _, err := os.Stat(filepath.Join(base, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("token created the data folder: %v", err)
	}
	// Through the real process too: exit status 1.
	p := startProcess(t, map[string]string{"REGISTRY_DATA_DIR": empty}, "token", "--sub", "x", "--role", "reader")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("token did not exit within 30s")
	}
	var exit *exec.ExitError
	if !errors.As(p.err, &exit) || exit.ExitCode() != 1 || !strings.Contains(p.stderr.String(), empty) {
		t.Errorf("token process: %v, want exit status 1 naming %s\n%s", p.err, empty, p.stderr.String())
	}
}

// As root with a checkout the postgres user cannot enter, token looks in
// the same fallback folder serve uses, without making it.
func TestTokenFindsServesFallback(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the fallback is for root")
	}
	logger := slog.New(slog.DiscardHandler)
	checkout := filepath.Join(t.TempDir(), "checkout", ".data")
	base := filepath.Join(pgtest.TempDir(t), "var-lib-registryd")
	cfg := config{DataDir: checkout, embedded: embeddedTuning{fallbackBase: base}}
	_, err := existingTokenSecret(cfg, logger)
	if err == nil || !strings.Contains(err.Error(), base+"/") {
		t.Fatalf("before serve: %v, want a refusal naming the fallback under %s", err, base)
	}
	if _, err := os.Stat(base); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("token made the fallback base: %v", err)
	}
	made, _, err := tokenSecret(cfg, logger) // what serve does
	if err != nil {
		t.Fatal(err)
	}
	got, err := existingTokenSecret(cfg, logger)
	if err != nil || string(got) != string(made) {
		t.Errorf("token's secret %q %v, want serve's", got, err)
	}
}

// A registryd killed outright leaves no claim: the kernel drops its locks,
// its PostgreSQL shuts down with it, and the next command starts afresh.
func TestKilledServeLeavesNoClaim(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	env := map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_LISTEN": "127.0.0.1:0"}
	srv := startProcess(t, env, "serve")
	srv.serving(t)
	srv.cmd.Process.Kill()
	<-srv.done
	out, stderr, err := runCmd(t, env, "migrate", "status")
	if err != nil || !strings.Contains(out, "applied") {
		t.Fatalf("migrate status after serve was killed: %v\n%s\n%s", err, out, stderr)
	}
	again := startProcess(t, env, "serve")
	again.serving(t)
}

// A PostgreSQL on the data folder that no running registryd started (by
// hand, say) is neither used, nor stopped, nor advised to be stopped.
func TestForeignPostgresRefused(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	mkdir(t, data, 0o711)
	c, err := pglocal.Start(context.Background(), pglocal.Options{DataDir: filepath.Join(data, "postgres"), Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	pid, _ := pglocal.Running(filepath.Join(data, "postgres"))
	_, _, err = runCmd(t, map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_EMBEDDED_WAIT": "1s"}, "migrate", "status")
	if err == nil || !strings.Contains(err.Error(), "no running registryd started") || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) {
		t.Fatalf("migrate status beside a foreign PostgreSQL: %v", err)
	}
	if strings.Contains(err.Error(), "pg_ctl") || strings.Contains(err.Error(), "stop it") {
		t.Errorf("the error advises stopping it: %v", err)
	}
	if now, ok := pglocal.Running(filepath.Join(data, "postgres")); !ok || now != pid {
		t.Errorf("the foreign PostgreSQL was touched: %d %v", now, ok)
	}
}

func TestEmbeddedWaitConfig(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"soon", "0", "500ms", "2h"} {
		_, err := loadConfig(envFunc(map[string]string{"REGISTRY_EMBEDDED_WAIT": v}))
		if err == nil || !strings.Contains(err.Error(), "REGISTRY_EMBEDDED_WAIT") {
			t.Errorf("%q: %v, want an error naming REGISTRY_EMBEDDED_WAIT", v, err)
		}
	}
	cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_EMBEDDED_WAIT": "5s"}))
	if err != nil || cfg.EmbeddedWait != 5*time.Second {
		t.Errorf("5s: %v %v", cfg.EmbeddedWait, err)
	}
	if cfg, _ := loadConfig(envFunc(map[string]string{})); cfg.EmbeddedWait != time.Minute {
		t.Errorf("default %v, want 1m", cfg.EmbeddedWait)
	}
}

// serve stopping (SIGTERM) while another command uses its PostgreSQL
// waits for that command before stopping the database.
func TestServeStopWaitsForCommands(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	env := map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_LISTEN": "127.0.0.1:0"}
	srv := startProcess(t, env, "serve")
	srv.serving(t)

	g := newGate(t)
	syncEnv := scpEnv(map[string]string{"REGISTRY_DATA_DIR": data}, heldSCP(t, g))
	type result struct {
		out, stderr string
		err         error
	}
	synced := make(chan result, 1)
	go func() {
		out, stderr, err := runCmd(t, syncEnv, "sync", "--once")
		synced <- result{out, stderr, err}
	}()
	g.waitArrived(t, "sync --once")
	srv.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(srv.stderr.String(), "waiting for other registryd commands") {
		if time.Now().After(deadline) {
			t.Fatalf("serve does not wait for sync --once:\n%s", srv.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.release()
	select {
	case r := <-synced:
		if r.err != nil || !strings.Contains(r.out, "8 added") {
			t.Fatalf("sync --once while serve stopped: %v\n%s\n%s", r.err, r.out, r.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sync --once did not finish within 60s")
	}
	if err := srv.stop(t); err != nil {
		t.Errorf("serve exit: %v\n%s", err, srv.stderr.String())
	}
}

// `registryd sync --once` holds back a removal of more than
// REGISTRY_SYNC_MAX_REMOVAL percent of a provider's nodes, and says how
// to let it through; with --allow-removal the pass takes them away.
func TestSyncOnceHoldsMassRemoval(t *testing.T) {
	t.Parallel()
	scp := fakeSCP(t)
	env := scpEnv(map[string]string{"REGISTRY_DATA_DIR": filepath.Join(pgtest.TempDir(t), "data")}, scp)
	if out, stderr, err := runCmd(t, env, "sync", "--once"); err != nil || !strings.Contains(out, "scp: 2 hosts seen → 8 nodes: 8 added") {
		t.Fatalf("first pass: %v\n%s\n%s", err, out, stderr)
	}
	scp.Lock()
	scp.Nodes = nil // the provider answers an empty list
	scp.Unlock()
	out, stderr, err := runCmd(t, env, "sync", "--once")
	if err != nil || !strings.Contains(out, "0 removed") || !strings.Contains(out, "REMOVALS HELD BACK: 8 of the 8 nodes") ||
		!strings.Contains(out, "registryd sync --once --allow-removal") {
		t.Fatalf("empty answer: %v\n%s\n%s", err, out, stderr)
	}
	out, stderr, err = runCmd(t, env, "sync", "--once", "--allow-removal")
	if err != nil || !strings.Contains(out, "8 removed") || strings.Contains(out, "HELD BACK") {
		t.Fatalf("--allow-removal: %v\n%s\n%s", err, out, stderr)
	}
}
