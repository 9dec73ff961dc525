package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultAcquireTimeout bounds the wait for a pooled connection unless
// Options.AcquireTimeout says otherwise.
const defaultAcquireTimeout = 10 * time.Second

// acquireBound bounds every wait for a pool connection. pgxpool has no
// such setting, but it waits on the context an AcquireTracer returns from
// TraceAcquireStart and hands that context back to TraceAcquireEnd once the
// wait is over, so the tracer can set a deadline and release it. The
// statement itself then runs under the caller's context, unbounded by this.
//
// A connection being made for the wait goes on in the background after the
// deadline (bounded by the connect timeout) and joins the pool.
type acquireBound struct{ wait time.Duration }

type acquireCancelKey struct{}

func (b acquireBound) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	ctx, cancel := context.WithTimeout(ctx, b.wait)
	return context.WithValue(ctx, acquireCancelKey{}, cancel)
}

func (acquireBound) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if cancel, ok := ctx.Value(acquireCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

// TraceQueryStart and TraceQueryEnd make acquireBound a pgx.QueryTracer,
// the type the connection config's Tracer field takes; they do nothing.
func (acquireBound) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (acquireBound) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
