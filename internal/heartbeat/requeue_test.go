package heartbeat

import (
	"context"
	"errors"
	"testing"
	"time"
)

// hookStore runs touch for every batch.
type hookStore struct {
	touch func(pks []int64, seen []time.Time) error
}

func (s *hookStore) TouchNodes(_ context.Context, pks []int64, seen []time.Time) error {
	return s.touch(pks, seen)
}

// A heartbeat that arrives while a flush is failing is newer than the one
// in the failed batch: putting the batch back must keep the newer time.
// Fault caught: re-queueing the failed batch over pending heartbeats
// (r.pending[pk] = t without comparing), which moves a node's last_seen
// back to an older time.
func TestFailedFlushKeepsNewerHeartbeat(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := New(nil, Options{Now: func() time.Time { return clock }})
	var written map[int64]time.Time
	r.store = &hookStore{touch: func(pks []int64, seen []time.Time) error {
		if written == nil { // the first flush: a newer beat comes in, then it fails
			clock = clock.Add(time.Second)
			r.Record(7)
			written = map[int64]time.Time{}
			return errors.New("database down")
		}
		for i, pk := range pks {
			written[pk] = seen[i]
		}
		return nil
	}}
	old := clock
	r.Record(7)
	r.Record(8)
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("the failing flush reported success")
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := written[7], old.Add(time.Second); !got.Equal(want) {
		t.Errorf("node 7 written as seen at %v, want the newer %v", got, want)
	}
	if got := written[8]; !got.Equal(old) {
		t.Errorf("node 8 written as seen at %v, want %v (kept from the failed batch)", got, old)
	}
}
