// Package logbatch batches a server's informational log lines into fewer
// writes. Every request writes an access-log line; written one by one to
// stderr, they were a write system call per request and about a fifth of
// what a cheap request (a read from the node cache) cost. Lines at
// warning level and above, and anything not recognisably informational,
// are written at once, together with whatever was waiting before them, so
// order is kept and trouble is never held back.
package logbatch

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// Defaults of a Writer.
const (
	DefaultDelay = 50 * time.Millisecond
	DefaultSize  = 64 << 10
)

// Writer batches whole lines written to it (one slog record per Write)
// and passes them on to w at most Delay after the first of a batch, or as
// soon as Size bytes wait.
type Writer struct {
	w     io.Writer
	delay time.Duration
	size  int

	mu    sync.Mutex
	buf   []byte
	timer *time.Timer
}

// New returns a Writer over w; delay and size <= 0 take the defaults.
func New(w io.Writer, delay time.Duration, size int) *Writer {
	if delay <= 0 {
		delay = DefaultDelay
	}
	if size <= 0 {
		size = DefaultSize
	}
	return &Writer{w: w, delay: delay, size: size}
}

// routine reports whether the record p may wait: slog's informational and
// debug records, in its JSON or text form.
func routine(p []byte) bool {
	return bytes.Contains(p, []byte(`"level":"INFO"`)) || bytes.Contains(p, []byte(`"level":"DEBUG"`)) ||
		bytes.Contains(p, []byte(" level=INFO ")) || bytes.Contains(p, []byte(" level=DEBUG "))
}

// Write takes one record. It never fails: a failed write to w is the same
// loss it would be unbatched, and slog ignores it either way.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	switch {
	case !routine(p) || len(b.buf) >= b.size:
		b.flushLocked()
	case b.timer == nil:
		b.timer = time.AfterFunc(b.delay, b.Flush)
	}
	return len(p), nil
}

// Flush writes what waits now.
func (b *Writer) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

func (b *Writer) flushLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(b.buf) == 0 {
		return
	}
	_, _ = b.w.Write(b.buf)
	if cap(b.buf) > 4*b.size {
		b.buf = nil // a burst's buffer is not kept
	} else {
		b.buf = b.buf[:0]
	}
}
