//go:build !unix

package api

import "net"

// peerClosed cannot tell on this platform.
func peerClosed(net.Conn) bool { return false }
