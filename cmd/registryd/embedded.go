package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pglocal"
)

// fallbackBase is where a root-run embedded default keeps its data when the
// postgres user cannot enter the checkout: a root-owned place in which
// nobody else can create anything.
const fallbackBase = "/var/lib/registryd"

// defaultHealthGrace is how long the embedded PostgreSQL may be down before
// /healthz fails: long enough for a restart, so a liveness probe does not
// kill a process that is recovering by itself.
const defaultHealthGrace = 10 * time.Second

// embeddedTuning adjusts the embedded default for tests; it is not loaded
// from the environment, and its zero value means the defaults.
type embeddedTuning struct {
	fallbackBase string        // instead of fallbackBase
	healthGrace  time.Duration // instead of defaultHealthGrace
	supervise    pglocal.SuperviseOptions
}

// privateDir makes sure dir exists, belongs to the user we run as and is
// closed to other users' writes, creating it with mode (its parents 0755)
// when missing. An existing directory is never adopted or repaired
// silently: if someone else owns it or may write in it, it could hold their
// token secret or their database, so the error names it and the fix.
func privateDir(dir string, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	switch err := os.Mkdir(dir, mode); {
	case err == nil:
		if err := os.Chmod(dir, mode); err != nil { // Mkdir is subject to the umask
			return fmt.Errorf("create data directory: %w", err)
		}
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("create data directory: %w", err)
	}
	return checkPrivateDir(dir)
}

// checkPrivateDir is privateDir's check of an existing directory; a
// missing one is an error wrapping fs.ErrNotExist.
func checkPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		// A link is followed only if it is ours: one in a directory others
		// may write (/tmp) can be an attacker's, pointing wherever they
		// like, today or later.
		if err := auth.CheckPrivate(dir, fi, 0); err != nil {
			return fmt.Errorf("data directory is a symbolic link: %w (or set REGISTRY_DATA_DIR to a directory of your own)", err)
		}
		if fi, err = os.Stat(dir); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
	}
	if !fi.IsDir() {
		return fmt.Errorf("data directory %s is not a directory; set REGISTRY_DATA_DIR to another place", dir)
	}
	if err := auth.CheckPrivate(dir, fi, 0o022); err != nil {
		return fmt.Errorf("data directory: %w (or set REGISTRY_DATA_DIR to a directory of your own)", err)
	}
	return nil
}

// superviseEmbedded restarts the embedded PostgreSQL whenever it dies while
// serve runs (pglocal.Cluster.Supervise). failed yields an error if it
// could not be brought back, and serve must then exit non-zero so that
// whatever supervises registryd can act. stop ends the supervision and
// waits for it; call it before stopping the cluster. With an external
// database, failed never yields and stop does nothing.
func superviseEmbedded(ctx context.Context, db *database, tune embeddedTuning) (failed <-chan error, stop func()) {
	if db.cluster == nil {
		return nil, func() {}
	}
	fail := make(chan error, 1)
	return fail, lifecycle.Go(ctx, func(ctx context.Context) {
		if err := db.cluster.Supervise(ctx, tune.supervise); err != nil {
			fail <- err
		}
	})
}

// downSincer is what embeddedHealth asks of the cluster.
type downSincer interface {
	DownSince() (since time.Time, down bool)
}

// embeddedHealth is /healthz's check with the embedded default: it fails
// once the cluster has been down for longer than the grace period. Nil
// (always healthy) for an external database, whose outages /readyz reports
// and which a restart of registryd would not cure.
func embeddedHealth(c *pglocal.Cluster, grace time.Duration) func(context.Context) error {
	if c == nil {
		return nil
	}
	return healthCheck(c, grace, time.Now)
}

func healthCheck(c downSincer, grace time.Duration, now func() time.Time) func(context.Context) error {
	if grace <= 0 {
		grace = defaultHealthGrace
	}
	return func(context.Context) error {
		if since, down := c.DownSince(); down && now().Sub(since) > grace {
			return fmt.Errorf("embedded PostgreSQL down for %s", now().Sub(since).Round(time.Second))
		}
		return nil
	}
}
