package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/registryd/registryd/client"
)

// MaxStale and NoCache send Cache-Control on reads; without them nothing
// is sent, so the read is consistent.
func TestCacheControlOptions(t *testing.T) {
	t.Parallel()
	s, ts := newScript(t, answer(200, nodeBody))
	c := newClient(t, ts.URL)
	ctx := t.Context()
	if _, err := c.GetNode(ctx, 7, client.MaxStale()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HeadNode(ctx, 7, client.NoCache()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(ctx, 7); err != nil {
		t.Fatal(err)
	}
	s2, ts2 := newScript(t, answer(200, "["+nodeBody+"]"))
	c2 := newClient(t, ts2.URL)
	if _, err := c2.ListNodes(ctx, client.NodeFilter{}, client.NoCache()); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.ListNodes(ctx, client.NodeFilter{}, client.MaxStale()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range append(s.headers, s2.headers...) {
		got = append(got, h.Get("Cache-Control"))
	}
	if want := []string{"max-stale", "no-cache", "", "no-cache", "max-stale"}; !slices.Equal(got, want) {
		t.Errorf("Cache-Control sent: %q, want %q", got, want)
	}
}

// withEventID answers a list with X-Event-Id: id.
func withEventID(id string, body string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if id != "" {
			w.Header().Set("X-Event-Id", id)
		}
		answer(200, body)(w, r)
	}
}

// ListNodesWithPosition returns the list's X-Event-Id; an answer without
// a position (or with one that is not a position) is ErrNoPosition.
func TestListNodesWithPosition(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, ts := newScript(t, withEventID("1042", "["+nodeBody+"]"))
	l, err := newClient(t, ts.URL).ListNodesWithPosition(ctx, client.NodeFilter{})
	if err != nil || l.EventID != 1042 || len(l.Nodes) != 1 || l.Nodes[0].PK != 7 {
		t.Errorf("list: %+v, %v", l, err)
	}
	for _, id := range []string{"", "x", "-1"} {
		_, ts := newScript(t, withEventID(id, "[]"))
		if _, err := newClient(t, ts.URL).ListNodesWithPosition(ctx, client.NodeFilter{}); !errors.Is(err, client.ErrNoPosition) {
			t.Errorf("X-Event-Id %q: %v", id, err)
		}
	}
}

func bookmark(id int64) string {
	return "id: " + itoa(int(id)) + "\nevent: bookmark\ndata: {\"last_event_id\":" + itoa(int(id)) + "}\n\n"
}

// Bookmarks are handed to the caller and move the position: a stream
// that brought only its opening bookmark is resumed from it, as is one
// whose last word was an idle bookmark, never without Last-Event-ID.
func TestWatchResumesFromBookmarks(t *testing.T) {
	t.Parallel()
	f := &sse{conns: []func(http.ResponseWriter, *http.Request){
		stream(false, "retry: 2000\n: watching\n\n", bookmark(7)),
		stream(false, bookmark(7), event(8, "updated", 1), bookmark(9)),
		hangUp,
		stream(true, bookmark(9), event(12, "deleted", 1)),
	}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	var opened []string
	got, err := collect(t, newClient(t, ts.URL, fast(1)), client.WatchOptions{Reconnect: time.Millisecond,
		Opened: func(after *int64) {
			if after == nil {
				opened = append(opened, "none")
			} else {
				opened = append(opened, itoa(int(*after)))
			}
		}}, 6)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("watch ended with %v", err)
	}
	var types []string
	for _, ev := range got {
		types = append(types, ev.Type)
		if ev.Type == client.EventBookmark && (ev.Bookmark == nil || ev.Bookmark.LastEventID != ev.ID) {
			t.Errorf("bookmark %+v", ev)
		}
	}
	if want := []string{"bookmark", "bookmark", "updated", "bookmark", "bookmark", "deleted"}; !slices.Equal(types, want) {
		t.Errorf("events %q, want %q", types, want)
	}
	if resumes, _ := f.seen(); !slices.Equal(resumes, []string{"", "7", "9", "9"}) {
		t.Errorf("Last-Event-Id sent: %q", resumes)
	}
	if want := []string{"none", "7", "9"}; !slices.Equal(opened, want) {
		t.Errorf("streams opened after %q, want %q (the hang-up opened none)", opened, want)
	}
}
