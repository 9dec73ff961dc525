package client_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
)

// fleet is a fake registryd that keeps the watch contract: lists carry
// X-Event-Id, a watch replays the events after its Last-Event-ID, opens
// with a bookmark and sends one when idle, and answers a position it
// cannot vouch for (older than its epoch) with a reset. It can drop every
// stream and fail over to a new epoch that lost the newest events.
type fleet struct {
	mu      sync.Mutex
	log     []fleetEvent // every event of the current epoch's history, in id order
	pos     int64        // the newest event id (or the epoch's start)
	floor   int64        // the oldest position a watch may resume after
	epoch   int
	silent  bool          // the last failover ended streams without a reset
	lag     int64         // lists say they are this much behind what they show
	wake    chan struct{} // closed and replaced on every change
	drop    chan struct{} // closed and replaced to drop every stream
	lists   int
	resumes []string // the Last-Event-Id of every watch request
}

type fleetEvent struct {
	id      int64
	kind    client.NodeEventKind
	node    client.Node
	renewal *client.LeaseRenewal // for renewed
}

func newFleet(t *testing.T) (*fleet, *httptest.Server) {
	f := &fleet{wake: make(chan struct{}), drop: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/nodes/list", f.list)
	mux.HandleFunc("GET /v1/nodes/watch", f.watch)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return f, ts
}

// truth is the fleet as its events make it, and its position.
func (f *fleet) truth() (map[int64]client.Node, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nodes := map[int64]client.Node{}
	for _, ev := range f.log {
		if ev.renewal != nil {
			for _, v := range ev.renewal.Nodes {
				if n, ok := nodes[v.PK]; ok {
					lease := ev.renewal.LeaseExpiresAt
					n.LeaseExpiresAt, n.UpdatedAt, n.Version = &lease, ev.renewal.At, v.Version
					nodes[v.PK] = n
				}
			}
			continue
		}
		if ev.kind == client.EventDeleted {
			delete(nodes, ev.node.PK)
		} else {
			nodes[ev.node.PK] = ev.node
		}
	}
	return nodes, f.pos
}

// write records a change of node pk (version v) as an event.
func (f *fleet) write(kind client.NodeEventKind, pk, v int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pos++
	n := client.Node{PK: pk, IP: "10.0.0.1", Index: int32(pk), Source: client.SourceAPI, State: client.StateFree,
		Schedulable: true, Version: v, CreatedAt: time.Unix(pk, 0).UTC(), UpdatedAt: time.Unix(v, 0).UTC()}
	f.log = append(f.log, fleetEvent{id: f.pos, kind: kind, node: n})
	f.changed()
}

// renew records a renewal of job's leases moving nodes (pk: new version)
// as one renewed event.
func (f *fleet) renew(job int64, versions map[int64]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pos++
	r := &client.LeaseRenewal{Kind: client.EventRenewed, At: time.Unix(f.pos, 0).UTC(), Job: job,
		LeaseExpiresAt: time.Unix(f.pos+60, 0).UTC()}
	for _, pk := range slices.Sorted(maps.Keys(versions)) {
		r.Nodes = append(r.Nodes, client.NodeVersion{PK: pk, Version: versions[pk]})
	}
	f.log = append(f.log, fleetEvent{id: f.pos, kind: client.EventRenewed, renewal: r})
	f.changed()
}

func (f *fleet) changed() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// failover loses the newest n events, as a failover to a standby that
// had not received them does, and starts a new epoch whose ids are
// larger than any before. Open streams get a reset and end, or with
// silent they end without one (their replica died), and their
// resumption gets it.
func (f *fleet) failover(n int, silent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = f.log[:len(f.log)-n]
	f.pos += 1000
	f.floor = f.pos
	f.epoch++
	f.silent = silent
	f.changed()
}

// dropStreams ends every open stream.
func (f *fleet) dropStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.drop)
	f.drop = make(chan struct{})
}

func (f *fleet) seen() (lists int, resumes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists, slices.Clone(f.resumes)
}

