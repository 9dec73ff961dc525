package api_test

import (
	"fmt"
	"testing"
	"time"
)

// Resuming at the log's edge: a Last-Event-ID equal to the newest event
// resumes with no reset; one past it, by one or by far, is an id this
// registry never issued and gets a reset naming the newest event at once.
// Every stream then goes on live. TestWatchFiltersAndErrors resumes only
// far ahead, so a boundary off by one passed it.
func TestWatchResumeAtTheNewestEvent(t *testing.T) {
	b := setup(t)
	w := watchStream(t, b.url, "", b.token)
	b.createNode(map[string]any{"index": 0})
	b.createNode(map[string]any{"index": 1})
	w.next()
	newest := w.next().ID
	streams := map[string]*stream{}
	for _, tc := range []struct {
		name  string
		id    int64
		reset bool
	}{
		{"the newest event", newest, false},
		{"one past the newest", newest + 1, true},
		{"far past the newest", newest + 1_000_000, true},
	} {
		s := watchStream(t, b.url, "", b.token, "Last-Event-ID", fmt.Sprint(tc.id))
		streams[tc.name] = s
		if !tc.reset {
			continue
		}
		select {
		case e := <-s.events:
			if e.Type != "reset" || e.ID != newest || e.Data["last_event_id"] != float64(newest) {
				t.Fatalf("Last-Event-ID %d (%s): first event %+v, want a reset to %d", tc.id, tc.name, e, newest)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Last-Event-ID %d (%s): no reset within 5s", tc.id, tc.name)
		}
	}
	pk := b.createNode(map[string]any{"index": 2})
	for name, s := range streams {
		if e := s.next(); e.Type != "created" || e.nodePK() != pk || e.ID <= newest {
			t.Errorf("resumed at %s: %+v, want node %d created (and no reset before it)", name, e, pk)
		}
	}
}
