package pglocal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// This file holds what tests of outages and failover need beyond Start and
// Stop: a streaming standby of a running cluster, its promotion, and the
// shutdown modes an operator (or a crash) uses. They run the server's own
// tools (pg_basebackup, pg_ctl) as the user that runs the server.

// SocketDir is the directory holding the cluster's unix socket: the host of
// a libpq-style URL, e.g. one element of a multi-host list.
func (c *Cluster) SocketDir() string { return c.sockDir }

// BaseBackup copies the running cluster into dataDir (which must not exist
// or be empty) as a streaming-replication standby: pg_basebackup -R over the
// cluster's socket, which writes standby.signal and primary_conninfo. Start
// the standby with Start on dataDir; it gets a socket directory of its own.
//
// The cluster needs nothing special for this: PostgreSQL 15 defaults to
// wal_level=replica with max_wal_senders=10, and initdb --auth=trust lets
// local replication connections in.
func (c *Cluster) BaseBackup(ctx context.Context, dataDir string) error {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("pglocal: base backup: %w", err)
	}
	ra, err := serverUser()
	if err != nil {
		return err
	}
	if err := ra.checkAccess(dataDir); err != nil {
		return err
	}
	if _, err := prepareDataDir(dataDir, ra); err != nil {
		return err
	}
	binDir, err := FindBinDir()
	if err != nil {
		return err
	}
	// --checkpoint=fast: do not wait for the next scheduled checkpoint.
	// -X stream: the WAL written during the copy comes along.
	if err := runTool(ctx, ra, dataDir, filepath.Join(binDir, "pg_basebackup"),
		"-D", dataDir, "-h", c.sockDir, "-p", strconv.Itoa(port), "-U", "postgres",
		"-R", "-X", "stream", "--checkpoint=fast", "--no-sync"); err != nil {
		return fmt.Errorf("pglocal: base backup: %w", err)
	}
	// The primary keeps its socket under its data directory, so the copy
	// holds the primary's socket lock file (sockets themselves are
	// skipped). Left there, the standby would take it for a live server on
	// its own socket and refuse to start.
	if err := os.RemoveAll(filepath.Join(dataDir, "run")); err != nil {
		return fmt.Errorf("pglocal: base backup: %w", err)
	}
	return nil
}

// Promote ends recovery on a standby (pg_ctl promote) and waits until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	return c.pgCtlRun(ctx, "promote", "-w", "-t", "60")
}

// StopMode shuts the server down with pg_ctl stop -m mode: "fast" cuts the
// sessions and writes a checkpoint, "immediate" quits at once (as a crash
// would: recovery runs at the next start). It then waits until the process
// has exited and the Cluster is stopped; the data directory stays, ready
// for Start.
func (c *Cluster) StopMode(ctx context.Context, mode string) error {
	if mode != "smart" && mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pglocal: stop mode %q: want smart, fast or immediate", mode)
	}
	if err := c.pgCtlRun(ctx, "stop", "-m", mode, "-w", "-t", "60"); err != nil {
		return err
	}
	// The postmaster has exited; Stop only collects it. An immediate
	// shutdown may report a non-zero status, which is what was asked for.
	if err := c.Stop(ctx); err != nil && mode != "immediate" {
		return err
	}
	return nil
}

func (c *Cluster) pgCtlRun(ctx context.Context, args ...string) error {
	ra, err := serverUser()
	if err != nil {
		return err
	}
	binDir, err := FindBinDir()
	if err != nil {
		return err
	}
	args = append([]string{"-D", c.dataDir}, args...)
	if err := runTool(ctx, ra, c.dataDir, filepath.Join(binDir, "pg_ctl"), args...); err != nil {
		return fmt.Errorf("pglocal: pg_ctl %s: %w", args[2], err)
	}
	return nil
}

// runTool runs one of the server's programs as the server user and returns
// its output in the error when it fails.
func runTool(ctx context.Context, ra runAs, dir, path string, args ...string) error {
	cmd := exec.CommandContext(ctx, path, args...)
	// Our working directory may be one the server user cannot enter.
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: ra.cred}
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return nil
}