func (f *fleet) list(w http.ResponseWriter, r *http.Request) {
	nodes, pos := f.truth()
	f.mu.Lock()
	f.lists++
	pos -= f.lag
	f.mu.Unlock()
	w.Header().Set("X-Event-Id", strconv.FormatInt(pos, 10))
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(byPK(nodes))
}

func (f *fleet) watch(w http.ResponseWriter, r *http.Request) {
	last := r.Header.Get("Last-Event-Id")
	f.mu.Lock()
	f.resumes = append(f.resumes, last)
	epoch, after, drop := f.epoch, f.pos, f.drop
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(format string, args ...any) bool {
		fmt.Fprintf(w, format, args...)
		return http.NewResponseController(w).Flush() == nil
	}
	if last != "" {
		id, _ := strconv.ParseInt(last, 10, 64)
		after = id
		f.mu.Lock()
		if id < f.floor || id > f.pos {
			after = f.pos
			f.mu.Unlock()
			if !send("id: %d\nevent: reset\ndata: {\"reason\":\"cannot vouch\",\"last_event_id\":%d}\n\n", after, after) {
				return
			}
		} else {
			f.mu.Unlock()
		}
	}
	bookmark := true
	idle := time.NewTicker(50 * time.Millisecond)
	defer idle.Stop()
	for {
		f.mu.Lock()
		select {
		case <-drop:
			// Dropped: send nothing more, even what woke it. Checked
			// under f.mu, as dropStreams closes it: a write made after a
			// drop is never sent on the dropped stream (so the client
			// must resume to get it, and the test can count resumes).
			f.mu.Unlock()
			return
		default:
		}
		var todo []fleetEvent
		for _, ev := range f.log {
			if ev.id > after {
				todo = append(todo, ev)
			}
		}
		reset, silent := f.epoch != epoch, f.silent
		epoch = f.epoch
		wake, pos := f.wake, f.pos
		f.mu.Unlock()
		if reset && silent {
			return
		}
		if reset { // as registryd does: a reset, then the stream ends
			send("id: %d\nevent: reset\ndata: {\"reason\":\"new epoch\",\"last_event_id\":%d}\n\n", pos, pos)
			return
		}
		for _, ev := range todo {
			data, _ := json.Marshal(client.NodeEvent{Kind: ev.kind, At: time.Unix(ev.id, 0).UTC(), Node: ev.node})
			if ev.renewal != nil {
				data, _ = json.Marshal(ev.renewal)
			}
			if !send("id: %d\nevent: %s\ndata: %s\n\n", ev.id, ev.kind, data) {
				return
			}
			after = ev.id
		}
		if bookmark && !send("id: %d\nevent: bookmark\ndata: {\"last_event_id\":%d}\n\n", after, after) {
			return
		}
		bookmark = false
		select {
		case <-wake:
		case <-idle.C:
			bookmark = true
		case <-drop:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// byPK is nodes in pk order, as lists and Informer.Nodes give them.
func byPK(nodes map[int64]client.Node) []client.Node {
	return slices.SortedFunc(maps.Values(nodes), func(a, b client.Node) int { return cmp.Compare(a.PK, b.PK) })
}

// converged waits until the informer's view is the fleet's truth, at the
// fleet's position.
func converged(t *testing.T, f *fleet, in *client.Informer, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, pos := f.truth()
		view, at := in.Nodes()
		want := byPK(nodes)
		diff := gocmp.Diff(want, view)
		if at != pos {
			diff += fmt.Sprintf("position %d, want %d", at, pos)
		}
		switch {
		case diff == "":
			return
		case time.Now().After(deadline):
			t.Fatalf("%s: the view is not the fleet's within 10s (-fleet +view):\n%s", what, diff)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runInformer runs in until the test ends and checks how it ended.
func runInformer(t *testing.T, in *client.Informer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("informer ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the informer did not stop within 10s of its context")
		}
	})
	select {
	case <-in.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the informer did not sync within 10s")
	}
}

// The informer's view is the fleet after writes, after its stream is
// dropped while writes go on (it resumes with Last-Event-ID, every time),
// and after a failover that lost events it had applied (the reset makes
// it list again). Readers meanwhile see whole views (the race detector
// watches them).
func TestInformerConverges(t *testing.T) {
	t.Parallel()
	f, ts := newFleet(t)
	for pk := int64(1); pk <= 5; pk++ {
		f.write(client.EventCreated, pk, 1)
	}
	var mu sync.Mutex
	var listed, applied int
	in := client.NewInformer(newClient(t, ts.URL, fast(2)), client.InformerOptions{Reconnect: time.Millisecond,
		Handler: func(u client.InformerUpdate) {
			mu.Lock()
			defer mu.Unlock()
			if u.Listed {
				listed++
			} else {
				applied++
			}
		}})
	runInformer(t, in)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			view, at := in.Nodes()
			if n, ok := in.Get(1); ok && n.PK != 1 || at < 0 && len(view) > 0 {
				t.Errorf("a read saw %+v, %d nodes at %d", n, len(view), at)
			}
		}
	}()
	defer func() { close(stop); readers.Wait() }()
	converged(t, f, in, "after the first list")

	f.write(client.EventUpdated, 1, 2)
	f.write(client.EventDeleted, 2, 1)
	f.write(client.EventCreated, 6, 1)
	converged(t, f, in, "after writes")

	for round := range 3 {
		f.dropStreams()
		f.write(client.EventClaimed, 3, int64(2+round))
		f.write(client.EventCreated, int64(7+round), 1)
		converged(t, f, in, fmt.Sprintf("after dropped stream %d", round+1))
	}
	lists, resumes := f.seen()
	if lists != 1 {
		t.Errorf("%d lists before any reset, want 1", lists)
	}
	if len(resumes) < 4 || slices.Contains(resumes, "") {
		t.Errorf("Last-Event-Id of the watch requests: %q, want one on every request", resumes)
	}

	// The informer applied the last three events; the failover loses them.
	f.write(client.EventUpdated, 4, 2)
	f.write(client.EventDeleted, 5, 1)
	f.write(client.EventCreated, 20, 1)
	converged(t, f, in, "before the failover")
	f.failover(3, false)
	f.write(client.EventUpdated, 1, 3)
	converged(t, f, in, "after a failover that lost events")
	if lists, _ := f.seen(); lists != 2 {
		t.Errorf("%d lists after one reset, want 2", lists)
	}
	if _, ok := in.Get(20); ok {
		t.Error("node 20, created by a lost event, is still in the view")
	}
	mu.Lock()
	defer mu.Unlock()
	if listed != 2 || applied == 0 {
		t.Errorf("handler: %d lists, %d events", listed, applied)
	}
}

