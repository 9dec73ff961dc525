package bench

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// connTransport is the load generator's HTTP/1.1 client side: one
// keep-alive connection, requests written and answers read on the calling
// goroutine. net/http's Transport runs two goroutines per connection and
// hands every request and answer across channels; on a machine whose
// cores the server, PostgreSQL and the load generator share, that cost
// came out of what the server could do (the harness measured a retrieve
// rate well below what wrk saw from the same server). Only what the
// workloads send is supported: a method, a path, headers and an optional
// body with a known length, over plain HTTP.
type connTransport struct {
	mu   sync.Mutex // one request at a time; held until its body is closed
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
}

var errNoBody = errors.New("bench: only bodies of known length are sent")

func (t *connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	resp, err := t.roundTrip(req)
	if err != nil {
		t.closeLocked()
		t.mu.Unlock()
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp.Body = &connBody{ReadCloser: resp.Body, t: t, close: resp.Close}
	return resp, nil
}

func (t *connTransport) roundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.ContentLength <= 0 && req.Body != http.NoBody {
		return nil, errNoBody
	}
	if t.conn == nil {
		c, err := net.DialTimeout("tcp", req.URL.Host, 10*time.Second)
		if err != nil {
			return nil, err
		}
		t.conn, t.br, t.bw = c, bufio.NewReaderSize(c, 32<<10), bufio.NewWriterSize(c, 8<<10)
	}
	if dl, ok := req.Context().Deadline(); ok {
		t.conn.SetDeadline(dl)
	} else {
		t.conn.SetDeadline(time.Now().Add(requestTimeout))
	}
	bw := t.bw
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(req.URL.Host)
	bw.WriteString("\r\n")
	for k, vs := range req.Header {
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if req.Body != nil && req.Body != http.NoBody {
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(req.ContentLength, 10))
		bw.WriteString("\r\n\r\n")
		if _, err := io.Copy(bw, req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
	} else {
		bw.WriteString("\r\n")
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	return http.ReadResponse(t.br, req)
}

func (t *connTransport) closeLocked() {
	if t.conn != nil {
		t.conn.Close()
		t.conn = nil
	}
}

// CloseIdleConnections closes the connection (the load generator's end).
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	t.closeLocked()
	t.mu.Unlock()
}

// connBody is an answer's body: closing it reads what is left, so the
// connection is ready for the next request, and gives the connection back.
type connBody struct {
	io.ReadCloser
	t     *connTransport
	close bool // the server said Connection: close
	done  bool
}

func (b *connBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.ReadCloser.Close() // reads what is left (http.ReadResponse's body)
	if err != nil || b.close {
		b.t.closeLocked()
	}
	b.t.mu.Unlock()
	return err
}
