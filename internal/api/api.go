// Package api serves the registry over HTTP: the Nodes API, hardware
// generations, health checks and the OpenAPI document. It speaks the
// registry package's vocabulary and reaches storage only through the small
// Store interface it declares.
package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/registryd/registryd/internal/registry"
)

// Store is the storage the API needs. *store.Store implements it.
// Writes take the actor so the store can audit them in the same transaction.
type Store interface {
	CreateNode(ctx context.Context, a registry.Actor, spec registry.NodeSpec) (n registry.Node, adopted bool, err error)
	GetNode(ctx context.Context, pk int64) (registry.Node, error)
	UpdateNode(ctx context.Context, a registry.Actor, pk int64, fn func(cur registry.Node) (registry.NodeSpec, error)) (registry.Node, error)
	DeleteNode(ctx context.Context, a registry.Actor, pk int64, force bool, check func(cur registry.Node) error) (registry.Node, error)
	ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error)
	ClaimNodes(ctx context.Context, a registry.Actor, c registry.Claim) ([]registry.Node, error)
	ReleaseNodes(ctx context.Context, a registry.Actor, r registry.Release) ([]registry.Node, []registry.NotReleased, error)
	RenewLeases(ctx context.Context, a registry.Actor, r registry.Renewal) (nodes []registry.Node, expired []int64, err error)
	CordonNodes(ctx context.Context, a registry.Actor, c registry.Cordon) ([]registry.Node, []registry.NotDone, error)
	UncordonNodes(ctx context.Context, a registry.Actor, u registry.Uncordon) ([]registry.Node, []registry.NotDone, error)

	CreateHardware(ctx context.Context, a registry.Actor, spec registry.HardwareSpec) (registry.Hardware, error)
	GetHardware(ctx context.Context, pk int64) (registry.Hardware, error)
	UpdateHardware(ctx context.Context, a registry.Actor, pk int64, fn func(cur registry.Hardware) (registry.HardwareSpec, error)) (registry.Hardware, error)
	DeleteHardware(ctx context.Context, a registry.Actor, pk int64, check func(cur registry.Hardware) error) (registry.Hardware, error)
	ListHardware(ctx context.Context) ([]registry.Hardware, error)
	FabricCapacity(ctx context.Context, f registry.NodeFilter) ([]registry.FabricCapacity, error)

	ListAudit(ctx context.Context, f registry.AuditFilter) ([]registry.AuditEntry, error)

	RevokeTokens(ctx context.Context, a registry.Actor, r registry.Revocation) (registry.Revocation, error)

	// Idempotency-Key's records (see idempotent).
	ReserveKey(ctx context.Context, principal, key string, fingerprint []byte, requestID string, lease, keep time.Duration) (rec registry.KeyRecord, created bool, err error)
	TakeOverKey(ctx context.Context, principal, key, lostRequestID, requestID string, lease time.Duration) (bool, error)
	CompleteKey(ctx context.Context, principal, key, requestID string, status int, contentType string, body []byte) error
	AbandonKey(ctx context.Context, principal, key, requestID string) error
	EndKeyLease(ctx context.Context, principal, key, requestID string) error
	RequestChanges(ctx context.Context, principal, requestID string, since time.Time) ([]int64, error)
}