// A watch that opens with a reset (its position is one the fleet cannot
// vouch for) makes the informer list again.
func TestInformerRelistsOnReset(t *testing.T) {
	t.Parallel()
	f, ts := newFleet(t)
	f.write(client.EventCreated, 1, 1)
	in := client.NewInformer(newClient(t, ts.URL, fast(2)), client.InformerOptions{Reconnect: time.Millisecond})
	runInformer(t, in)
	converged(t, f, in, "at start")
	f.failover(1, true)
	f.write(client.EventCreated, 2, 1)
	converged(t, f, in, "after a failover that lost the only node's creation")
	lists, resumes := f.seen()
	if lists != 2 || slices.Contains(resumes, "") {
		t.Errorf("%d lists, Last-Event-Id %q", lists, resumes)
	}
}

// A list refused for a while (503 with Retry-After, past the client's own
// retries) is tried again until it succeeds; a refusal retrying cannot
// cure ends Run with it.
func TestInformerRetriesAndGivesUp(t *testing.T) {
	t.Parallel()
	f, ts := newFleet(t)
	f.write(client.EventCreated, 1, 1)
	var mu sync.Mutex
	refusals := 3
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		refuse := r.URL.Path == "/v1/nodes/list" && refusals > 0
		if refuse {
			refusals--
		}
		mu.Unlock()
		if refuse {
			problem(http.StatusServiceUnavailable, "0")(w, r)
			return
		}
		ts.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	in := client.NewInformer(newClient(t, front.URL, fast(1)), client.InformerOptions{Reconnect: time.Millisecond})
	runInformer(t, in)
	converged(t, f, in, "after three refused lists")

	_, denied := newScript(t, problem(http.StatusForbidden, ""))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := client.NewInformer(newClient(t, denied.URL, fast(1)), client.InformerOptions{}).Run(ctx)
	if !errors.Is(err, client.ErrForbidden) {
		t.Errorf("a forbidden list: Run ended with %v", err)
	}
}

