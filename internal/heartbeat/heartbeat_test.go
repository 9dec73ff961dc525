package heartbeat

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// recordingStore is a fake above the real store: it keeps every batch.
type recordingStore struct {
	mu      sync.Mutex
	batches [][]int64
	seen    map[int64]time.Time
	fail    error
}

func (s *recordingStore) TouchNodes(_ context.Context, pks []int64, seen []time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.batches = append(s.batches, slices.Clone(pks))
	if s.seen == nil {
		s.seen = map[int64]time.Time{}
	}
	for i, pk := range pks {
		s.seen[pk] = seen[i]
	}
	return nil
}

func TestCoalesces(t *testing.T) {
	st := &recordingStore{}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := New(st, Options{Now: func() time.Time { clock = clock.Add(time.Millisecond); return clock }})
	for range 1000 {
		for _, pk := range []int64{9, 3, 7} {
			r.Record(pk)
		}
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(st.batches) != 1 || !slices.Equal(st.batches[0], []int64{3, 7, 9}) {
		t.Fatalf("batches %v, want one sorted batch of 3 nodes", st.batches)
	}
	if !st.seen[7].Equal(clock) || !st.seen[9].Equal(clock.Add(-2*time.Millisecond)) {
		t.Errorf("not the latest times: %v (clock %v)", st.seen, clock)
	}
	if err := r.Flush(context.Background()); err != nil || len(st.batches) != 1 {
		t.Errorf("an empty flush wrote: %v %v", err, st.batches)
	}
}

func TestFailedFlushKeepsHeartbeats(t *testing.T) {
	st := &recordingStore{fail: errors.New("database down")}
	r := New(st, Options{})
	r.Record(1)
	r.Record(2)
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("flush reported success while the store failed")
	}
	r.Record(3)
	if r.Pending() != 3 {
		t.Fatalf("pending %d after a failed flush, want 3", r.Pending())
	}
	st.fail = nil
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.batches[0], []int64{1, 2, 3}) {
		t.Errorf("batch %v", st.batches)
	}
}

func TestRunFlushesOnStop(t *testing.T) {
	st := &recordingStore{}
	r := New(st, Options{Interval: time.Hour}) // only the final flush can write
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	r.Record(42)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if len(st.batches) != 1 || st.batches[0][0] != 42 {
		t.Errorf("no final flush: %v", st.batches)
	}
}

// PendingAge is the window a crash would lose: from the first heartbeat not
// yet written, kept across a failed flush, zero once a flush succeeds.
func TestPendingAge(t *testing.T) {
	st := &recordingStore{fail: errors.New("database down")}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := New(st, Options{Now: func() time.Time { return clock }})
	if got := r.PendingAge(); got != 0 {
		t.Fatalf("age %v with nothing pending", got)
	}
	r.Record(1)
	clock = clock.Add(300 * time.Millisecond)
	r.Record(2)
	clock = clock.Add(200 * time.Millisecond)
	if got := r.PendingAge(); got != 500*time.Millisecond {
		t.Fatalf("age %v, want 500ms (from the first heartbeat, not the latest)", got)
	}
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("flush reported success while the store failed")
	}
	clock = clock.Add(time.Second)
	if got := r.PendingAge(); got != 1500*time.Millisecond {
		t.Errorf("age %v after a failed flush, want 1.5s (the failed batch's first heartbeat)", got)
	}
	st.fail = nil
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := r.PendingAge(); got != 0 {
		t.Errorf("age %v after a flush wrote everything", got)
	}
}

type lostCounter struct {
	noObserver
	lost chan int
}

func (o lostCounter) HeartbeatsLost(n int) { o.lost <- n }

// A stop whose final flush fails reports the heartbeats it drops.
func TestRunCountsLostOnStop(t *testing.T) {
	st := &recordingStore{fail: errors.New("database down")}
	obs := lostCounter{lost: make(chan int, 1)}
	r := New(st, Options{Interval: time.Hour, Observer: obs})
	r.Record(1)
	r.Record(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	select {
	case n := <-obs.lost:
		if n != 2 {
			t.Errorf("lost %d, want 2", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no loss reported after a failed final flush")
	}
	<-done
}