// Config wires a Server.
type Config struct {
	Store  Store
	Logger *slog.Logger
	// LogHeartbeats writes an access log line for successful pings too.
	// Without it a ping is logged only when it fails; metrics count every
	// ping (see docs/operating.md).
	LogHeartbeats bool
	// Ready reports whether the server can serve: database reachable and
	// schema current. Its error text is shown on /readyz.
	Ready func(ctx context.Context) error
	// Health, when set, makes /healthz answer 503 with its error text:
	// for what a restart of the process should cure (optional).
	Health func(ctx context.Context) error
	// OpenAPI is the spec served at /openapi.yaml.
	OpenAPI []byte
	// Docs is the API browser served at /docs: index.html is the page,
	// every other file is served at /docs/NAME (see routeDocs). Without
	// it /docs answers 404.
	Docs fs.FS
	// CORS lists the origins (as ParseCORSOrigins returns them) whose
	// browser pages may call the API; none: CORS is off.
	CORS []string
	// ListBatch is how many nodes list reads per query while streaming;
	// default 500.
	ListBatch int
	// Auth verifies bearer tokens. Without it every /v1 request is refused.
	Auth Authenticator
	// Renewer renews agent tokens (POST /v1/tokens/renew); without it
	// renewals are refused.
	Renewer TokenRenewer
	// Heartbeats receives the nodes that act through Node-Id; optional.
	Heartbeats Heartbeats
	// Nodes serves reads of nodes (GET, HEAD, lists, the Node-Id check)
	// from memory once it is proven current (see NodeCache); optional
	// (without it they read PostgreSQL).
	Nodes NodeCache
	// Events feeds GET /v1/nodes/watch; without it watch answers 503.
	Events Events
	// WatchKeepAlive is the interval of keep-alive comments on idle
	// watch streams; default 15s.
	WatchKeepAlive time.Duration
	// WatchRecheck is how often a watch stream checks its token again,
	// ending the stream once the token is revoked or expired; default 5s.
	WatchRecheck time.Duration
	// Metrics is served at /metrics, open like the probes; without it
	// /metrics answers 404 (e.g. when metrics have a listener of their own).
	Metrics http.Handler
	// Observer is told what the server does, for metrics; optional.
	Observer Observer
	// IdempotencyKeep is how long the answer of a request sent with an
	// Idempotency-Key is kept for its retries; default
	// DefaultIdempotencyKeep.
	IdempotencyKeep time.Duration
	// IdempotencyLease is how long the request running under a key holds
	// it before a retry may take it over; default
	// DefaultIdempotencyLease.
	IdempotencyLease time.Duration
}

// refuseAll is the Authenticator of a server configured without one.
type refuseAll struct{}

func (refuseAll) Verify(string) (registry.Principal, error) {
	return registry.Principal{}, errors.New("this server has no token keys configured")
}

type noHeartbeats struct{}

func (noHeartbeats) Record(int64) {}

// Server is the registry's HTTP handler.
type Server struct {
	store      Store
	logger     *slog.Logger
	ready      func(ctx context.Context) error
	health     func(ctx context.Context) error
	openapi    []byte
	docs       map[string]docsFile
	listBatch  int
	logBeats   bool
	auth       Authenticator
	renewer    TokenRenewer
	heartbeats Heartbeats
	nodes      NodeCache
	// cacheBehind is set when a consistent read waited awaitBound for the
	// node cache in vain; until a read proves the cache current again,
	// consistent reads wait behindProbe only (see awaitCache).
	cacheBehind atomic.Bool
	events      Events
	metrics     http.Handler
	observer    Observer
	router      chi.Router

	watchKeepAlive time.Duration
	watchRecheck   time.Duration
	idemKeep       time.Duration
	idemLease      time.Duration
}

// New builds the handler with every route and middleware.
func New(cfg Config) *Server {
	s := newServer(cfg)
	r := chi.NewRouter()
	s.useMiddleware(r, cfg)
	s.routeOpen(r)
	s.routeV1(r)
	s.router = r
	return s
}

