package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/pgtest"
)

// plantedSecret is what an attacker puts in a data directory they made.
const plantedSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// otherUser is a uid that is not ours; changing owners needs root.
func otherUser(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another user")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	return uid
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

// serveRefused runs `registryd serve` on env and returns its error. Getting
// as far as starting PostgreSQL means the data directory was accepted: the
// test fails at once instead of waiting for a server.
func serveRefused(t *testing.T, env map[string]string) error {
	t.Helper()
	env["REGISTRY_LISTEN"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr apitest.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, envFunc(env), &stdout, &stderr) }()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-done:
			return err
		case <-deadline:
			t.Fatalf("serve neither refused nor started; stderr:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
			if strings.Contains(stderr.String(), "starting embedded PostgreSQL") {
				cancel()
				<-done
				t.Fatalf("serve accepted the data directory:\n%s", stderr.String())
			}
		}
	}
}

// The attack of issue 8: another local user creates the data directory
// first and plants their own token secret in it. registryd must refuse to
// start (serve) or to sign (token) rather than trust that secret.
func TestPlantedDataDirRefused(t *testing.T) {
	t.Parallel()
	nobody := otherUser(t)
	data := filepath.Join(pgtest.TempDir(t), "data")
	mkdir(t, data, 0o755)
	secret := filepath.Join(data, "jwt-secret")
	writeFile(t, secret, plantedSecret+"\n", 0o600)
	chown(t, data, nobody)
	chown(t, secret, nobody)
	env := map[string]string{"REGISTRY_DATA_DIR": data}

	for name, err := range map[string]error{
		"serve": serveRefused(t, env),
		"token": func() error { _, _, err := runCmd(t, env, "token", "--sub", "x", "--role", "admin"); return err }(),
	} {
		if err == nil {
			t.Fatalf("%s trusted a data directory planted by uid %d", name, nobody)
		}
		for _, want := range []string{data, "belongs to uid " + strconv.Itoa(nobody), "chown root " + data, "REGISTRY_DATA_DIR"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", name, err, want)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(data, "postgres")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cluster was made in the planted directory: %v", err)
	}
}

// Every way a data directory or its secret can be open to another user is
// refused, naming the path and the fix; what is private is accepted.
func TestDataDirRules(t *testing.T) {
	t.Parallel()
	nobody := otherUser(t)
	tests := []struct {
		name  string
		setup func(t *testing.T, data string) // data does not exist yet
		want  func(data string) []string      // in the error; nil: accepted
	}{
		{"fresh", func(*testing.T, string) {}, nil},
		{"existing, readable by all", func(t *testing.T, data string) { mkdir(t, data, 0o755) }, nil},
		{"our own symlink to our own folder", func(t *testing.T, data string) {
			mkdir(t, data+".real", 0o711)
			if err := os.Symlink(data+".real", data); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"folder of another user", func(t *testing.T, data string) {
			mkdir(t, data, 0o700)
			chown(t, data, nobody)
		}, func(data string) []string { return []string{data, "uid " + strconv.Itoa(nobody), "chown"} }},
		{"folder writable by others", func(t *testing.T, data string) { mkdir(t, data, 0o777) },
			func(data string) []string { return []string{data, "mode drwxrwxrwx", "chmod go-w " + data} }},
		{"folder writable by its group", func(t *testing.T, data string) { mkdir(t, data, 0o770) },
			func(data string) []string { return []string{data, "chmod g-w " + data} }},
		{"secret readable by others", func(t *testing.T, data string) {
			mkdir(t, data, 0o711)
			writeFile(t, filepath.Join(data, "jwt-secret"), plantedSecret, 0o644)
		}, func(data string) []string {
			return []string{filepath.Join(data, "jwt-secret"), "may read", "chmod go-r " + filepath.Join(data, "jwt-secret")}
		}},
		{"secret of another user", func(t *testing.T, data string) {
			mkdir(t, data, 0o711)
			writeFile(t, filepath.Join(data, "jwt-secret"), plantedSecret, 0o600)
			chown(t, filepath.Join(data, "jwt-secret"), nobody)
		}, func(data string) []string {
			return []string{filepath.Join(data, "jwt-secret"), "uid " + strconv.Itoa(nobody)}
		}},
		{"secret is a symlink", func(t *testing.T, data string) {
			mkdir(t, data, 0o711)
			writeFile(t, data+".secret", plantedSecret, 0o600)
			if err := os.Symlink(data+".secret", filepath.Join(data, "jwt-secret")); err != nil {
				t.Fatal(err)
			}
		}, func(data string) []string { return []string{filepath.Join(data, "jwt-secret"), "not a regular file"} }},
		{"another user's symlink to our folder", func(t *testing.T, data string) {
			mkdir(t, data+".real", 0o711)
			if err := os.Symlink(data+".real", data); err != nil {
				t.Fatal(err)
			}
			chown(t, data, nobody)
		}, func(data string) []string { return []string{data, "symbolic link", "uid " + strconv.Itoa(nobody)} }},
		{"our symlink to another user's folder", func(t *testing.T, data string) {
			mkdir(t, data+".real", 0o711)
			chown(t, data+".real", nobody)
			if err := os.Symlink(data+".real", data); err != nil {
				t.Fatal(err)
			}
		}, func(data string) []string { return []string{data, "uid " + strconv.Itoa(nobody)} }},
	}
	base := pgtest.TempDir(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := filepath.Join(base, strconv.Itoa(i), "data")
			mkdir(t, filepath.Dir(data), 0o755)
			tt.setup(t, data)
			env := map[string]string{"REGISTRY_DATA_DIR": data}
			if tt.want == nil {
				// serve's way to the secret makes it; token then uses it.
				cfg, err := loadConfig(envFunc(env))
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := tokenSecret(cfg, slog.New(slog.DiscardHandler)); err != nil {
					t.Fatalf("refused: %v", err)
				}
				fi, err := os.Stat(filepath.Join(data, "jwt-secret"))
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("secret: %v %v, want mode 0600", fi, err)
				}
				if _, _, err := runCmd(t, env, "token", "--sub", "x", "--role", "admin"); err != nil {
					t.Errorf("token refused: %v", err)
				}
				return
			}
			_, _, err := runCmd(t, env, "token", "--sub", "x", "--role", "admin")
			if err == nil {
				t.Fatal("token accepted the data directory")
			}
			for _, want := range tt.want(data) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if err := serveRefused(t, env); err == nil {
				t.Error("serve accepted the data directory")
			}
		})
	}
	// A fresh data directory is made private: 0711 as root (the postgres
	// user passes through to its cluster), 0700 otherwise.
	fi, err := os.Stat(filepath.Join(base, "0", "data"))
	if want := os.FileMode(0o711); err != nil || fi.Mode().Perm() != want {
		t.Errorf("fresh data directory: %v %v, want mode %v", fi, err, want)
	}
}

