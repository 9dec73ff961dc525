package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pglocal"
)

// The embedded PostgreSQL of a data folder is shared by every command run
// on that folder. Two files in it, each locked with flock (so a registryd
// that dies, however it dies, leaves no claim behind: the kernel drops its
// locks with its last descriptor), say who uses it:
//
//   - ownerFile is locked exclusively by the one process that runs the
//     cluster (its child, which dies with it), for as long as it runs. It
//     holds that process's pid, its command and, once the cluster accepts
//     connections, the cluster's URL.
//   - usersFile is locked shared by every other command connected to that
//     cluster. An owner locks it exclusively before stopping the cluster,
//     so it waits for them to finish; it unlocks ownerFile before
//     usersFile, so a command that holds its shared lock and sees ownerFile
//     locked knows the cluster is not being stopped under it.
//
// A command takes its shared lock first, then tries ownerFile: locked, it
// connects to the URL there (waiting while the owner is still starting);
// free, it becomes the owner and starts the cluster itself. Two commands
// starting at once cannot both own it. `serve` refuses when another serve
// owns it, and waits for a one-shot command that owns it to finish.
const (
	ownerFile = "registryd.pid"
	usersFile = "registryd.users"
)

// defaultEmbeddedWait bounds how long a command waits for its turn on the
// embedded PostgreSQL (REGISTRY_EMBEDDED_WAIT).
const defaultEmbeddedWait = time.Minute

// ownerInfo is what ownerFile holds.
type ownerInfo struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
	URL     string `json:"url,omitempty"` // set once the cluster accepts connections
}

func (o ownerInfo) String() string {
	return fmt.Sprintf("`registryd %s` (pid %d)", o.Command, o.PID)
}

// embeddedClaim is one command's use of the embedded PostgreSQL.
type embeddedClaim struct {
	dir     string // the data folder
	command string
	wait    time.Duration
	logger  *slog.Logger
	owner   *os.File // ownerFile; locked when we own the cluster
	users   *os.File // usersFile; locked shared while we use another's cluster
	owned   bool
	cluster *pglocal.Cluster // ours, once started
	url     string
	done    bool
}

// errServeRunning is the refusal of a second serve.
type errServeRunning struct {
	owner ownerInfo
	dir   string
}

func (e *errServeRunning) Error() string {
	return fmt.Sprintf("%s is already serving from this data folder (REGISTRY_DATA_DIR=%s); a second serve on the same data is refused: "+
		"use that one, or set REGISTRY_DATA_DIR to another folder for a second registry", e.owner, e.dir)
}

// claimEmbedded takes the data folder's embedded PostgreSQL for command:
// either the cluster of a registryd already running it (url set), or the
// right to start it (owned). serve (command "serve") never shares: it
// refuses at once when another serve owns the cluster and waits, up to
// cfg.EmbeddedWait, for another command to finish with it.
func claimEmbedded(ctx context.Context, cfg config, logger *slog.Logger, command string) (*embeddedClaim, error) {
	if _, err := pglocal.FindBinDir(); err != nil {
		return nil, err
	}
	dir, err := embeddedDataDir(cfg, logger, true)
	if err != nil {
		return nil, err
	}
	// Only serve makes the token secret; the others refuse one anyone else
	// could have planted, as serve would.
	if _, err := auth.LoadSecret(filepath.Join(dir, "jwt-secret")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("token secret: %w (or set REGISTRY_DATA_DIR to a directory of your own)", err)
	}
	c := &embeddedClaim{dir: dir, command: command, wait: cfg.EmbeddedWait, logger: logger}
	if c.wait <= 0 {
		c.wait = defaultEmbeddedWait
	}
	if c.owner, err = openLockFile(filepath.Join(dir, ownerFile)); err != nil {
		return nil, err
	}
	if c.users, err = openLockFile(filepath.Join(dir, usersFile)); err != nil {
		c.owner.Close()
		return nil, err
	}
	if err := c.take(ctx); err != nil {
		c.owner.Close()
		c.users.Close()
		return nil, err
	}
	return c, nil
}

// serveRunning returns an *errServeRunning when a serve runs the data
// folder's embedded PostgreSQL, and nil otherwise; it creates nothing.
func serveRunning(cfg config, logger *slog.Logger) error {
	dir, err := embeddedDataDir(cfg, logger, false)
	if err != nil {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, ownerFile), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		return nil // not held: no registryd runs it
	}
	if info, ok := (&embeddedClaim{owner: f}).readInfo(); ok && info.Command == "serve" {
		return &errServeRunning{owner: info, dir: dir}
	}
	return nil
}

