package logbatch

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the timer's goroutine, counting
// the writes it gets.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.b.Write(p)
}

func (s *syncBuffer) state() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String(), s.writes
}

func TestInfoWaitsWarnDoesNot(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			var out syncBuffer
			w := New(&out, time.Hour, 0)
			var h slog.Handler = slog.NewJSONHandler(w, nil)
			if format == "text" {
				h = slog.NewTextHandler(w, nil)
			}
			log := slog.New(h)
			log.Info("request", "n", 1)
			log.Info("request", "n", 2)
			if got, _ := out.state(); got != "" {
				t.Fatalf("info lines written at once: %q", got)
			}
			log.Warn("trouble")
			got, writes := out.state()
			lines := strings.Split(strings.TrimSpace(got), "\n")
			if writes != 1 || len(lines) != 3 || !strings.Contains(lines[0], "n=1") && !strings.Contains(lines[0], `"n":1`) ||
				!strings.Contains(lines[2], "trouble") {
				t.Fatalf("after a warning: %d writes of %q; want the two waiting lines then the warning, in one write", writes, got)
			}
		})
	}
}

func TestFlushAfterDelay(t *testing.T) {
	var out syncBuffer
	w := New(&out, 20*time.Millisecond, 0)
	log := slog.New(slog.NewJSONHandler(w, nil))
	for i := range 100 {
		log.Info("request", "i", i)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		got, writes := out.state()
		if strings.Count(got, "\n") == 100 {
			if writes != 1 {
				t.Errorf("%d writes for 100 lines within the delay, want 1", writes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lines not written within 2s of a 20ms delay: %d of 100", strings.Count(got, "\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFlushWhenFull(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 1000)
	log := slog.New(slog.NewJSONHandler(w, nil))
	for range 50 {
		log.Info("request", "path", strings.Repeat("x", 100))
	}
	got, writes := out.state()
	if writes < 4 || len(got) < 4000 {
		t.Fatalf("%d writes, %d bytes out: a full buffer must be written without waiting", writes, len(got))
	}
	w.Flush()
	if got, _ := out.state(); strings.Count(got, "\n") != 50 {
		t.Fatalf("after Flush %d lines, want 50", strings.Count(got, "\n"))
	}
}
