package pglocal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A throwaway directory holds a test's cluster. Its owner removes it when
// done, but a test binary that dies (a `go test -timeout` panic, SIGKILL)
// never gets to, so the name records who made it: prefix + pid + "-" +
// start time + "-" + random. The start time tells a live owner from a
// later process that got the same pid.

// legacyAge is how old a throwaway directory of an older naming (no owner
// in its name) must be before a sweep may remove it.
const legacyAge = time.Hour

// MkdirThrowaway makes a fresh directory under the system temp dir, mode
// 0755 so the server user can pass through to a cluster inside, named
// after this process so that SweepThrowaway can tell when it is left over.
func MkdirThrowaway(prefix string) (string, error) {
	me, err := readProcStat(os.Getpid())
	if err != nil {
		return "", fmt.Errorf("pglocal: throwaway dir: %w", err)
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-%d-", prefix, os.Getpid(), me.start))
	if err != nil {
		return "", fmt.Errorf("pglocal: throwaway dir: %w", err)
	}
	// MkdirTemp makes 0700, which the server user cannot enter when we are
	// root.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("pglocal: throwaway dir: %w", err)
	}
	if err := removeWhenGone(dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("pglocal: throwaway dir: %w", err)
	}
	return dir, nil
}

// watchdogScript waits until process $1 is gone, then gives a server in
// directory $2 (stopping by itself: Pdeathsig) up to 30 s to remove its
// postmaster.pid, and removes the directory.
const watchdogScript = `while kill -0 "$1" 2>/dev/null; do sleep 1; done
i=0
while [ $i -lt 30 ] && [ -n "$(find "$2" -name postmaster.pid -print 2>/dev/null | head -n 1)" ]; do sleep 1; i=$((i+1)); done
rm -rf -- "$2"`

// removeWhenGone starts a watchdog that removes dir once this process has
// exited, however it ends: a test binary killed by `go test -timeout` or
// SIGKILL runs none of its cleanups. The watchdog runs in a session of its
// own (a kill of our process group spares it) and holds none of our output
// pipes (go test would wait for them to close). SweepThrowaway remains for
// what a watchdog could not remove (a machine that went down meanwhile).
func removeWhenGone(dir string) error {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "registryd-throwaway-watchdog", strconv.Itoa(os.Getpid()), dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start watchdog: %w", err)
	}
	// It ends only after we do (or if someone kills it, leaving a zombie
	// until we exit), so nothing here waits for it.
	return cmd.Process.Release()
}

// SweepThrowaway removes the directories MkdirThrowaway made with prefix
// under the system temp dir whose owning process is gone, first killing
// any server still running in them. Directories of live owners are left
// alone, as are directories of an older naming (no owner recorded) unless
// no server runs in them and they have not changed for an hour. It returns
// what it removed; a directory it could not remove is reported in err and
// the sweep goes on.
func SweepThrowaway(prefix string) (removed []string, err error) {
	return sweepThrowaway(os.TempDir(), prefix, time.Now())
}

func sweepThrowaway(tmp, prefix string, now time.Time) (removed []string, err error) {
	matches, _ := filepath.Glob(filepath.Join(tmp, prefix+"*")) // only ErrBadPattern
	var errs []error
	for _, dir := range matches {
		fi, lerr := os.Lstat(dir)
		if lerr != nil || !fi.IsDir() {
			continue // gone meanwhile, or not ours (a symlink, a file)
		}
		if !leftOver(dir, strings.TrimPrefix(filepath.Base(dir), prefix), fi, now) {
			continue
		}
		if killErr := killServersIn(dir); killErr != nil {
			errs = append(errs, killErr)
			continue
		}
		if rmErr := os.RemoveAll(dir); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("pglocal: sweep: %w", rmErr))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// leftOver decides from rest, the part of dir's name after the prefix,
// whether its owner is gone.
func leftOver(dir, rest string, fi fs.FileInfo, now time.Time) bool {
	parts := strings.Split(rest, "-")
	if len(parts) != 3 {
		// No owner in the name: an older naming. Only old and idle
		// directories are taken, so that a run of an older build going on
		// right now keeps its own.
		return now.Sub(fi.ModTime()) > legacyAge && !serverRunningIn(dir)
	}
	pid, err1 := strconv.Atoi(parts[0])
	start, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return false // not a name MkdirThrowaway makes
	}
	st, err := readProcStat(pid)
	return err != nil || st.start != start
}

func serverRunningIn(dir string) bool {
	for _, data := range clustersIn(dir) {
		if len(serverProcesses(data)) > 0 {
			return true
		}
	}
	return false
}

// killServersIn SIGKILLs every postgres still running on a cluster inside
// dir (a throwaway cluster needs no clean shutdown) and waits until it is
// gone.
func killServersIn(dir string) error {
	for _, data := range clustersIn(dir) {
		if err := killServer(data, 10*time.Second); err != nil {
			return fmt.Errorf("pglocal: sweep %s: %w", dir, err)
		}
	}
	return nil
}

// clustersIn lists the cluster directories (those holding PG_VERSION) at
// most three levels below dir: a cluster is dir/data or dir/data/postgres.
func clustersIn(dir string) []string {
	var dirs []string
	for _, pattern := range []string{"*", "*/*", "*/*/*"} {
		files, _ := filepath.Glob(filepath.Join(dir, pattern, "PG_VERSION"))
		for _, f := range files {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	return dirs
}
