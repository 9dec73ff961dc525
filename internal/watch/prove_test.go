package watch

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// positionStore is a memStore whose FeedPosition takes a while and is
// counted.
type positionStore struct {
	memStore
	lookups atomic.Int64
}

func (p *positionStore) FeedPosition(ctx context.Context, seen int64) (int64, bool, error) {
	p.lookups.Add(1)
	time.Sleep(50 * time.Millisecond)
	return p.memStore.FeedPosition(ctx, seen)
}

// proofs records the newest proof a follower got.
type proofs struct {
	noFollower
	mu sync.Mutex
	at time.Time
}

func (p *proofs) Sequenced(at time.Time, _ int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.After(p.at) {
		p.at = at
	}
}

func (p *proofs) proven(since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.at.Before(since)
}

// await asks h for proof as of now and reports whether the follower got
// it within 5 s.
func (p *proofs) await(h *Hub) bool {
	since := time.Now()
	h.Prove(since)
	for deadline := time.Now().Add(5 * time.Second); !p.proven(since); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// startProver runs a hub on a positionStore whose follower records
// proofs, with the sequencer's poll out of the way (an hour).
func startProver(t *testing.T) (*positionStore, *proofs, *Hub) {
	t.Helper()
	st := &positionStore{}
	follower := &proofs{}
	h := New(st, Options{Encode: (&encoder{}).encode, Poll: time.Hour, Follower: follower})
	run(t, h)
	<-h.ready
	return st, follower, h
}

// Reads arriving together share look-ups: 200 readers, each needing a
// proof from a look-up that started after it arrived, are all proven by a
// handful of look-ups, not one each.
func TestProveSharesLookups(t *testing.T) {
	t.Parallel()
	st, follower, h := startProver(t)
	base := st.lookups.Load()
	var wg sync.WaitGroup
	var late atomic.Int64
	for range 200 {
		wg.Go(func() {
			if !follower.await(h) {
				late.Add(1)
			}
		})
	}
	wg.Wait()
	if n := late.Load(); n > 0 {
		t.Fatalf("%d readers not proven within 5 s", n)
	}
	if n := st.lookups.Load() - base; n < 1 || n > 3 {
		t.Fatalf("%d look-ups for 200 readers arriving together, want 1 to 3", n)
	}
}

// A look-up that finds nothing new (the feed's position at or below what
// the hub read) sends no read of the change log: on an idle feed every
// burst of consistent reads costs one query, not two. One that finds the
// feed ahead does wake the reader of the log.
func TestProveReadsTheLogOnlyWhenBehind(t *testing.T) {
	t.Parallel()
	st, follower, h := startProver(t)
	prove := func() {
		t.Helper()
		if !follower.await(h) {
			t.Fatal("not proven within 5 s")
		}
	}
	prove()
	time.Sleep(20 * time.Millisecond) // a log read the proof woke would be done
	base := st.queries.Load()
	for range 5 {
		prove()
	}
	time.Sleep(20 * time.Millisecond)
	if n := st.queries.Load() - base; n != 0 {
		t.Fatalf("%d reads of the change log for 5 look-ups on an idle feed, want 0", n)
	}
	st.add(1) // an event the hub has not read
	prove()
	for deadline := time.Now().Add(5 * time.Second); st.queries.Load() == base; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-up that found the feed ahead did not wake the log reader within 5 s")
		}
	}
}
