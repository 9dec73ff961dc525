package client_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/revoke"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// server is a real registryd on a fresh database, wired as `registryd
// serve` wires it: token verification with the revocation list,
// heartbeats, the watch hub.
type server struct {
	t     *testing.T
	ts    *httptest.Server
	url   string
	store *store.Store
	beats *heartbeat.Recorder
}

var secret = []byte("client-test-secret-0123456789abcdef0123456789")

func newServer(t *testing.T) *server {
	t.Helper()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	list := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel, Reload: time.Minute})
	t.Cleanup(lifecycle.Go(context.Background(), list.Run))
	select {
	case <-list.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the revocation list did not load within 10s")
	}
	verifier, err := auth.NewVerifier(auth.Config{Secret: secret, Revocations: list})
	if err != nil {
		t.Fatal(err)
	}
	beats := heartbeat.New(st, heartbeat.Options{})
	hub := watch.New(st, watch.Options{
		Channels: watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:   api.EncodeEvent,
		Poll:     100 * time.Millisecond,
	})
	t.Cleanup(lifecycle.Go(context.Background(), hub.Run))
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	ts := httptest.NewServer(api.New(api.Config{Store: st, Logger: logger, OpenAPI: registryd.OpenAPI, Ready: st.Ping,
		Auth: verifier, Heartbeats: beats, Events: hub, WatchKeepAlive: 200 * time.Millisecond}))
	t.Cleanup(ts.Close)
	return &server{t: t, ts: ts, url: ts.URL, store: st, beats: beats}
}

// token mints a token of sub with role (bound to ips, for agents).
func (s *server) token(sub string, role registry.Role, ips ...string) string {
	s.t.Helper()
	m, err := auth.Signer{Secret: secret}.Mint(auth.TokenSpec{Sub: sub, Role: role, TTL: time.Hour, IPs: ips}, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	return m.Token
}

// client returns a client of s with token whose every exchange is
// validated against openapi.yaml (requests it sends included), with quick
// retries. Not for watching: the validator reads whole bodies.
func (s *server) client(token string, opts ...client.Option) *client.Client {
	s.t.Helper()
	opts = append([]client.Option{client.WithToken(token), client.WithHTTPClient(apitest.Client(s.t)),
		client.WithRetry(client.Retry{MinDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})}, opts...)
	c, err := client.New(s.url, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// watcher returns a client for watching: a plain HTTP client.
func (s *server) watcher(token string, hc *http.Client) *client.Client {
	s.t.Helper()
	if hc == nil {
		hc = &http.Client{}
	}
	c, err := client.New(s.url, client.WithToken(token), client.WithHTTPClient(hc),
		client.WithRetry(client.Retry{MinDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}