// A list from PostgreSQL is at least at its position: it may already show
// changes the watch then delivers. The informer skips those by version,
// so its view never goes back to an older node.
func TestInformerSkipsWhatTheListShowed(t *testing.T) {
	t.Parallel()
	f, ts := newFleet(t)
	f.write(client.EventCreated, 1, 1)
	f.write(client.EventUpdated, 1, 2)
	f.write(client.EventUpdated, 1, 3)
	f.lag = 2
	var mu sync.Mutex
	var applied []int64
	in := client.NewInformer(newClient(t, ts.URL, fast(1)), client.InformerOptions{Reconnect: time.Millisecond,
		Handler: func(u client.InformerUpdate) {
			if u.Event != nil {
				mu.Lock()
				applied = append(applied, u.Event.Node.Node.Version)
				mu.Unlock()
			}
		}})
	runInformer(t, in)
	converged(t, f, in, "after a list ahead of its position")
	f.write(client.EventUpdated, 1, 4)
	converged(t, f, in, "after a write")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(applied, []int64{4}) {
		t.Errorf("versions applied after the list showed version 3: %v, want [4]", applied)
	}
}

// A renewed event moves the lease, version and updated_at of the nodes
// the view holds and nothing else; a node the view does not hold stays
// out, and a renewal the view is already past (a list that showed it)
// changes nothing.
func TestInformerAppliesRenewals(t *testing.T) {
	f, ts := newFleet(t)
	for pk := int64(1); pk <= 3; pk++ {
		f.write(client.EventCreated, pk, 1)
	}
	var mu sync.Mutex
	var renewals []*client.LeaseRenewal
	in := client.NewInformer(newClient(t, ts.URL, fast(1)), client.InformerOptions{Reconnect: time.Millisecond, Handler: func(u client.InformerUpdate) {
		if u.Event != nil && u.Event.Renewal != nil {
			mu.Lock()
			renewals = append(renewals, u.Event.Renewal)
			mu.Unlock()
		}
	}})
	runInformer(t, in)
	f.write(client.EventClaimed, 1, 2)
	f.write(client.EventClaimed, 2, 2)
	f.renew(7, map[int64]int64{1: 3, 2: 3, 9: 4}) // 9: not a node the view holds
	converged(t, f, in, "after a renewal")
	view, _ := in.Nodes()
	for _, n := range view[:2] {
		if n.LeaseExpiresAt == nil || n.Version != 3 || n.IP != "10.0.0.1" {
			t.Errorf("renewed node %d: %+v", n.PK, n)
		}
	}
	if len(view) != 3 || view[2].LeaseExpiresAt != nil {
		t.Errorf("view after the renewal: %+v", view)
	}
	mu.Lock()
	if len(renewals) != 1 || renewals[0].Job != 7 || len(renewals[0].Nodes) != 3 {
		t.Errorf("handler saw renewals %+v; want the one of job 7", renewals)
	}
	mu.Unlock()

	// A renewal older than what the view holds (a stale replay) is skipped.
	f.mu.Lock()
	f.log = append(f.log, fleetEvent{id: f.pos + 1, kind: client.EventRenewed,
		renewal: &client.LeaseRenewal{Kind: client.EventRenewed, At: time.Unix(1, 0).UTC(), Job: 7,
			LeaseExpiresAt: time.Unix(2, 0).UTC(), Nodes: []client.NodeVersion{{PK: 1, Version: 2}}}})
	f.pos++
	stale := f.pos
	f.changed()
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for _, at := in.Nodes(); at != stale; _, at = in.Nodes() {
		if time.Now().After(deadline) {
			t.Fatal("the informer did not take the stale renewal within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if view, _ := in.Nodes(); view[0].Version != 3 || view[0].LeaseExpiresAt.Equal(time.Unix(2, 0)) {
		t.Errorf("a stale renewal changed node 1: %+v", view[0])
	}
}
