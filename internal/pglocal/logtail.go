package pglocal

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// logTail keeps the last lines the server printed. The server's own log file
// would have to live somewhere the server user may write, so instead we read
// its output ourselves and keep enough of it to explain a failed start.
type logTail struct {
	mu    sync.Mutex
	lines []string
	max   int
}

func (t *logTail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == t.max {
		// Drop the oldest line in place; for a few hundred lines the copy
		// is simpler than the index arithmetic of a true ring.
		t.lines = append(t.lines[:0], t.lines[1:]...)
	}
	t.lines = append(t.lines, line)
}

// last returns up to n of the most recent lines, one per line.
func (t *logTail) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines[max(0, len(t.lines)-n):], "\n")
}

// follow copies r into the tail and, line by line, to logger at debug level
// until EOF, which comes once every process holding the pipe has exited.
func (t *logTail) follow(r io.ReadCloser, logger *slog.Logger) {
	defer r.Close()
	br := bufio.NewReader(r) // not a Scanner: a long line must not stop the copy
	for {
		line, err := br.ReadString('\n')
		if line = strings.TrimRight(line, "\r\n"); line != "" {
			t.add(line)
			logger.LogAttrs(context.Background(), slog.LevelDebug, "postgres", slog.String("line", line))
		}
		if err != nil {
			return
		}
	}
}
