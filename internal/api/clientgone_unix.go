//go:build unix

package api

import (
	"net"
	"syscall"
)

// peerClosed peeks at c's socket without waiting: a read of 0 bytes is the
// peer's close. Data waiting, or nothing yet, is a client still there.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil
	})
	return closed
}
