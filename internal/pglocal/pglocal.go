// Package pglocal starts a private PostgreSQL cluster from the server binaries
// installed on the machine, so the registry (and its tests) can run without a
// database server being set up by hand.
//
// The cluster listens only on a unix socket that only the server user may use
// (root can always connect), never on TCP, so several clusters can run side by
// side without port clashes or exposure to the network.
package pglocal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// port only names the socket file (.s.PGSQL.5432); there is no TCP
	// listener, so it never clashes with another server.
	port = 5432
	// maxSocketPath keeps the socket path under the kernel's sun_path limit
	// (108 bytes on Linux) with some margin.
	maxSocketPath = 100
	readyTimeout  = 30 * time.Second
	tailLines     = 200
	errorLines    = 20
)

// Options configures Start.
type Options struct {
	// DataDir is the cluster directory; created (initdb) when missing or
	// empty, reused when it holds a cluster (PG_VERSION exists).
	DataDir string
	// Database is created if missing after start; default "registry".
	Database string
	// Ephemeral is for throwaway test clusters: initdb --no-sync, and
	// postgres with fsync=off, synchronous_commit=off, full_page_writes=off.
	// Data survives a clean Stop but not a machine crash.
	Ephemeral bool
	// BinDir is the directory holding initdb and postgres; optional,
	// FindBinDir when empty.
	BinDir string
	// Logger receives progress messages and, at debug level, every line
	// the server prints; optional, nil means discard.
	Logger *slog.Logger
	// Settings are extra server settings (-c name=value), e.g.
	// max_connections. They override the Ephemeral ones but not the socket
	// settings, which URL depends on.
	Settings map[string]string
}

// Cluster is a running PostgreSQL server started by Start. Its methods are
// safe for concurrent use.
type Cluster struct {
	dataDir  string
	sockDir  string
	tempSock bool // sockDir was made by MkdirTemp and is ours to remove
	database string
	pgCtl    string
	postgres string   // the server binary
	args     []string // its command line, the same for every (re)start
	ra       runAs
	logger   *slog.Logger
	tail     *logTail

	mu        sync.Mutex
	srv       *server   // the current postmaster; Supervise replaces it
	stopping  bool      // Stop was called: no more restarts
	downSince time.Time // when Supervise saw the server die; zero while up

	stopMu  sync.Mutex
	stopped bool
	stopErr error
}

// server is one run of the postmaster.
type server struct {
	proc     *os.Process
	exited   chan struct{} // closed once the server has exited
	waitErr  error         // the server's exit status; read only after exited
	exitedAt time.Time     // read only after exited
	logDone  chan struct{} // closed once the server's output is drained
}

// Start initdbs if needed, starts postgres as a child process, waits until it
// accepts connections (poll with pgx connect, up to 30s; if the child exits
// early, return an error that includes the last ~20 lines of its log), creates
// Options.Database if missing, and returns.
//
// ctx bounds only the start-up; the server then runs until Stop, or until
// our process dies (the server gets SIGINT, i.e. a fast shutdown). The server
// runs in its own process group so that a Ctrl-C in the terminal reaches only
// us, and we can stop it in order.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.DataDir == "" {
		return nil, errors.New("pglocal: Options.DataDir is empty")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pglocal: data dir: %w", err)
	}
	c := &Cluster{
		dataDir:  dataDir,
		database: cmp.Or(opts.Database, "registry"),
		logger:   opts.Logger,
		tail:     &logTail{max: tailLines},
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	c.pgCtl = filepath.Join(binDir, "pg_ctl")
	c.postgres = filepath.Join(binDir, "postgres")
	ra, err := serverUser()
	if err != nil {
		return nil, err
	}
	c.ra = ra

	// Check before creating anything, so a refused path leaves no litter,
	// and again after: a restrictive umask can make the new parents 0700.
	if err := ra.checkAccess(dataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
		return nil, fmt.Errorf("pglocal: data dir parent: %w", err)
	}
	if err := ra.checkAccess(dataDir); err != nil {
		return nil, err
	}
	fresh, err := prepareDataDir(dataDir, ra)
	if err != nil {
		return nil, err
	}
	if fresh {
		c.logger.Info("pglocal: creating cluster", "dir", dataDir, "user", ra.name)
		if err := initdb(ctx, binDir, dataDir, opts.Ephemeral, ra); err != nil {
			return nil, err
		}
	} else if err := c.checkNotRunning(ra); err != nil {
		return nil, err
	}
	if err := c.makeSocketDir(ra); err != nil {
		return nil, err
	}

	c.args = serverArgs(dataDir, c.sockDir, opts.Ephemeral, opts.Settings)
	if c.srv, err = c.spawn(); err != nil {
		c.removeTempSocketDir()
		return nil, err
	}
	readyCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	err = c.waitReady(readyCtx, c.srv)
	cancel()
	if err == nil {
		err = c.createDatabase(ctx)
	}
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx) // the start-up error is the one worth reporting
		return nil, err
	}
	c.logger.Info("pglocal: cluster ready", "dir", dataDir, "url", c.URL())
	return c, nil
}

