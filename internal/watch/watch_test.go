package watch

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// memStore is a fake above the real store: an in-memory change log that
// counts the event queries running at once.
type memStore struct {
	mu     sync.Mutex
	events []registry.NodeEvent
	pruned int64
	epoch  int64  // registry.Feed.Epoch
	why    string // why the epoch began, as the sequencer answers it

	delay            time.Duration // how long each NodeEventsAfter takes
	inflight, peak   atomic.Int64
	queries, horizon atomic.Int64
}

func (m *memStore) add(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range n {
		id := max(int64(len(m.events))+m.pruned, m.epoch) + 1
		if len(m.events) > 0 {
			id = max(m.events[len(m.events)-1].ID, m.epoch) + 1
		}
		m.events = append(m.events, registry.NodeEvent{ID: id, Kind: "updated", Node: registry.Node{PK: id}})
	}
}

// newEpoch begins an epoch of the feed at start, as a sequencing pass
// would, for the reason why.
func (m *memStore) newEpoch(start int64, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.epoch, m.why = start, why
}

func (m *memStore) SequenceEvents(ctx context.Context, _ int64) (registry.Feed, error) {
	f, err := m.EventHorizon(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	f.NewEpoch = m.why
	return f, err
}

func (m *memStore) NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error) {
	n := m.inflight.Add(1)
	defer m.inflight.Add(-1)
	for p := m.peak.Load(); n > p && !m.peak.CompareAndSwap(p, n); p = m.peak.Load() {
	}
	m.queries.Add(1)
	if m.delay > 0 {
		time.Sleep(m.delay) // the query's own duration, not synchronisation
	}
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

func (m *memStore) EventHorizon(context.Context) (registry.Feed, error) {
	m.horizon.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	latest := max(m.pruned, m.epoch)
	if len(m.events) > 0 {
		latest = max(latest, m.events[len(m.events)-1].ID)
	}
	return registry.Feed{Epoch: m.epoch, Pruned: m.pruned, Latest: latest}, nil
}

func (m *memStore) PruneEvents(context.Context, time.Time) (int64, error) { return 0, nil }

func (m *memStore) FeedPosition(ctx context.Context, _ int64) (int64, bool, error) {
	f, err := m.EventHorizon(ctx)
	return f.Latest, false, err
}

func (m *memStore) Listen(ctx context.Context, _ []string, fn func(string, string)) error {
	fn("", "")
	<-ctx.Done()
	return ctx.Err()
}

// frameSize is the size of every encoded test event.
const frameSize = 1024

// encoder encodes events as frames of frameSize bytes and counts its calls.
type encoder struct{ calls atomic.Int64 }

func (enc *encoder) encode(e registry.NodeEvent) ([]byte, error) {
	enc.calls.Add(1)
	b := fmt.Appendf(make([]byte, 0, frameSize), "id: %d\n", e.ID)
	for len(b) < frameSize {
		b = append(b, '.')
	}
	return b, nil
}

// run starts h until the test ends.
func run(t *testing.T, h *Hub) {
	t.Helper()
	t.Cleanup(lifecycle.Go(context.Background(), h.Run))
}

func subscribe(t *testing.T, h *Hub, principal string) Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.Subscribe(ctx, principal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// receiver drains a stream in the background, as a reading watcher does.
type receiver struct {
	ids    chan int64
	frames chan []byte
}

func receive(s Stream) *receiver {
	r := &receiver{ids: make(chan int64, 10_000), frames: make(chan []byte, 10_000)}
	go func() {
		for {
			select {
			case <-s.Done():
				return
			case <-s.Wake():
				_ = s.Next(func(e registry.NodeEvent, frame []byte) error {
					r.ids <- e.ID
					r.frames <- frame
					return nil
				})
			}
		}
	}()
	return r
}

// take waits for n ids, at most 5s.
func (r *receiver) take(t *testing.T, n int) []int64 {
	t.Helper()
	var got []int64
	deadline := time.After(5 * time.Second)
	for len(got) < n {
		select {
		case id := <-r.ids:
			got = append(got, id)
		case <-deadline:
			t.Fatalf("received %v, want %d events", got, n)
		}
	}
	return got
}

func isDone(s Stream) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// A subscriber that does not take its events is cut off once they pass
// its bound in bytes, not before; the others go on receiving everything.
func TestNonReadingSubscriberIsCutAtItsByteBound(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	const bound = 8 * frameSize
	h := New(st, Options{Encode: enc.encode, MaxPending: bound, Poll: 10 * time.Millisecond})
	run(t, h)
	slow := subscribe(t, h, "slow")
	fast := receive(subscribe(t, h, "fast"))

	st.add(8) // exactly the bound: still within it
	fast.take(t, 8)
	if isDone(slow) {
		t.Fatal("cut off with pending bytes at, not over, its bound")
	}
	st.add(1)
	fast.take(t, 1)
	select {
	case <-slow.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a subscriber over its byte bound was not cut off")
	}
	// The cut one gets nothing more; the other keeps receiving, in order.
	var got []int64
	for range 3 {
		st.add(4)
		got = append(got, fast.take(t, 4)...)
	}
	for i, id := range got {
		if id != int64(10+i) {
			t.Fatalf("fast subscriber got %v, want 10..21", got)
		}
	}
	if err := slow.Next(func(registry.NodeEvent, []byte) error { return errors.New("delivered after the cut") }); err != nil {
		t.Error(err)
	}
	// The window the hub keeps stays within the bound (plus one event).
	h.mu.Lock()
	defer h.mu.Unlock()
	if kept := int64(len(h.window)) * frameSize; kept > bound+frameSize {
		t.Errorf("the hub keeps %d bytes of events for a bound of %d", kept, bound)
	}
}

// A subscriber blocked on a client that does not read counts as lagging
// from the event it is stuck on.
func TestBlockedSubscriberIsCut(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, MaxPending: 4 * frameSize, Poll: 10 * time.Millisecond})
	run(t, h)
	stuck := subscribe(t, h, "stuck")
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	go func() {
		<-stuck.Wake()
		_ = stuck.Next(func(registry.NodeEvent, []byte) error {
			entered <- struct{}{}
			<-release // a write that does not return
			return errors.New("write timeout")
		})
	}()
	defer close(release)
	st.add(1)
	<-entered
	st.add(5)
	select {
	case <-stuck.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a subscriber stuck in a write was not cut off")
	}
}

