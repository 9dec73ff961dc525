package api

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// closeUnreadBody keeps a request body that the handler did not read to
// its end from holding the connection. net/http would otherwise read the
// rest of it, before sending the response and again after the handler, to
// reuse the connection (up to 256 KiB, within the server's ReadTimeout):
// a client without any token could hold a connection by trickling a body
// it announced (see docs/security.md).
//
// So a response to a request whose body was not read to its end says
// Connection: close (net/http then reads nothing before answering), and
// once the handler is done the connection's read deadline is set to now,
// so the read after the handler stops at once and the connection closes.
// Requests whose body was read whole (every accepted JSON request) keep
// their connection.
func (s *Server) closeUnreadBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		body := &eofReader{ReadCloser: r.Body}
		r.Body = body
		uw := &unreadWriter{ResponseWriter: w, body: body}
		next.ServeHTTP(uw, r)
		if !body.eof {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
	})
}

// eofReader remembers whether its reader reached the end.
type eofReader struct {
	io.ReadCloser
	eof bool
}

func (b *eofReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// unreadWriter adds Connection: close to a response that starts before its
// request's body was read to the end.
type unreadWriter struct {
	http.ResponseWriter
	body    *eofReader
	started bool
}

func (w *unreadWriter) start() {
	if w.started {
		return
	}
	w.started = true
	if !w.body.eof {
		w.Header().Set("Connection", "close")
	}
}

func (w *unreadWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx informational answers come before the real one
		w.start()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *unreadWriter) Write(b []byte) (int, error) {
	w.start()
	return w.ResponseWriter.Write(b)
}

// FlushError flushes through http.ResponseController; a flush sends the
// header too, so it starts the response.
func (w *unreadWriter) FlushError() error {
	w.start()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach deadlines and the connection.
func (w *unreadWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
