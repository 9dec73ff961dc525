package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/watch"
)

// TestMain checks, after a run of the whole package, that every problem
// code openapi.yaml documents came in some test's answer.
func TestMain(m *testing.M) {
	pgtest.Main(m, apitest.CodesUnseen(func() string { return flag.Lookup("test.run").Value.String() }))
}

// bundle is what a test needs: a server on a fresh database, a validating
// client and direct access to the store.
type bundle struct {
	t      *testing.T
	url    string
	client *http.Client
	store  *store.Store
	dbURL  string
	beats  *heartbeat.Recorder
	// token is sent with every request that sets no Authorization itself;
	// an admin's unless a test changes it.
	token string
}

// testSecret signs every token of the api tests.
var testSecret = []byte("api-test-secret-0123456789abcdef0123456789")

// tokenFor mints a token for sub with role.
func tokenFor(t testing.TB, sub string, role registry.Role) string {
	t.Helper()
	tok, err := auth.Signer{Secret: testSecret}.Sign(sub, role, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type option func(*api.Config)

// setup makes the test parallel and gives it a server on a fresh database.
func setup(t *testing.T, opts ...option) *bundle {
	t.Helper()
	t.Parallel()
	return another(t, opts...)
}

// another gives a test that already has a bundle a second, independent one.
func another(t *testing.T, opts ...option) *bundle {
	t.Helper()
	return anotherOn(t, store.Options{}, opts...)
}

// anotherOn is another with a store opened with so.
func anotherOn(t *testing.T, so store.Options, opts ...option) *bundle {
	t.Helper()
	dbURL := pgtest.New(t)
	st := pgtest.Open(t, dbURL, so)
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	// With the verified-token cache, as serve runs: every test of a
	// token's use covers its cached second use too.
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret, CacheSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	beats := heartbeat.New(st, heartbeat.Options{})
	hub := startHub(t, st)
	cfg := api.Config{Store: st, OpenAPI: registryd.OpenAPI, Ready: st.Ping, Logger: logger, Auth: verifier,
		Heartbeats: beats, Events: hub, WatchKeepAlive: 200 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	ts := httptest.NewServer(api.New(cfg))
	t.Cleanup(ts.Close)
	return &bundle{t: t, url: ts.URL, client: apitest.Client(t), store: st, dbURL: dbURL, beats: beats,
		token: tokenFor(t, "admin-test", registry.RoleAdmin)}
}

// startHub runs a watch hub on st until the test ends.
func startHub(t *testing.T, st *store.Store) *watch.Hub {
	t.Helper()
	hub := watch.New(st, watch.Options{
		Channels: watch.Channels{Changes: store.ChangesChannel, Events: store.EventsChannel},
		Encode:   api.EncodeEvent,
		Poll:     100 * time.Millisecond,
	})
	t.Cleanup(lifecycle.Go(context.Background(), hub.Run))
	return hub
}

// response is one answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// object decodes the body as a JSON object.
func (r response) object(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	r.json(t, &m)
	return m
}

// problemFields lists the fields a problem response names.
func (r response) problemFields(t *testing.T) []string {
	t.Helper()
	var p struct {
		Errors []struct{ Field string } `json:"errors"`
	}
	r.json(t, &p)
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.Field)
	}
	return out
}

// do sends body (a string is sent as is, anything else as JSON) and
// returns the whole response.
func (b *bundle) do(method, path string, body any, headers ...string) response {
	b.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		j, err := json.Marshal(v)
		if err != nil {
			b.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	if err != nil {
		b.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// must checks the status and fails with the body when it differs.
func (b *bundle) must(want int, r response) response {
	b.t.Helper()
	if r.status != want {
		b.t.Fatalf("status %d, want %d; body: %s", r.status, want, r.body)
	}
	return r
}

// createNode creates a node from the given fields and returns its pk.
func (b *bundle) createNode(fields map[string]any) int64 {
	b.t.Helper()
	body := map[string]any{
		"ip": "10.0.0.1", "index": 0, "cpu_mem": 1 << 30, "driver_version": "550.54.15",
		"hardware_generation": nil, "gpu_mem": nil,
	}
	for k, v := range fields {
		body[k] = v
	}
	r := b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", body))
	var n struct{ PK int64 }
	r.json(b.t, &n)
	return n.PK
}

func (b *bundle) createHardware(name string) int64 {
	b.t.Helper()
	r := b.must(http.StatusCreated, b.do("POST", "/v1/hardware/create", map[string]any{"name": name}))
	var h struct{ PK int64 }
	r.json(b.t, &h)
	return h.PK
}

// countNodes counts rows straight from the database.
func (b *bundle) countNodes() int {
	b.t.Helper()
	var n int
	if err := b.store.Pool().QueryRow(context.Background(), "SELECT count(*) FROM nodes").Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// seen sets last_seen of nodes to now() + offset (an SQL interval), as a
// heartbeat flush would.
func (b *bundle) seen(offset string, pks ...int64) {
	b.t.Helper()
	b.exec(`INSERT INTO node_liveness (node_pk, last_seen) SELECT unnest($1::bigint[]), now() + $2::interval
		ON CONFLICT (node_pk) DO UPDATE SET last_seen = excluded.last_seen`, pks, offset)
}

// exec runs SQL directly, for states the API cannot make yet.
func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.store.Pool().Exec(context.Background(), sql, args...); err != nil {
		b.t.Fatal(err)
	}
}