// Each event is encoded once however many subscribers there are, and they
// all send the same bytes.
func TestEventsAreEncodedOnceAndShared(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, Poll: 10 * time.Millisecond})
	run(t, h)
	var rs []*receiver
	for i := range 50 {
		rs = append(rs, receive(subscribe(t, h, fmt.Sprint("p", i%10))))
	}
	st.add(10)
	var first [][]byte
	for i, r := range rs {
		r.take(t, 10)
		for j := range 10 {
			f := <-r.frames
			if i == 0 {
				first = append(first, f)
			} else if &f[0] != &first[j][0] {
				t.Fatalf("subscriber %d got its own copy of event %d", i, j+1)
			}
		}
	}
	if n := enc.calls.Load(); n != 10 {
		t.Errorf("%d encodings for 10 events and 50 subscribers", n)
	}
}

// A subscription costs a few hundred bytes, not a buffer allocated up
// front. Not parallel: it reads the heap.
func TestSubscriptionsAllocateNoBuffer(t *testing.T) {
	st := &memStore{}
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, MaxStreams: 5000, MaxPerPrincipal: 5000, Poll: time.Hour})
	run(t, h)
	subscribe(t, h, "warm-up")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	subs := make([]Stream, 0, 2000)
	for range 2000 {
		s, err := h.Subscribe(context.Background(), "p")
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 2000*2048 {
		t.Errorf("2000 subscriptions took %d bytes of heap (%d each)", grew, grew/2000)
	}
	for _, s := range subs {
		s.Close()
	}
}

