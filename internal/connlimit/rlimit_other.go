//go:build !unix

package connlimit

import "errors"

// NoFile reports that this system has no RLIMIT_NOFILE to derive from.
func NoFile() (uint64, error) {
	return 0, errors.New("no RLIMIT_NOFILE on this system")
}
