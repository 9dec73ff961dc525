package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
)

// Clients without any token announce a body and trickle it: net/http used
// to read such a body to its end before answering and again after, for up
// to the server's 30 s ReadTimeout, so each connection counted as busy and
// the connection limit found no idle one to close for a newcomer. With
// every slot taken so, a new client must still be answered within 3 s.
func TestServeTrickledBodiesDoNotLockOut(t *testing.T) {
	t.Parallel()
	const limit = 8
	srv := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_MAX_CONNECTIONS": fmt.Sprint(limit)})
	addr := strings.TrimPrefix(srv.url, "http://")
	dial := func() *httpConn {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &httpConn{c: c, br: bufio.NewReader(c)}
	}
	for i := range limit {
		c := dial()
		// One byte of an announced 100,000; the rest never comes.
		if _, err := io.WriteString(c.c, "GET /healthz HTTP/1.1\r\nHost: registryd\r\nContent-Length: 100000\r\n\r\nx"); err != nil {
			t.Fatal(err)
		}
		_ = c.c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("trickling client %d got no answer within 3s: %v", i, err)
		}
		resp.Body.Close()
	}
	start := time.Now()
	if err := dial().healthz(3 * time.Second); err != nil {
		t.Fatalf("with %d clients trickling bodies, a new client was not answered within 3s: %v", limit, err)
	}
	t.Logf("newcomer answered in %v", time.Since(start).Round(time.Millisecond))
}