// Beyond MaxStreams, or MaxPerPrincipal for one principal, Subscribe is
// refused with ErrTooMany; closing a stream frees its slot, and a stream
// cut off holds its slot until it is closed.
func TestStreamCaps(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, MaxStreams: 3, MaxPerPrincipal: 2, MaxPending: frameSize, Poll: 10 * time.Millisecond})
	run(t, h)
	ctx := context.Background()
	a1 := subscribe(t, h, "a")
	subscribe(t, h, "a")
	if _, err := h.Subscribe(ctx, "a"); !errors.Is(err, registry.ErrTooMany) {
		t.Fatalf("a third stream of one principal: %v", err)
	}
	subscribe(t, h, "b")
	if _, err := h.Subscribe(ctx, "c"); !errors.Is(err, registry.ErrTooMany) {
		t.Fatalf("a fourth stream in all: %v", err)
	}
	if h.Streams() != 3 {
		t.Errorf("%d streams", h.Streams())
	}
	// Cut off (it does not read), it still holds its slot...
	st.add(2)
	select {
	case <-a1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not cut off")
	}
	if _, err := h.Subscribe(ctx, "c"); !errors.Is(err, registry.ErrTooMany) {
		t.Fatalf("a stream cut off but not closed freed its slot: %v", err)
	}
	// ...until it is closed, once.
	a1.Close()
	a1.Close()
	if h.Streams() != 2 {
		t.Errorf("%d streams after a close", h.Streams())
	}
	subscribe(t, h, "a")
	if _, err := h.Subscribe(ctx, "c"); !errors.Is(err, registry.ErrTooMany) {
		t.Fatalf("over the total again: %v", err)
	}
}

// Backfills read the log in pages under a bound on concurrent queries, and
// never hold a slot while their client is being written to.
func TestBackfillsQueryTheStoreWithBoundedConcurrency(t *testing.T) {
	t.Parallel()
	st := &memStore{delay: 2 * time.Millisecond}
	st.add(230)
	enc := &encoder{}
	const concurrency, page, backfills = 2, 40, 30
	h := New(st, Options{Encode: enc.encode, BackfillConcurrency: concurrency, BackfillPage: page})

	// One client is stuck: its first write never returns until the end.
	stuck := make(chan struct{})
	defer close(stuck)
	stuckIn := make(chan struct{})
	go func() {
		_ = h.Backfill(context.Background(), 0, 200, func(registry.NodeEvent, []byte) error {
			close(stuckIn)
			<-stuck
			return errors.New("write timeout")
		})
	}()
	<-stuckIn

	// Each resumes from its own id, different modulo the page size, so none
	// can use pages another read.
	var wg sync.WaitGroup
	errs := make(chan error, backfills)
	for i := range backfills {
		wg.Go(func() {
			from := int64(i + 1)
			want := from + 1
			err := h.Backfill(context.Background(), from, from+200, func(e registry.NodeEvent, frame []byte) error {
				if e.ID != want || len(frame) != frameSize {
					return fmt.Errorf("got event %d (%d bytes), want %d", e.ID, len(frame), want)
				}
				want++
				return nil
			})
			if err == nil && want != from+201 {
				err = fmt.Errorf("backfill from %d stopped at %d", from, want-1)
			}
			errs <- err
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("backfills did not finish while one client was stuck")
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := st.peak.Load(); p != concurrency {
		t.Errorf("at most %d event queries ran at once, want exactly the bound %d", p, concurrency)
	}
	if q := st.queries.Load(); q < backfills*200/page {
		t.Errorf("%d queries: pages larger than %d?", q, page)
	}
}

// A crowd resuming from the same id reads each page once (or once per
// slot, when two miss together) and sends the same encoded bytes.
func TestConcurrentBackfillsSharePages(t *testing.T) {
	t.Parallel()
	st := &memStore{delay: time.Millisecond}
	st.add(205) // 10 full pages and a short one, which is never kept
	enc := &encoder{}
	const concurrency, page, backfills = 2, 20, 50
	h := New(st, Options{Encode: enc.encode, BackfillConcurrency: concurrency, BackfillPage: page})
	frames := make([][][]byte, backfills)
	var wg sync.WaitGroup
	for i := range backfills {
		wg.Go(func() {
			_ = h.Backfill(context.Background(), 0, 205, func(e registry.NodeEvent, frame []byte) error {
				frames[i] = append(frames[i], frame)
				return nil
			})
		})
	}
	wg.Wait()
	for i := range backfills {
		if len(frames[i]) != 205 {
			t.Fatalf("backfill %d got %d events", i, len(frames[i]))
		}
		for j := range 200 {
			if &frames[i][j][0] != &frames[0][j][0] {
				t.Fatalf("backfill %d encoded event %d again", i, j+1)
			}
		}
	}
	if q := st.queries.Load(); q > concurrency*10+backfills {
		t.Errorf("%d queries for %d backfills of the same 10 full pages", q, backfills)
	}
	if n := enc.calls.Load(); n > concurrency*200+backfills*5 {
		t.Errorf("%d encodings for %d backfills of the same 205 events", n, backfills)
	}
}

func TestBackfill(t *testing.T) {
	t.Parallel()
	st := &memStore{pruned: 10}
	st.add(5) // ids 11..15
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, BackfillPage: 2})
	var ids []int64
	err := h.Backfill(context.Background(), 11, 14, func(e registry.NodeEvent, _ []byte) error {
		ids = append(ids, e.ID)
		return nil
	})
	if err != nil || len(ids) != 3 || ids[0] != 12 || ids[2] != 14 {
		t.Fatalf("backfill (11, 14]: %v %v", ids, err)
	}
	if err := h.Backfill(context.Background(), 9, 15, func(registry.NodeEvent, []byte) error { return nil }); err != ErrTooOld {
		t.Errorf("resume below the pruned horizon: %v", err)
	}
	// A canceled backfill waiting for a slot gives up.
	h.backfills <- struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Backfill(ctx, 11, 15, func(registry.NodeEvent, []byte) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled while waiting for a slot: %v", err)
	}
}

// When the hub stops, every stream ends, and a late subscriber gets a
// stream that has already ended.
func TestStopEndsStreams(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	h := New(st, Options{Encode: enc.encode, Poll: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	s := subscribe(t, h, "a")
	cancel()
	<-done
	if !isDone(s) {
		t.Error("a stream outlived the hub")
	}
	if late := subscribe(t, h, "a"); !isDone(late) {
		t.Error("a stream opened after the hub stopped is live")
	}
}

func TestNewRequiresEncode(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("New without Encode did not panic")
		}
	}()
	New(&memStore{}, Options{})
}

// The page cache stays within its budget, dropping the least recently
// used page first.
func TestPageCacheBudget(t *testing.T) {
	t.Parallel()
	c := pageCache{budget: 3 * frameSize, byAfter: map[int64]*list.Element{}}
	for after := range int64(3) {
		c.put(&page{after: after, bytes: frameSize})
	}
	c.get(0) // now 1 is the least recently used
	c.put(&page{after: 3, bytes: frameSize})
	if c.get(1) != nil || c.get(0) == nil || c.get(2) == nil || c.get(3) == nil {
		t.Error("the least recently used page was not the one dropped")
	}
	if c.put(&page{after: 9, bytes: 4 * frameSize}); c.get(9) != nil {
		t.Error("a page over the whole budget was kept")
	}
	if c.size > c.budget {
		t.Errorf("size %d over budget %d", c.size, c.budget)
	}
	p := &page{after: 2, bytes: frameSize}
	if got := c.put(p); got == p {
		t.Error("a second page for the same id replaced the first")
	}
}

// follows records what a Follower is told, in order.
type follows struct {
	mu  sync.Mutex
	log []string
}

func (f *follows) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf(format, args...))
}