func (c *embeddedClaim) take(ctx context.Context) error {
	deadline := time.Now().Add(c.wait)
	serve := c.command == "serve"
	if !serve {
		if err := flockWait(ctx, c.users, syscall.LOCK_SH, deadline); err != nil {
			return c.waitError(err, "for a registryd stopping the embedded PostgreSQL")
		}
	}
	said := false
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		err := syscall.Flock(int(c.owner.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			c.owned = true
			return c.writeInfo(ownerInfo{PID: os.Getpid(), Command: c.command})
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", c.owner.Name(), err)
		}
		info, ok := c.readInfo()
		switch {
		case ok && serve && info.Command == "serve":
			return &errServeRunning{owner: info, dir: c.dir}
		case ok && !serve && info.URL != "":
			c.url = info.URL
			c.logger.Info("using the embedded PostgreSQL of a running registryd", "owner", info.String(), "data_dir", c.dir)
			return nil
		case ok && !said:
			said = true
			if serve {
				c.logger.Info("waiting for another registryd command to finish with the embedded PostgreSQL",
					"owner", info.String(), "data_dir", c.dir, "at_most", c.wait.String())
			} else {
				c.logger.Info("waiting for the embedded PostgreSQL to start", "owner", info.String(), "data_dir", c.dir)
			}
		}
		if time.Now().After(deadline) {
			what := "to start the embedded PostgreSQL"
			if serve {
				what = "to finish with the embedded PostgreSQL"
			}
			if ok {
				what = info.String() + " " + what
			}
			return fmt.Errorf("waited %s (REGISTRY_EMBEDDED_WAIT) for %s in %s; try again later", c.wait, what, c.dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}

func (c *embeddedClaim) waitError(err error, what string) error {
	if errors.Is(err, errWaitedTooLong) {
		return fmt.Errorf("waited %s (REGISTRY_EMBEDDED_WAIT) %s in %s; try again later", c.wait, what, c.dir)
	}
	return err
}

// start starts the cluster when we own it, and returns its URL.
func (c *embeddedClaim) start(ctx context.Context) (string, error) {
	if !c.owned || c.cluster != nil {
		return c.url, nil
	}
	cluster := filepath.Join(c.dir, "postgres")
	// A postmaster nobody owns: that of a registryd killed a moment ago
	// (it got SIGINT with its parent's death and is shutting down), or
	// one started by hand. Give the first time to go; the second is not
	// ours to stop.
	deadline := time.Now().Add(min(c.wait, 15*time.Second))
	for {
		pid, running := pglocal.Running(cluster)
		if !running {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("a PostgreSQL server (pid %d) that no running registryd started is using %s; "+
				"registryd does not start a second server on the same data: wait until it has exited, or set REGISTRY_DATA_DIR to another folder", pid, cluster)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.logger.Info("starting embedded PostgreSQL", "data_dir", c.dir)
	cl, err := pglocal.Start(ctx, pglocal.Options{DataDir: cluster, Database: "registry", Logger: c.logger})
	if err != nil {
		return "", err
	}
	c.cluster, c.url = cl, cl.URL()
	if err := c.writeInfo(ownerInfo{PID: os.Getpid(), Command: c.command, URL: c.url}); err != nil {
		return "", err
	}
	return c.url, nil
}

// release ends the claim. An owner waits (up to the claim's wait) for the
// commands using its cluster to finish, then stops it; others just leave.
// Idempotent.
func (c *embeddedClaim) release(ctx context.Context) {
	if c == nil || c.done {
		return
	}
	c.done = true
	defer c.users.Close()
	defer c.owner.Close() // before users: see the comment on usersFile
	if c.cluster == nil {
		return
	}
	_ = syscall.Flock(int(c.users.Fd()), syscall.LOCK_UN)
	if syscall.Flock(int(c.users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		c.logger.Info("waiting for other registryd commands using the embedded PostgreSQL to finish before stopping it",
			"data_dir", c.dir, "at_most", c.wait.String())
	}
	// Even when stopping on a signal (ctx is cancelled then): bounded.
	if err := flockWait(context.WithoutCancel(ctx), c.users, syscall.LOCK_EX, time.Now().Add(c.wait)); err != nil {
		c.logger.Warn("other registryd commands still use the embedded PostgreSQL; stopping it anyway", "data_dir", c.dir, "err", err)
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.cluster.Stop(stopCtx); err != nil {
		c.logger.Error("stop embedded PostgreSQL", "err", err)
	}
	// Left with the next owner's pid in it, the file would mislead no one
	// (only a locked one is read), but an empty one is clearer.
	_ = c.owner.Truncate(0)
}

// writeInfo replaces ownerFile's content; readers take a partial one for
// none and read again.
func (c *embeddedClaim) writeInfo(info ownerInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if err := c.owner.Truncate(0); err != nil {
		return fmt.Errorf("write %s: %w", c.owner.Name(), err)
	}
	if _, err := c.owner.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("write %s: %w", c.owner.Name(), err)
	}
	return nil
}

func (c *embeddedClaim) readInfo() (ownerInfo, bool) {
	b := make([]byte, 4096)
	n, _ := c.owner.ReadAt(b, 0)
	var info ownerInfo
	if n == 0 || b[n-1] != '\n' || json.Unmarshal(b[:n], &info) != nil || info.PID <= 0 {
		return ownerInfo{}, false
	}
	return info, true
}

// openLockFile opens (creating) a lock file in the data folder, which is
// private (checked before): still, only a regular file of ours is taken.
func openLockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file; remove it", path)
	}
	if err == nil {
		err = auth.CheckPrivate(path, fi, 0o077)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file: %w", err)
	}
	return f, nil
}

var errWaitedTooLong = errors.New("waited too long")

// flockWait takes the lock how (LOCK_SH or LOCK_EX) on f, trying again
// with a growing pause (at most 200ms) until deadline or ctx ends: a
// blocking flock could not be abandoned at the deadline.
func flockWait(ctx context.Context, f *os.File, how int, deadline time.Time) error {
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			return errWaitedTooLong
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}
