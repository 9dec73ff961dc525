package store

import (
	"cmp"
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the bounds unless Options say otherwise.
const (
	defaultAcquireTimeout           = 10 * time.Second
	defaultStatementTimeout         = 30 * time.Second
	defaultIdleInTransactionTimeout = 5 * time.Second
	defaultLockTimeout              = 10 * time.Second
)

// keepAlive probes an idle connection after 10 s of silence, every 5 s,
// and gives it up after 3 unanswered probes: a peer that vanished (a
// frozen or unplugged host, a partition that resets nothing) is noticed
// within about 25 s on either side, without waiting for the kernel's
// default of two hours.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}

// sessionBounds makes every session of the pool bounded on the server's
// side, so a replica that freezes cannot hold the database hostage: an
// open transaction left idle is rolled back after
// idle_in_transaction_session_timeout, a lock wait ends after
// lock_timeout, and the server probes the connection (tcp_keepalives_*)
// as the client does (the dialer's keepalives). A parameter the URL sets
// itself (e.g. ?lock_timeout=100ms) wins.
func sessionBounds(cc *pgx.ConnConfig, opts Options) {
	params := map[string]string{
		"idle_in_transaction_session_timeout": millis(cmp.Or(opts.IdleInTransactionTimeout, defaultIdleInTransactionTimeout)),
		"lock_timeout":                        millis(cmp.Or(opts.LockTimeout, defaultLockTimeout)),
		"tcp_keepalives_idle":                 strconv.Itoa(int(keepAlive.Idle.Seconds())),
		"tcp_keepalives_interval":             strconv.Itoa(int(keepAlive.Interval.Seconds())),
		"tcp_keepalives_count":                strconv.Itoa(keepAlive.Count),
	}
	for k, v := range params {
		if _, set := cc.RuntimeParams[k]; !set {
			cc.RuntimeParams[k] = v
		}
	}
	dialer := &net.Dialer{KeepAliveConfig: keepAlive}
	cc.DialFunc = dialer.DialContext
}

// millis is d as PostgreSQL reads a duration setting without a unit.
func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// bounds limits every wait for a pool connection and every statement.
// pgxpool has no setting for either, but it waits on the context an
// AcquireTracer returns from TraceAcquireStart and hands that context back
// to TraceAcquireEnd once the wait is over, and pgx runs each statement
// under the context its QueryTracer returns from TraceQueryStart, handing
// it back to TraceQueryEnd when the statement is done (for a query: when
// its rows are closed). So the tracer sets a deadline and releases it.
//
// A connection being made for the wait goes on in the background after the
// deadline (bounded by the connect timeout) and joins the pool. A statement
// past its deadline has its connection's socket deadline set (pgx's
// default reaction to a done context), so it fails even if the server
// never answers, and the connection is closed. A batch (statements sent
// in one round trip, see pipeTx) is bounded the same way, as a whole.
//
// The tracer also tells observe (when set) how each statement ended; see
// Options.ObserveQuery.
type bounds struct {
	wait, statement time.Duration
	observe         func(class string)
}

type (
	acquireCancelKey   struct{}
	statementCancelKey struct{}
	unboundedKey       struct{}
)

// withoutStatementTimeout marks ctx for statements that may rightly run
// long and have bounds of their own or none needed: migrations, import
// passes (REGISTRY_SYNC_TIMEOUT), pruning.
func withoutStatementTimeout(ctx context.Context) context.Context {
	return context.WithValue(ctx, unboundedKey{}, true)
}

func (b bounds) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	ctx, cancel := context.WithTimeout(ctx, b.wait)
	return context.WithValue(ctx, acquireCancelKey{}, cancel)
}

func (b bounds) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if cancel, ok := ctx.Value(acquireCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
	// A statement that found no connection never reaches TraceQueryEnd.
	if d.Err != nil && b.observe != nil {
		b.observe(ErrorClass(d.Err))
	}
}

func (b bounds) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if b.statement <= 0 || ctx.Value(unboundedKey{}) != nil {
		return ctx
	}
	ctx, cancel := context.WithTimeout(ctx, b.statement)
	return context.WithValue(ctx, statementCancelKey{}, cancel)
}

func (b bounds) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if cancel, ok := ctx.Value(statementCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
	if b.observe != nil {
		b.observe(ErrorClass(d.Err))
	}
}

// batchState is what a batch's context carries between its trace calls.
type batchState struct {
	cancel context.CancelFunc // nil when the batch is not bounded
	traced bool               // a statement's end was observed
	ended  bool               // pgx may trace a batch that failed early as ended twice
}

type batchStateKey struct{}

// TraceBatchStart bounds a batch (one round trip of pipelined statements)
// as a statement is bounded: the batch is what waits for the server.
func (b bounds) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	st := &batchState{}
	if b.statement > 0 && ctx.Value(unboundedKey{}) == nil {
		ctx, st.cancel = context.WithTimeout(ctx, b.statement)
	}
	return context.WithValue(ctx, batchStateKey{}, st)
}

func (b bounds) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if st, ok := ctx.Value(batchStateKey{}).(*batchState); ok {
		st.traced = true
	}
	if b.observe != nil {
		b.observe(ErrorClass(d.Err))
	}
}

func (b bounds) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	st, ok := ctx.Value(batchStateKey{}).(*batchState)
	if !ok || st.ended {
		return
	}
	st.ended = true
	if st.cancel != nil {
		st.cancel()
	}
	// A batch that failed before any statement's result was read (it
	// could not be sent) still counts, once.
	if !st.traced && d.Err != nil && b.observe != nil {
		b.observe(ErrorClass(d.Err))
	}
}

// ErrorClass names the kind of a statement's failure for counting, from a
// small fixed set: "" for no error; the SQLSTATE class (its first two
// characters, e.g. "23" integrity constraint violation, "40" transaction
// rollback, "57" operator intervention) for an error the server reported;
// "connection" when there was no usable connection (refused, reset,
// closed; including a server refusing the connection with a SQLSTATE);
// "timeout" for a deadline (pool wait or statement bound); "canceled" when
// the caller gave up; "other" for anything else.
func ErrorClass(err error) string {
	var connectErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &connectErr):
		return "connection"
	case errors.As(err, &pgErr) && sqlstateClass.MatchString(pgErr.Code):
		return pgErr.Code[:2]
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case unavailable(err):
		return "connection"
	default:
		return "other"
	}
}

// sqlstateClass is what a SQLSTATE looks like; anything else is "other",
// so that the class label stays within 36² values whatever a server sends.
var sqlstateClass = regexp.MustCompile(`^[0-9A-Z]{5}$`)
