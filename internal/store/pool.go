package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the bounds unless Options say otherwise.
const (
	defaultAcquireTimeout   = 10 * time.Second
	defaultStatementTimeout = 30 * time.Second
)

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
// never answers, and the connection is closed.
type bounds struct{ wait, statement time.Duration }

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

func (bounds) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if cancel, ok := ctx.Value(acquireCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

func (b bounds) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if b.statement <= 0 || ctx.Value(unboundedKey{}) != nil {
		return ctx
	}
	ctx, cancel := context.WithTimeout(ctx, b.statement)
	return context.WithValue(ctx, statementCancelKey{}, cancel)
}

func (bounds) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if cancel, ok := ctx.Value(statementCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}