// newServer is a Server of cfg with every optional part defaulted; its
// router is not built yet.
func newServer(cfg Config) *Server {
	s := &Server{
		store:      cfg.Store,
		logger:     orDiscard(cfg.Logger),
		ready:      cfg.Ready,
		health:     cfg.Health,
		openapi:    cfg.OpenAPI,
		listBatch:  cfg.ListBatch,
		logBeats:   cfg.LogHeartbeats,
		auth:       cfg.Auth,
		renewer:    cfg.Renewer,
		heartbeats: cfg.Heartbeats,
		nodes:      cfg.Nodes,
		events:     cfg.Events,
		metrics:    cfg.Metrics,
		observer:   cfg.Observer,

		watchKeepAlive: cfg.WatchKeepAlive,
		watchRecheck:   cfg.WatchRecheck,
		idemKeep:       cmp.Or(cfg.IdempotencyKeep, DefaultIdempotencyKeep),
		idemLease:      cmp.Or(cfg.IdempotencyLease, DefaultIdempotencyLease),
	}
	if s.watchKeepAlive <= 0 {
		s.watchKeepAlive = 15 * time.Second
	}
	if s.watchRecheck <= 0 {
		s.watchRecheck = 5 * time.Second
	}
	if s.auth == nil {
		s.auth = refuseAll{}
	}
	if s.heartbeats == nil {
		s.heartbeats = noHeartbeats{}
	}
	if s.observer == nil {
		s.observer = noObserver{}
	}
	if s.listBatch <= 0 {
		s.listBatch = 500
	}
	if s.ready == nil {
		s.ready = func(context.Context) error { return nil }
	}
	docs, err := loadDocs(cfg.Docs)
	if err != nil {
		s.logger.Error("the API browser (/docs) cannot be served", "err", err)
	}
	s.docs = docs
	return s
}

// useMiddleware installs what wraps every request, outermost first, and
// the answers to unknown paths and methods.
func (s *Server) useMiddleware(r chi.Router, cfg Config) {
	if cfg.Observer != nil {
		r.Use(s.measure) // outside the recoverer: a panic counts as the 500 it becomes
	}
	r.Use(s.closeUnreadBody, s.requestID, s.accessLog, s.recoverer)
	if len(cfg.CORS) > 0 {
		r.Use(newCORS(cfg.CORS, s).handler)
	}
	r.NotFound(s.problemHandler(http.StatusNotFound, "no such endpoint"))
	r.MethodNotAllowed(s.methodNotAllowed)
}

// routeOpen adds the endpoints open to all: probes and the contract.
func (s *Server) routeOpen(r chi.Router) {
	getAndHead(r, "/healthz", s.handle(s.healthz))
	getAndHead(r, "/readyz", s.handle(s.readyz))
	getAndHead(r, "/openapi.yaml", s.serveOpenAPI)
	if s.metrics != nil {
		r.Get("/metrics", s.serveMetrics)
	}
	s.routeDocs(r) // the contract in a browser
}

// routeV1 adds the API proper: a bearer token on every request, then
// Node-Id, then the role's permission for the route, before any body is
// read.
func (s *Server) routeV1(r chi.Router) {
	read := s.require(registry.PermRead)
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.authenticate, s.nodeID)
		r.Route("/nodes", func(r chi.Router) { s.routeNodes(r, read) })
		r.Route("/hardware", func(r chi.Router) { s.routeHardware(r, read) })
		r.With(read).Post("/fabrics/list", s.handle(s.listFabrics))
		r.With(s.require(registry.PermReadAudit)).Post("/audit/list", s.handle(s.listAudit))
		r.With(s.require(registry.PermRevokeTokens)).Post("/tokens/revoke", s.handle(s.revokeTokens))
		r.With(read).Post("/tokens/renew", s.handle(s.renewToken))
	})
}

