package api

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// clientGone sees a client's close before the server's reader does: open
// (nothing sent, or data waiting) is false, closed is true, through a
// wrapper that exposes NetConn as connlimit's does.
func TestClientGone(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	r, _ := http.NewRequestWithContext(ConnContext(context.Background(), wrapped{server}), "POST", "/", nil)
	if clientGone(r) {
		t.Error("an open, quiet connection: gone")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if clientGone(r) {
		t.Error("an open connection with data waiting: gone")
	}
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil {
		t.Fatal(err)
	}
	client.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !clientGone(r) {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection not seen as gone within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if clientGone(httptestRequest()) {
		t.Error("a request without ConnContext: gone")
	}
}

type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

func httptestRequest() *http.Request {
	r, _ := http.NewRequest("GET", "/", nil)
	return r
}