// prepareDataDir reports whether dir needs an initdb, creating it if missing.
// A non-empty directory without PG_VERSION is refused: it holds someone's
// files, and initdb (or its cleanup on failure) must not touch them.
func prepareDataDir(dir string, ra runAs) (fresh bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return false, nil
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(dir, 0o700); err != nil {
			return false, fmt.Errorf("pglocal: data dir: %w", err)
		}
	case err != nil:
		return false, fmt.Errorf("pglocal: data dir: %w", err)
	case len(entries) > 0:
		return false, fmt.Errorf("pglocal: data dir %s is not empty but holds no PostgreSQL cluster (no PG_VERSION); "+
			"refusing to initdb over its files: choose an empty or new directory", dir)
	}
	// Mkdir is subject to the umask and an existing empty dir may have any
	// mode; initdb and postgres insist on 0700 owned by the server user.
	if err := errors.Join(os.Chmod(dir, 0o700), ra.chown(dir)); err != nil {
		return false, fmt.Errorf("pglocal: data dir: %w", err)
	}
	return true, nil
}

func initdb(ctx context.Context, binDir, dataDir string, ephemeral bool, ra runAs) error {
	args := []string{"-D", dataDir, "--username=postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"}
	if ephemeral {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
	// Our working directory may be one the server user cannot enter.
	cmd.Dir = dataDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: ra.cred}
	// On cancellation, interrupt first so initdb removes what it wrote.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pglocal: initdb: %w\n%s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkNotRunning refuses to start on a data dir another live postmaster
// owns. A lock file naming a dead or unrelated process is left alone:
// postgres recognises such stale lock files and replaces them itself. The
// error gives no advice to stop that server: it may well be the database
// of a live registryd, whose caller knows better (see Running).
func (c *Cluster) checkNotRunning(runAs) error {
	if pid, ok := Running(c.dataDir); ok {
		return fmt.Errorf("pglocal: another PostgreSQL (pid %d) is already running on %s", pid, c.dataDir)
	}
	return nil
}

// Running reports whether a live postmaster holds the cluster directory
// dataDir, by its lock file (postmaster.pid), and its pid.
func Running(dataDir string) (pid int, ok bool) {
	data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false // no lock file (or unreadable: postgres will say so)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 || !isPostgres(pid) {
		return 0, false
	}
	return pid, true
}

// isPostgres reports whether pid is alive and is a postgres process, so a
// pid recycled by some unrelated program does not block us.
func isPostgres(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return false
	}
	name := strings.TrimSpace(string(comm))
	return name == "postgres" || name == "postmaster"
}

