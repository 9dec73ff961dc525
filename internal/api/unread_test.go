package api_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// servingAsServe starts the API on a fresh database behind an http.Server
// with serve's read timeouts, and returns its address.
func servingAsServe(t *testing.T) string {
	t.Helper()
	st, err := store.Open(context.Background(), pgtest.New(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier,
		Events: startHub(t, st), WatchKeepAlive: 100 * time.Millisecond}))
	ts.Config.ReadHeaderTimeout = 10 * time.Second
	ts.Config.ReadTimeout = 30 * time.Second
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// rawRequest sends head (a request up to and including its blank line)
// and then body, on a connection of its own, and reads the response
// header within 3 s.
func rawRequest(t *testing.T, addr, head, body string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head+body); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response within 3s to %q: %v", strings.SplitN(head, "\r\n", 2)[0], err)
	}
	return c, br, resp
}

// drain reads a response body whole.
func drain(t *testing.T, resp *http.Response) {
	t.Helper()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("response body: %v", err)
	}
}

// closedWithin reports whether the server closes c within limit.
func closedWithin(c net.Conn, br *bufio.Reader, limit time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := br.ReadByte()
	switch {
	case err == nil:
		return errors.New("the server sent more bytes")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("still open after %v", limit)
	default:
		return nil // EOF or reset: closed
	}
}

// TestUnreadBodyDoesNotHoldTheConnection: a body announced but trickled
// must not keep a connection busy (and so out of reach of the connection
// limit's eviction) once its request is answered. Without a token, a
// client could otherwise hold every connection with a few bytes each.
func TestUnreadBodyDoesNotHoldTheConnection(t *testing.T) {
	t.Parallel()
	addr := servingAsServe(t)
	admin := tokenFor(t, "admin-test", registry.RoleAdmin)

	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"open endpoint, no token", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", http.StatusOK},
		{"refused token", "POST /v1/nodes/list HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", http.StatusUnauthorized},
		{"chunked, no token", "POST /v1/nodes/list HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", http.StatusUnauthorized},
		{"refused role", "POST /v1/hardware/create HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
			tokenFor(t, "reader-test", registry.RoleReader) + "\r\nContent-Length: 100000\r\n\r\n", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := "{"
			if strings.Contains(tc.head, "chunked") {
				body = "1\r\n{\r\n"
			}
			start := time.Now()
			c, br, resp := rawRequest(t, addr, tc.head, body)
			drain(t, resp)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if !resp.Close {
				t.Error("the response does not say Connection: close")
			}
			if err := closedWithin(c, br, 2*time.Second); err != nil {
				t.Errorf("connection with an unread body: %v", err)
			}
			t.Logf("answered and closed in %v", time.Since(start).Round(time.Millisecond))
		})
	}

	// A response that starts while its handler still runs (a watch
	// stream) starts at once, unread body or not, and says it will close.
	t.Run("stream", func(t *testing.T) {
		head := "GET /v1/nodes/watch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + admin + "\r\nContent-Length: 100000\r\n\r\n"
		c, _, resp := rawRequest(t, addr, head, "{")
		defer c.Close()
		if resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("status %d, close %v; want 200 and Connection: close", resp.StatusCode, resp.Close)
		}
	})

	// A request whose body is read whole keeps its connection.
	t.Run("body read whole", func(t *testing.T) {
		body := `{"limit":5}`
		head := fmt.Sprintf("POST /v1/nodes/list HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", admin, len(body))
		c, br, resp := rawRequest(t, addr, head, body)
		drain(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("status %d, close %v; want 200 keeping the connection", resp.StatusCode, resp.Close)
		}
		if _, err := io.WriteString(c, head+body); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("second request on the connection: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("second request: status %d", resp.StatusCode)
		}
	})
}
