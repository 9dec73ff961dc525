package watch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// memStore is a fake above the real store: an in-memory change log.
type memStore struct {
	mu     sync.Mutex
	events []registry.NodeEvent
	pruned int64
}

func (m *memStore) add(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range n {
		id := int64(len(m.events)) + 1 + m.pruned
		m.events = append(m.events, registry.NodeEvent{ID: id, Kind: "updated", Node: registry.Node{PK: id}})
	}
}

func (m *memStore) SequenceEvents(context.Context) (int64, error) { return 0, nil }

func (m *memStore) NodeEventsAfter(_ context.Context, after int64, limit int) ([]registry.NodeEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []registry.NodeEvent
	for _, e := range m.events {
		if e.ID > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (m *memStore) EventHorizon(context.Context) (int64, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	latest := m.pruned
	if len(m.events) > 0 {
		latest = m.events[len(m.events)-1].ID
	}
	return m.pruned, latest, nil
}

func (m *memStore) PruneEvents(context.Context, time.Time) (int64, error) { return 0, nil }

func (m *memStore) Listen(ctx context.Context, _ []string, fn func(string, string)) error {
	fn("", "")
	<-ctx.Done()
	return ctx.Err()
}

func TestSlowSubscriberIsCutOthersGoOn(t *testing.T) {
	st := &memStore{}
	h := New(st, Options{Buffer: 8, Poll: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	slow, slowCut, _, slowClose, err := h.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slowClose()
	fast, _, _, fastClose, _ := h.Subscribe(ctx)
	defer fastClose()
	_ = slow

	var got []int64
	deadline := time.After(5 * time.Second)
	for len(got) < 20 { // 20 events in batches of 4: more than the slow one's buffer of 8
		st.add(4)
		for want := len(got) + 4; len(got) < want; {
			select {
			case e := <-fast:
				got = append(got, e.ID)
			case <-deadline:
				t.Fatalf("fast subscriber got %v", got)
			}
		}
	}
	for i, id := range got {
		if id != int64(i+1) {
			t.Fatalf("fast subscriber got %v, want 1..20 in order", got)
		}
	}
	select {
	case <-slowCut:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow subscriber was not cut off")
	}
}

func TestBackfill(t *testing.T) {
	st := &memStore{pruned: 10}
	st.add(5) // ids 11..15
	h := New(st, Options{})
	var ids []int64
	err := h.Backfill(context.Background(), 11, 14, func(e registry.NodeEvent) error {
		ids = append(ids, e.ID)
		return nil
	})
	if err != nil || len(ids) != 3 || ids[0] != 12 || ids[2] != 14 {
		t.Fatalf("backfill (11, 14]: %v %v", ids, err)
	}
	if err := h.Backfill(context.Background(), 9, 15, func(registry.NodeEvent) error { return nil }); err != ErrTooOld {
		t.Errorf("resume below the pruned horizon: %v", err)
	}
}