// makeSocketDir picks <DataDir>/run, or a fresh temporary directory when a
// socket path there would be too long for a unix socket address.
func (c *Cluster) makeSocketDir(ra runAs) error {
	dir := filepath.Join(c.dataDir, "run")
	if len(filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(port))) < maxSocketPath {
		if err := makeRunDir(c.dataDir, "run", ra); err != nil {
			return fmt.Errorf("pglocal: socket dir: %w", err)
		}
		c.sockDir = dir
		return nil
	}
	dir, err := os.MkdirTemp("", "pgsock")
	if err != nil {
		return fmt.Errorf("pglocal: socket dir: %w", err)
	}
	c.tempSock = true
	c.sockDir = dir
	err = errors.Join(os.Chmod(dir, 0o700), ra.chown(dir))
	if err == nil {
		err = ra.checkAccess(dir) // $TMPDIR may point somewhere the server user cannot reach
	}
	if err != nil {
		c.removeTempSocketDir()
		return fmt.Errorf("pglocal: socket dir: %w", err)
	}
	return nil
}

// makeRunDir makes name in the cluster directory dataDir a directory of
// the server user's, mode 0700. The cluster directory belongs to the server
// user, who may have put anything at name: a link there must not make us
// (root) chmod and chown its target, which could be any directory of the
// machine. So only a real directory is accepted, and it is changed through
// an os.Root of dataDir, through which no link (even one swapped in after
// the check) leads outside the cluster directory.
func makeRunDir(dataDir, name string, ra runAs) error {
	root, err := os.OpenRoot(dataDir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%v); remove it and start again",
			filepath.Join(dataDir, name), fi.Mode().Type())
	}
	err = root.Chmod(name, 0o700)
	if ra.cred != nil {
		err = errors.Join(err, root.Chown(name, int(ra.uid), int(ra.gid)))
	}
	return err
}

func (c *Cluster) removeTempSocketDir() error {
	if !c.tempSock {
		return nil
	}
	return os.RemoveAll(c.sockDir)
}

// serverArgs builds the postgres command line. Later -c options win, so the
// socket-only settings come last: URL relies on them.
func serverArgs(dataDir, sockDir string, ephemeral bool, settings map[string]string) []string {
	args := []string{"-D", dataDir}
	set := func(name, value string) { args = append(args, "-c", name+"="+value) }
	if ephemeral {
		set("fsync", "off")
		set("synchronous_commit", "off")
		set("full_page_writes", "off")
	}
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		set(name, settings[name])
	}
	set("listen_addresses", "")
	set("port", strconv.Itoa(port))
	// Double-quoted so a path with commas or spaces stays one directory.
	set("unix_socket_directories", `"`+strings.ReplaceAll(sockDir, `"`, `""`)+`"`)
	set("unix_socket_permissions", "0700")
	return args
}

// spawn starts the server with its output piped into c.tail.
func (c *Cluster) spawn() (*server, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pglocal: start postgres: %w", err)
	}
	cmd := exec.Command(c.postgres, c.args...)
	cmd.Dir = c.dataDir
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  syscall.SIGINT,
		Credential: c.ra.cred,
	}
	s := &server{exited: make(chan struct{}), logDone: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the OS *thread* that forked the child exits,
		// not our process (go.dev/issue/27505). Holding this thread for the
		// server's lifetime keeps the runtime from retiring it under us.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.waitErr = cmd.Wait()
		s.exitedAt = time.Now()
		close(s.exited)
	}()
	err = <-started
	w.Close() // the child holds its own copy; ours would keep the pipe from reaching EOF
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("pglocal: start postgres: %w", err)
	}
	s.proc = cmd.Process
	go func() {
		defer close(s.logDone)
		c.tail.follow(r, c.logger)
	}()
	return s, nil
}

// waitReady polls until the server accepts connections, it exits, or ctx
// ends.
func (c *Cluster) waitReady(ctx context.Context, s *server) error {
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, c.URLFor("postgres"))
		cancelAttempt()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited:
			s.drainLog(time.Second)
			return fmt.Errorf("pglocal: postgres exited during start-up (%v); last log lines:\n%s",
				s.waitErr, c.tail.last(errorLines))
		case <-ctx.Done():
			return fmt.Errorf("pglocal: postgres not accepting connections (%w; last attempt: %v); last log lines:\n%s",
				ctx.Err(), err, c.tail.last(errorLines))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) createDatabase(ctx context.Context) error {
	if c.database == "postgres" {
		return nil
	}
	conn, err := pgx.Connect(ctx, c.URLFor("postgres"))
	if err != nil {
		return fmt.Errorf("pglocal: create database: %w", err)
	}
	defer conn.Close(context.Background())
	var exists int
	err = conn.QueryRow(ctx, "SELECT 1 FROM pg_database WHERE datname = $1", c.database).Scan(&exists)
	if errors.Is(err, pgx.ErrNoRows) {
		c.logger.Info("pglocal: creating database", "name", c.database)
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{c.database}.Sanitize())
	}
	if err != nil {
		return fmt.Errorf("pglocal: create database %q: %w", c.database, err)
	}
	return nil
}

