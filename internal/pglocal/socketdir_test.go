package pglocal

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSocketDirLinkNotFollowed: the cluster directory belongs to the server
// user, so whatever sits at <DataDir>/run may be theirs. As root, Start
// chmods and chowns the socket directory; following a link planted there
// would hand any directory of the machine (/etc, /root/.ssh) to the
// postgres user. Start must refuse the link and leave its target alone.
func TestSocketDirLinkNotFollowed(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	base := reachableTempDir(t)
	dir := filepath.Join(base, "data")
	opts := Options{DataDir: dir, Ephemeral: true, Logger: testLogger(t)}
	c := start(t, opts)
	stop(t, c)

	victim := filepath.Join(base, "victim")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	if err := os.RemoveAll(run); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, run); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c2, err := Start(ctx, opts)
	if err == nil {
		t.Cleanup(func() { _ = c2.Stop(context.Background()) })
		t.Errorf("Start with %s a link to %s: no error", run, victim)
	} else if !strings.Contains(err.Error(), run) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Start with a linked socket dir: %v; want an error naming %s as not a directory", err, run)
	}
	after, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if after.Mode() != before.Mode() {
		t.Errorf("the link's target changed mode: %v → %v", before.Mode(), after.Mode())
	}
	if a, b := after.Sys().(*syscall.Stat_t), before.Sys().(*syscall.Stat_t); a.Uid != b.Uid || a.Gid != b.Gid {
		t.Errorf("the link's target changed owner: %d:%d → %d:%d", b.Uid, b.Gid, a.Uid, a.Gid)
	}
	if fi, err := os.Lstat(run); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link itself: %v, %v; want it left for its owner to look at", fi, err)
	}
}