// As root, with a checkout the postgres user cannot enter, the data goes
// under a root-owned base (not /var/tmp, where anyone creates folders),
// and a folder planted there first is refused just the same.
func TestFallbackDataDir(t *testing.T) {
	t.Parallel()
	nobody := otherUser(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// t.TempDir's parent is 0700: the postgres user cannot enter it.
	checkout := filepath.Join(t.TempDir(), "checkout", ".data")
	if pglocal.CheckAccess(filepath.Join(checkout, "postgres")) == nil {
		t.Fatal("test set-up: the checkout should be unreachable for the postgres user")
	}
	base := filepath.Join(pgtest.TempDir(t), "var-lib-registryd")
	cfg := config{DataDir: checkout, embedded: embeddedTuning{fallbackBase: base}}

	dir, err := embeddedDataDir(cfg, logger, true)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != base {
		t.Fatalf("fallback %s is not under %s", dir, base)
	}
	for _, d := range []string{base, dir} {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm() != 0o711 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: %v %v, want mode 0711 owned by root", d, fi.Mode(), err)
		}
	}
	if err := pglocal.CheckAccess(filepath.Join(dir, "postgres")); err != nil {
		t.Errorf("the postgres user cannot reach its cluster in the fallback: %v", err)
	}
	again, err := embeddedDataDir(cfg, logger, true)
	if err != nil || again != dir {
		t.Errorf("second start: %q %v, want the same %q", again, err, dir)
	}
	if _, _, err := tokenSecret(cfg, logger); err != nil {
		t.Fatal(err)
	}

	// The original attack, aimed at the fallback: the per-checkout folder
	// made first by another user, with their secret in it.
	base2 := filepath.Join(pgtest.TempDir(t), "var-lib-registryd")
	cfg.embedded.fallbackBase = base2
	planted := filepath.Join(base2, filepath.Base(dir))
	mkdir(t, planted, 0o755)
	writeFile(t, filepath.Join(planted, "jwt-secret"), plantedSecret, 0o600)
	chown(t, planted, nobody)
	chown(t, filepath.Join(planted, "jwt-secret"), nobody)
	for name, err := range map[string]error{
		"data dir": func() error { _, err := embeddedDataDir(cfg, logger, true); return err }(),
		"secret":   func() error { _, _, err := tokenSecret(cfg, logger); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "uid "+strconv.Itoa(nobody)) {
			t.Errorf("%s: %v, want a refusal naming %s", name, err, planted)
		}
	}
	// And a base that is not root's own, even if empty.
	base3 := filepath.Join(pgtest.TempDir(t), "var-lib-registryd")
	mkdir(t, base3, 0o711)
	chown(t, base3, nobody)
	cfg.embedded.fallbackBase = base3
	if _, err := embeddedDataDir(cfg, logger, true); err == nil || !strings.Contains(err.Error(), base3+" belongs to uid") {
		t.Errorf("a base of another user: %v, want a refusal naming it", err)
	}
}