// routeNodes adds /v1/nodes: its actions, then the node by pk. {pk}
// matches any segment: a malformed pk is a 400 (pathPK), an action's path
// with another method a 405 (notAction).
func (s *Server) routeNodes(r chi.Router, read func(http.Handler) http.Handler) {
	r.NotFound(s.problemHandler(http.StatusNotFound, "no such endpoint; a node is addressed as /v1/nodes/{pk}"))
	write := s.require(registry.PermWriteNode)
	r.With(read).Post("/list", s.handle(s.listNodes))
	r.With(s.require(registry.PermCreateNode)).Post("/create", s.handle(s.createNode))
	r.With(s.require(registry.PermClaim)).Post("/claim", s.handle(s.idempotent(s.claimNodes)))
	r.With(s.require(registry.PermClaim)).Post("/release", s.handle(s.idempotent(s.releaseNodes)))
	r.With(s.require(registry.PermClaim)).Post("/renew", s.handle(s.idempotent(s.renewLeases)))
	r.With(s.require(registry.PermCordon)).Post("/cordon", s.handle(s.idempotent(s.cordonNodes)))
	r.With(s.require(registry.PermCordon)).Post("/uncordon", s.handle(s.idempotent(s.uncordonNodes)))
	getAndHead(r.With(read), "/ping", s.handle(s.ping))
	r.With(read).Get("/watch", s.handle(s.watchNodes))
	r.With(read).Head("/watch", s.handle(s.headWatch))
	getAndHead(r.With(s.notAction, read), "/{pk}", s.handle(s.getNode))
	r.With(s.notAction, write).Put("/{pk}", s.handle(s.updateNode))
	r.With(s.notAction, write).Patch("/{pk}", s.handle(s.patchNode))
	r.With(s.notAction, write).Delete("/{pk}", s.handle(s.deleteNode))
}

// routeHardware adds /v1/hardware, addressed like the nodes.
func (s *Server) routeHardware(r chi.Router, read func(http.Handler) http.Handler) {
	r.NotFound(s.problemHandler(http.StatusNotFound, "no such endpoint; a hardware generation is addressed as /v1/hardware/{pk}"))
	write := s.require(registry.PermWriteHardware)
	r.With(read).Post("/list", s.handle(s.listHardware))
	r.With(write).Post("/create", s.handle(s.createHardware))
	getAndHead(r.With(s.notAction, read), "/{pk}", s.handle(s.getHardware))
	r.With(s.notAction, write).Put("/{pk}", s.handle(s.updateHardware))
	r.With(s.notAction, write).Patch("/{pk}", s.handle(s.patchHardware))
	r.With(s.notAction, write).Delete("/{pk}", s.handle(s.deleteHardware))
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

// Router exposes the routes, e.g. for checking them against the spec.
func (s *Server) Router() chi.Routes { return s.router }

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	if s.health != nil {
		if err := s.health(r.Context()); err != nil {
			s.logger.WarnContext(r.Context(), "unhealthy", "err", err)
			return &httpError{status: http.StatusServiceUnavailable, detail: "unhealthy: " + err.Error()}
		}
	}
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		s.logger.WarnContext(r.Context(), "not ready", "err", err)
		return &httpError{status: http.StatusServiceUnavailable, detail: "not ready: " + err.Error()}
	}
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	http.ServeContent(w, r, "openapi.yaml", time.Time{}, bytes.NewReader(s.openapi))
}

// pingPath is the heartbeat's path, as the access log sees it.
const pingPath = "/v1/nodes/ping"

// pingJSON is ping's answer, {"status":"ok","time":…}.
type pingJSON struct {
	Status string    `json:"status"`
	Time   time.Time `json:"time"`
}

