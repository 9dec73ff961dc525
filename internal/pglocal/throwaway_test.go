package pglocal

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakePostgres starts a process whose name is "postgres" (a copy of sleep)
// working in dir, in a process group of its own as every postgres process
// is. It is reaped when the test ends.
func fakePostgres(t *testing.T, binDir, dir string) *exec.Cmd {
	t.Helper()
	bin := filepath.Join(binDir, "postgres")
	if _, err := os.Stat(bin); err != nil {
		sleep, err := exec.LookPath("sleep")
		if err != nil {
			t.Skip(err)
		}
		b, err := os.ReadFile(sleep)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "60")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// killedWithin waits (bounded) for cmd and reports whether SIGKILL ended it.
func killedWithin(t *testing.T, cmd *exec.Cmd, limit time.Duration) bool {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	case <-time.After(limit):
		return false
	}
}

// cluster makes dir look like a cluster directory.
func cluster(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "PG_VERSION"), []byte("15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Leftovers of dead test processes are swept, a server still running in
// one is killed first, and whatever belongs to a live process (or is not
// ours to judge) stays.
func TestSweepThrowaway(t *testing.T) {
	t.Parallel()
	tmp, bin := t.TempDir(), t.TempDir()
	const prefix = "registryd-pgtest-"
	me, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Skip(err)
	}
	deadPid := exited.Process.Pid
	mk := func(name string) string {
		t.Helper()
		dir := filepath.Join(tmp, prefix+name)
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dead := mk(fmt.Sprintf("%d-%d-11", deadPid, me.start))
	reused := mk(fmt.Sprintf("%d-%d-12", os.Getpid(), me.start+1)) // our pid, another start: a dead owner whose pid we got
	live := mk(fmt.Sprintf("%d-%d-13", os.Getpid(), me.start))
	oddName := mk("not-an-owner-14")

	// A dead owner's cluster whose server still runs, backends and all.
	running := mk(fmt.Sprintf("%d-%d-15", deadPid, me.start))
	cluster(t, filepath.Join(running, "data"))
	postmaster := fakePostgres(t, bin, filepath.Join(running, "data"))
	backend := fakePostgres(t, bin, filepath.Join(running, "data"))

	// Older naming, no owner: taken only when idle for long and serverless.
	legacyOld, legacyNew, legacyBusy := mk("111"), mk("222"), mk("333")
	long := time.Now().Add(-2 * legacyAge)
	for _, d := range []string{legacyOld, legacyBusy} {
		if err := os.Chtimes(d, long, long); err != nil {
			t.Fatal(err)
		}
	}
	cluster(t, filepath.Join(legacyBusy, "data"))
	busy := fakePostgres(t, bin, filepath.Join(legacyBusy, "data"))
	if err := os.Chtimes(legacyBusy, long, long); err != nil {
		t.Fatal(err)
	}

	// A symlink with our prefix is never followed into its target.
	target := t.TempDir()
	if err := os.Symlink(target, filepath.Join(tmp, prefix+fmt.Sprintf("%d-%d-16", deadPid, me.start))); err != nil {
		t.Fatal(err)
	}

	removed, err := sweepThrowaway(tmp, prefix, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{dead, running, reused, legacyOld}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, d := range want {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", d, err)
		}
	}
	for _, d := range []string{live, oddName, legacyNew, legacyBusy, target} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
	if !killedWithin(t, postmaster, 5*time.Second) || !killedWithin(t, backend, 5*time.Second) {
		t.Error("the server in the swept directory was not killed")
	}
	if busy.ProcessState != nil || !isPostgres(busy.Process.Pid) {
		t.Error("the server of a kept legacy directory was touched")
	}
}

// MkdirThrowaway names its directory after this process, which is alive.
func TestMkdirThrowaway(t *testing.T) {
	t.Parallel()
	dir, err := MkdirThrowaway("registryd-pglocal-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o755 || filepath.Dir(dir) != filepath.Clean(os.TempDir()) {
		t.Fatalf("%s: %v %v", dir, fi.Mode(), err)
	}
	removed, err := SweepThrowaway("registryd-pglocal-test-")
	if err != nil || slices.Contains(removed, dir) {
		t.Errorf("sweep took a live process's dir: %v %v", removed, err)
	}
}

// A throwaway directory disappears soon after its process dies, even by
// SIGKILL, which runs no cleanup: its watchdog removes it.
func TestThrowawayRemovedWhenOwnerDies(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMkdirThrowawayAndHang$")
	cmd.Env = append(os.Environ(), "PGLOCAL_HELPER_THROWAWAY=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	dir := strings.TrimPrefix(strings.TrimSpace(line), "dir ")
	if err != nil || !strings.HasPrefix(filepath.Base(dir), "registryd-pglocal-watchdog-") {
		_ = cmd.Process.Kill()
		t.Fatalf("helper said %q: %v", line, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the helper's dir is not there while it lives: %v", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 10 s after its owner was killed", dir)
		}
	}
}

// TestHelperMkdirThrowawayAndHang is the child side of
// TestThrowawayRemovedWhenOwnerDies.
func TestHelperMkdirThrowawayAndHang(t *testing.T) {
	if os.Getenv("PGLOCAL_HELPER_THROWAWAY") == "" {
		t.Skip("helper process for TestThrowawayRemovedWhenOwnerDies")
	}
	dir, err := MkdirThrowaway("registryd-pglocal-watchdog-")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("dir %s\n", dir)
	time.Sleep(time.Minute) // until killed
}