type fakeCluster struct {
	since time.Time
	down  bool
}

func (f fakeCluster) DownSince() (time.Time, bool) { return f.since, f.down }

// /healthz rides out a blip shorter than the grace period.
func TestHealthGrace(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	for _, tt := range []struct {
		c    fakeCluster
		fail bool
	}{
		{fakeCluster{}, false},
		{fakeCluster{since: now.Add(-9 * time.Second), down: true}, false},
		{fakeCluster{since: now.Add(-11 * time.Second), down: true}, true},
	} {
		err := healthCheck(tt.c, 0, clock)(context.Background())
		if (err != nil) != tt.fail {
			t.Errorf("%+v: %v, want failing %v", tt.c, err, tt.fail)
		}
	}
	if err := healthCheck(fakeCluster{since: now.Add(-2 * time.Second), down: true}, time.Second, clock)(context.Background()); err == nil {
		t.Error("a shorter grace period is not applied")
	}
}

// postmasterPid reads the pid of the running postmaster from its lock file,
// waiting (bounded) until it names a live one other than not.
func postmasterPid(t *testing.T, cluster string, not int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(cluster, "postmaster.pid"))
		if err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid != not && syscall.Kill(pid, 0) == nil {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live postmaster in %s: %v", cluster, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eventually polls a request every 50ms until it answers want, failing
// after limit.
func eventually(t *testing.T, limit time.Duration, want int, method, url string, token ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		code, body := call(t, method, url, "", token...)
		if code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %d %s after %s, want %d", method, url, code, body, limit, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The embedded PostgreSQL is supervised: killed (SIGKILL) or stopped
// (SIGINT) behind registryd's back, it is restarted and requests succeed
// again; /healthz fails while it stays down past the grace period; and when
// it cannot be brought back, serve exits with an error.
func TestServeEmbeddedSupervised(t *testing.T) {
	t.Parallel()
	data := filepath.Join(pgtest.TempDir(t), "data")
	cluster := filepath.Join(data, "postgres")
	cfg, err := loadConfig(envFunc(map[string]string{"REGISTRY_DATA_DIR": data, "REGISTRY_LISTEN": "127.0.0.1:0"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg.embedded.healthGrace = 200 * time.Millisecond
	cfg.embedded.supervise = pglocal.SuperviseOptions{Attempts: 10, Backoff: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	srv := startServing(t, func(ctx context.Context, stdout, stderr io.Writer) error {
		return serve(ctx, cfg, nil, stdout, stderr)
	})
	m := regexp.MustCompile(`export REGISTRY_TOKEN=(\S+)`).FindStringSubmatch(srv.stdout.String())
	if m == nil {
		t.Fatalf("no admin token printed:\n%s", srv.stdout.String())
	}
	tok := m[1]
	list := srv.url + "/v1/nodes/list"
	if code, body := call(t, "POST", list, "", tok); code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	eventually(t, 5*time.Second, 200, "GET", srv.url+"/healthz")

	// Killed outright, then stopped cleanly: back within 30 s each time.
	pid := postmasterPid(t, cluster, 0)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatal(err)
		}
		pid = postmasterPid(t, cluster, pid)
		eventually(t, 30*time.Second, 200, "POST", list, tok)
	}

	// Down for longer than the grace period: /healthz says so, and is 200
	// again once the restart succeeds.
	away := cluster + ".away"
	if err := os.Rename(cluster, away); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, 503, "GET", srv.url+"/healthz")
	if err := os.Rename(away, cluster); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, 200, "GET", srv.url+"/healthz")
	eventually(t, 30*time.Second, 200, "POST", list, tok)

	// Gone for good: serve gives up and run returns an error, so that
	// whatever supervises registryd can act.
	pid = postmasterPid(t, cluster, pid)
	if err := os.Rename(cluster, away); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Rename(away, cluster) })
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve still running 30 s after its database was lost for good")
	}
	if err := srv.stop(); err == nil || !strings.Contains(err.Error(), "could not be restarted") {
		t.Fatalf("serve returned %v, want an error saying the database could not be restarted", err)
	}
	if !strings.Contains(srv.stderr.String(), `"msg":"stopped"`) {
		t.Errorf("no orderly shutdown in the log:\n%s", srv.stderr.String())
	}
	if code, _ := callErr(srv.url + "/healthz"); code != 0 {
		t.Errorf("still answering HTTP after giving up: %d", code)
	}
}

// callErr is a GET that tolerates a refused connection (code 0).
func callErr(url string) (int, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