func (f *follows) Start(last int64) { f.note("start %d", last) }
func (f *follows) Apply(events []registry.NodeEvent) {
	for _, e := range events {
		f.note("apply %d", e.ID)
	}
}
func (f *follows) Sequenced(time.Time, int64) {}
func (f *follows) Listening(bool)             {}
func (f *follows) Gap(reason string) {
	f.note("gap %s", reason[:min(len(reason), len("the change feed began a new epoch"))])
}
func (f *follows) Notified(string, string) {}
func (f *follows) lines() []string         { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.log) }

// When the sequencer finds a new epoch of the feed, the hub starts over
// in it: the follower drops what it applied (Gap) and starts at the
// epoch's start before any event of the epoch, every open subscription
// ends with a reset to that start, cached backfill pages go, and a resume
// from an id of the old epoch is refused with ErrOtherEpoch. Faults caught
// (each tried once): subscriptions cut without a reset (Reset answers "");
// the follower started at the old position (the epoch's events applied
// after "start 3").
func TestNewEpochResetsFollowerAndSubscribers(t *testing.T) {
	t.Parallel()
	st := &memStore{}
	enc := &encoder{}
	f := &follows{}
	h := New(st, Options{Encode: enc.encode, Poll: 10 * time.Millisecond, BackfillPage: 1, Follower: f})
	run(t, h)
	sub := subscribe(t, h, "a")
	got := receive(sub)
	st.add(3)
	got.take(t, 3)
	if err := h.Backfill(context.Background(), 0, 3, func(registry.NodeEvent, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if pagesSize(h) == 0 {
		t.Fatal("no backfill page cached")
	}
	const start = 1 << 40
	st.newEpoch(start, "the event sequence went backwards")
	st.add(2)
	select {
	case <-sub.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an open subscription outlived the new epoch by 5 s")
	}
	reason, last := sub.Reset()
	if !strings.HasPrefix(reason, "the change feed began a new epoch") || last != start {
		t.Errorf("Reset() = %q, %d; want the reason and %d", reason, last, start)
	}
	want := []string{"start 0", "apply 1", "apply 2", "apply 3",
		"gap the change feed began a new epoch",
		fmt.Sprintf("start %d", start), fmt.Sprintf("apply %d", start+1), fmt.Sprintf("apply %d", start+2)}
	deadline := time.Now().Add(5 * time.Second)
	for len(f.lines()) < len(want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if diff := cmp.Diff(want, f.lines()); diff != "" {
		t.Errorf("the follower was told (-want +got):\n%s", diff)
	}
	if pagesSize(h) != 0 {
		t.Errorf("after the reset: %d bytes of pages cached", pagesSize(h))
	}
	err := h.Backfill(context.Background(), 2, start+2, func(registry.NodeEvent, []byte) error { return nil })
	if !errors.Is(err, ErrOtherEpoch) || !errors.Is(err, registry.ErrGone) {
		t.Errorf("a resume from the old epoch: %v", err)
	}
	// A new subscription gets the epoch's events.
	fresh := subscribe(t, h, "a")
	st.add(1)
	if ids := receive(fresh).take(t, int(start+3-fresh.Last())); fresh.Last() < start || ids[len(ids)-1] != start+3 {
		t.Errorf("a new subscription after %d got %v", fresh.Last(), ids)
	}
}

func pagesSize(h *Hub) int {
	h.pages.mu.Lock()
	defer h.pages.mu.Unlock()
	return h.pages.size
}

// Renewed events are a few bytes a node on the wire but hold every node
// they renew: they count the nodes against MaxPending, so the window the
// hub keeps for a subscriber that does not read stays bounded in nodes,
// and fanOut broadcasts a burst of them in pieces of at most half the
// bound, so a subscriber that reads is not cut off by one. Faults caught
// (each tried once): a renewal counted by its encoding alone (the window
// held the whole burst's nodes); a burst broadcast at once (the reading
// subscriber cut off).
func TestRenewalsCountTheirNodes(t *testing.T) {
	t.Parallel()
	st := &memStore{delay: 20 * time.Millisecond} // a query's time, in which a reader reads
	enc := &encoder{}
	const bound = 1 << 20
	h := New(st, Options{Encode: enc.encode, MaxPending: bound, Poll: 10 * time.Millisecond})
	run(t, h)
	idle := subscribe(t, h, "idle")
	reading := subscribe(t, h, "reader")
	reader := receive(reading)
	const renewals, nodes = 40, 64 // 64 nodes × 512 bytes: 32 KiB each, 1.3 MiB in all
	st.mu.Lock()
	for i := range renewals {
		e := registry.NodeEvent{ID: int64(i + 1), Kind: registry.EventRenewed, Nodes: make([]registry.Node, nodes)}
		for j := range e.Nodes {
			e.Nodes[j] = registry.Node{PK: int64(j + 1)}
		}
		e.Node = e.Nodes[0]
		st.events = append(st.events, e)
	}
	st.mu.Unlock()
	reader.take(t, renewals)
	if isDone(reading) {
		t.Error("the subscriber that reads was cut off")
	}
	select {
	case <-idle.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a subscriber that never read was not cut off")
	}
	h.mu.Lock()
	held := 0
	for _, e := range h.window {
		held += len(e.Nodes)
	}
	h.mu.Unlock()
	if limit := bound/heldNodeBytes + nodes; held > limit {
		t.Errorf("the hub keeps %d nodes of renewals for a bound of %d bytes (at most %d)", held, bound, limit)
	}
}
