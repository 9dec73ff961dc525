//go:build unix

package connlimit_test

import (
	"syscall"
	"testing"

	"github.com/registryd/registryd/internal/connlimit"
)

// NoFile raises a lowered soft limit back to the hard one. Not parallel:
// it changes the process's limit for a moment.
func TestNoFileRaisesSoftLimit(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	if lim.Max < 512 {
		t.Skipf("hard limit %d too low to lower", lim.Max)
	}
	low := lim
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })
	got, err := connlimit.NoFile()
	if err != nil {
		t.Fatal(err)
	}
	if got != uint64(lim.Max) {
		t.Errorf("NoFile = %d, want the hard limit %d", got, lim.Max)
	}
	var now syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now)
	if now.Cur != lim.Max {
		t.Errorf("soft limit now %d, want %d", now.Cur, lim.Max)
	}
}