// appendPing appends ping's answer for t as json.Marshal writes pingJSON,
// and a newline, as writeJSON does, without reflection: ping is the
// heartbeat, the hottest path.
func appendPing(b []byte, t time.Time) []byte {
	b = append(b, `{"status":"ok","time":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, "\"}\n"...)
}

// jsonContentType is the Content-Type header of JSON answers, shared: a
// header set this way costs no allocation (net/http never changes it).
var jsonContentType = []string{"application/json"}

func (s *Server) ping(w http.ResponseWriter, r *http.Request) error {
	var buf [64]byte
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(appendPing(buf[:0], time.Now().UTC()))
	return nil
}

// writeJSON encodes v before touching the response, so an encoding failure
// still produces a clean 500 rather than half a body.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	return writeJSONType(w, status, "application/json", v)
}

func writeJSONType(w http.ResponseWriter, status int, contentType string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("api: encode response: %w", err)
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

type ctxKey int

const (
	requestStateKey ctxKey = iota
)

// validRequestID is what a client's X-Request-Id must look like to be kept:
// short, and nothing that could forge a log line or a header.
var validRequestID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// requestID tags each request with the server's own fresh id, which the
// response (X-Request-Id), problem documents, logs and the audit log carry:
// a client cannot choose the id an audit entry is filed under. A client's
// own X-Request-Id, when there is exactly one and it is sane, is kept apart
// so ids still follow a request through proxies: it is echoed as
// X-Client-Request-Id, logged and audited as client_request_id. Others are
// dropped.
func (s *Server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		st := &requestState{id: hex.EncodeToString(b[:])}
		w.Header()["X-Request-Id"] = []string{st.id}
		if ids := r.Header.Values("X-Request-Id"); len(ids) == 1 && validRequestID.MatchString(ids[0]) {
			w.Header().Set("X-Client-Request-Id", ids[0])
			st.clientID = ids[0]
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestStateKey, st)))
	})
}

// requestState is what the middleware learn of a request, in one object
// in its context, so that a request pays for one context value and one
// request copy however many middleware add to it.
type requestState struct {
	id, clientID string // the server's id; the client's sane X-Request-Id or ""
	principal    registry.Principal
	authed       bool  // principal was set by authenticate
	acting       int64 // the node an allowed Node-Id names; 0: none
}

func stateOf(ctx context.Context) *requestState {
	st, _ := ctx.Value(requestStateKey).(*requestState)
	return st
}

// requestID is the server's id of the request.
func requestID(ctx context.Context) string {
	if st := stateOf(ctx); st != nil {
		return st.id
	}
	return ""
}

// clientRequestID is the client's sane X-Request-Id, or "".
func clientRequestID(ctx context.Context) string {
	if st := stateOf(ctx); st != nil {
		return st.clientID
	}
	return ""
}

// watchStatus is w as a statusWriter: w itself when an outer middleware
// already wrapped it (it sees the same status and bytes), so a request
// pays for one wrapper, not one per middleware that looks.
func watchStatus(w http.ResponseWriter) *statusWriter {
	if sw, ok := w.(*statusWriter); ok {
		return sw
	}
	return &statusWriter{ResponseWriter: w}
}

// statusWriter remembers the status for the access log.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach Flush and deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := watchStatus(w)
		defer func() {
			ctx := r.Context()
			if !s.logger.Enabled(ctx, slog.LevelInfo) {
				return
			}
			if !s.logBeats && sw.status < http.StatusBadRequest && r.URL.Path == pingPath {
				return // a heartbeat that worked: counted by the metrics, not logged
			}
			// Attrs, not key-value pairs: every request pays this, and
			// LogAttrs boxes nothing.
			attrs := make([]slog.Attr, 0, 7)
			attrs = append(attrs, slog.String("request_id", requestID(ctx)))
			if c := clientRequestID(ctx); c != "" {
				attrs = append(attrs, slog.String("client_request_id", c))
			}
			attrs = append(attrs, slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", sw.status), slog.Int64("bytes", sw.bytes),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
			s.logger.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
		}()
		next.ServeHTTP(sw, r)
	})
}

// recoverer turns a panic into a logged 500. http.ErrAbortHandler passes
// through: it is how a handler abandons a response it already started.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if err, ok := rec.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(rec)
			}
			s.logger.ErrorContext(r.Context(), "panic", "request_id", requestID(r.Context()),
				"panic", fmt.Sprint(rec), "stack", string(debug.Stack()))
			s.writeError(w, r, fmt.Errorf("panic: %v", rec))
		}()
		next.ServeHTTP(w, r)
	})
}
