// Package lifecycle starts and stops the long-lived goroutines of a server
// (hubs, flushers, reloaders, sync loops) and paces their retries. It
// imports only the standard library.
//
// Every background loop gets a context of its own from Go and is stopped
// through the function Go returns, which also waits for it: whatever path
// a caller returns by, a deferred stop ends the loop, and nothing is left
// running behind it.
package lifecycle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Go runs fn in a goroutine of its own, with a context derived from ctx,
// and returns stop: stop cancels that context and waits for fn to return.
// fn must return once its context ends. stop may be called more than once
// and from several goroutines.
func Go(ctx context.Context, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ctx)
	}()
	return sync.OnceFunc(func() {
		cancel()
		<-done
	})
}

// Sleep waits for d, or until ctx ends, and reports whether all of d
// passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Backoff spaces out retries: Min after a Reset (and at first), then twice
// the previous wait, at most Max. Its zero value waits 100ms to 5s, which
// suits reconnecting to the database. It is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// Next returns the wait before the next attempt and doubles the one after.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi < lo {
		hi = max(lo, 5*time.Second)
	}
	d := min(max(b.next, lo), hi)
	b.next = min(2*d, hi)
	return d
}

// Reset starts the waits afresh at Min: call it once an attempt succeeded.
func (b *Backoff) Reset() { b.next = 0 }

// Retry calls fn until ctx ends; fn is expected to run until something
// goes wrong (a connection lost, say). Each time it returns before ctx
// ended, Retry logs msg with its error and calls it again after b's next
// wait. fn calls alive whenever it makes progress (a notification came
// in), which starts the waits afresh.
func Retry(ctx context.Context, b Backoff, logger *slog.Logger, msg string, fn func(ctx context.Context, alive func()) error) {
	for ctx.Err() == nil {
		err := fn(ctx, b.Reset)
		if ctx.Err() != nil {
			return
		}
		wait := b.Next()
		logger.Warn(msg, "err", err, "in", wait.String())
		Sleep(ctx, wait)
	}
}
