package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// stop cancels the goroutine's own context and returns only once it has
// returned, even when the parent context lives on.
func TestGoStopWaits(t *testing.T) {
	t.Parallel()
	started, returned := make(chan struct{}), make(chan struct{})
	stop := Go(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // a final flush, say
		close(returned)
	})
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("fn did not start within 5s")
	}
	stop()
	select {
	case <-returned:
	default:
		t.Fatal("stop returned before fn did")
	}
	stop() // again: a no-op, not a panic or a hang
}

// Ending the parent context ends the goroutine too.
func TestGoFollowsParent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	stop := Go(ctx, func(ctx context.Context) { <-ctx.Done(); close(returned) })
	defer stop()
	cancel()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("fn did not return within 5s of its parent context ending")
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	var b Backoff // the zero value: 100ms doubling to 5s
	var got []time.Duration
	for range 8 {
		got = append(got, b.Next())
	}
	ms := time.Millisecond
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms}
	if !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	b.Reset()
	if d := b.Next(); d != 100*ms {
		t.Fatalf("after Reset: %v, want 100ms", d)
	}
	c := Backoff{Min: time.Second, Max: 3 * time.Second}
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		if d := c.Next(); d != want {
			t.Fatalf("Backoff{1s, 3s}: %v, want %v", d, want)
		}
	}
}

// Retry calls fn again after each failure, logging the wait; once fn made
// progress the waits start afresh; it returns when its context ends.
func TestRetry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var log bytes.Buffer
	calls := 0
	Retry(ctx, Backoff{Min: time.Millisecond, Max: 4 * time.Millisecond}, slog.New(slog.NewJSONHandler(&log, nil)), "lost",
		func(ctx context.Context, alive func()) error {
			switch calls++; calls {
			case 3:
				alive()
			case 5:
				cancel()
				<-ctx.Done()
				return ctx.Err()
			}
			return errors.New("connection lost")
		})
	if calls != 5 {
		t.Fatalf("fn called %d times, want 5", calls)
	}
	var waits []string
	for line := range strings.Lines(log.String()) {
		var rec struct{ Msg, Err, In string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Msg != "lost" || rec.Err != "connection lost" {
			t.Errorf("logged %s", line)
		}
		waits = append(waits, rec.In)
	}
	// 1ms, 2ms, then 1ms again after alive; no log once the context ended.
	if want := []string{"1ms", "2ms", "1ms", "2ms"}; !slices.Equal(waits, want) {
		t.Fatalf("waits logged %q, want %q", waits, want)
	}
}
