package api

import (
	"context"
	"net"
	"net/http"
)

type connKey struct{}

// ConnContext is for http.Server.ConnContext: it lets a handler look at
// the connection its request came on (clientGone).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// clientGone reports whether the client of r has closed its side of the
// connection, by a look at the socket: it sees a close the server's own
// reader has not noticed yet (and cancelled the request's context for),
// which under load can take longer than a whole claim. False when it
// cannot tell (no ConnContext, or a platform without the look).
func clientGone(r *http.Request) bool {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	return c != nil && peerClosed(c)
}
