//go:build unix

package connlimit

import "syscall"

// NoFile raises the soft RLIMIT_NOFILE to the hard limit when the soft one
// is lower (as many servers do; Go's runtime already tries this at start)
// and returns the soft limit then in force.
func NoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	return uint64(lim.Cur), nil
}