// URL is the pgx connection URL for Options.Database over the unix socket,
// e.g. postgres://postgres@/registry?host=%2Ftmp%2F...&port=5432&sslmode=disable.
// The port is explicit so a PGPORT in the environment cannot redirect it.
func (c *Cluster) URL() string {
	return c.URLFor(c.database)
}

// URLFor is URL for another database in the same cluster.
func (c *Cluster) URLFor(db string) string {
	return "postgres://postgres@/" + uriEscape(db) +
		"?host=" + uriEscape(c.sockDir) + "&port=" + strconv.Itoa(port) + "&sslmode=disable"
}

// uriEscape percent-encodes everything but unreserved characters. Neither
// url.QueryEscape (turns spaces into '+', which libpq-style parsers keep
// literally) nor url.PathEscape (keeps '&' and '=') is right for both places.
func uriEscape(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || strings.IndexByte("-._~", ch) >= 0 {
			b.WriteByte(ch)
		} else {
			b.WriteByte('%')
			b.WriteByte(hex[ch>>4])
			b.WriteByte(hex[ch&15])
		}
	}
	return b.String()
}

// DataDir is the absolute path of the cluster directory.
func (c *Cluster) DataDir() string {
	return c.dataDir
}

// Stop shuts the server down with a fast shutdown (SIGINT to the postmaster:
// sessions are cut, data is written out cleanly) and waits for it to exit. If
// ctx ends first it escalates to SIGQUIT (immediate shutdown, crash recovery
// on next start) and finally kills the whole process group. It is idempotent:
// later calls return the first call's result. It also removes a temporary
// socket directory if Start made one. Once Stop is called, Supervise
// restarts nothing.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	c.mu.Lock()
	c.stopping = true
	s := c.srv
	c.mu.Unlock()
	err := c.stop(ctx, s)
	s.drainLog(2 * time.Second)
	if rmErr := c.removeTempSocketDir(); rmErr != nil && err == nil {
		err = fmt.Errorf("pglocal: stop: %w", rmErr)
	}
	c.stopErr = err
	return err
}

func (c *Cluster) stop(ctx context.Context, s *server) error {
	select {
	case <-s.exited:
		// It died on its own; backends it left behind go too.
		_ = killServer(c.dataDir, 5*time.Second)
		return c.exitError(s)
	default:
	}
	// Errors mean the process is already gone; s.exited will tell.
	_ = s.proc.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
		return c.exitError(s)
	case <-ctx.Done():
	}
	c.logger.Warn("pglocal: fast shutdown timed out; sending SIGQUIT", "dir", c.dataDir)
	_ = s.proc.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.proc.Kill()
		_ = killServer(c.dataDir, 5*time.Second) // its backends too
		<-s.exited
	}
	return fmt.Errorf("pglocal: stop: postgres did not shut down in time and was forced: %w", ctx.Err())
}

func (c *Cluster) exitError(s *server) error {
	if s.waitErr == nil {
		return nil
	}
	s.drainLog(time.Second)
	return fmt.Errorf("pglocal: postgres exited: %w; last log lines:\n%s", s.waitErr, c.tail.last(errorLines))
}

// drainLog waits (briefly) until the server's output has been read to the
// end, so error messages include its last words and no log line is emitted
// after Stop returns.
func (s *server) drainLog(limit time.Duration) {
	select {
	case <-s.logDone:
	case <-time.After(limit):
	}
}
