package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// Events is the change feed behind watch. *watch.Hub implements it.
type Events interface {
	// Subscribe opens a stream for principal; an error matching
	// registry.ErrTooMany when a cap on streams is reached.
	Subscribe(ctx context.Context, principal string) (EventStream, error)
	// Admit reports whether Subscribe would accept principal now, without
	// subscribing: an error matching registry.ErrTooMany at a cap.
	Admit(principal string) error
	// Backfill calls fn for every event in (after, upto] from the change
	// log, with its encoding (see EncodeEvent).
	Backfill(ctx context.Context, after, upto int64, fn func(e registry.NodeEvent, frame []byte) error) error
	Latest(ctx context.Context) (int64, error)
}

// EventStream is one watcher's subscription. It is an alias of an unnamed
// interface so that *watch.Hub, whose Subscribe returns the identical
// watch.Stream, implements Events without either package importing the
// other.
type EventStream = interface {
	// Wake is signalled when Next may have events.
	Wake() <-chan struct{}
	// Done is closed when the watcher fell too far behind or the feed
	// stopped: the stream ends and the client resumes. Or when the feed
	// began a new epoch: see Reset.
	Done() <-chan struct{}
	// Reset, once Done is closed, is why when the feed began a new epoch
	// (what the watcher saw may be lost: it must re-list, then watch after
	// last); "" otherwise.
	Reset() (reason string, last int64)
	// Last is the newest event id the stream will not deliver.
	Last() int64
	// Next calls fn with each pending event and its shared encoding.
	Next(fn func(e registry.NodeEvent, frame []byte) error) error
	// Close ends the subscription.
	Close()
}

// watchFilter selects events by the node they carry: the registry's one
// node filter, with the meaning list gives it.
type watchFilter struct{ registry.NodeFilter }

func (f watchFilter) match(n registry.Node) bool { return f.Match(n, time.Now()) }

// watchParams are the query parameters of watch; all but last_event_id
// are filters.
var watchParams = []string{"hardware_generation", "source", "ip", "index", "node", "state", "fabric", "selector", "last_event_id"}

// readWatchFilter reads the filters of the query into a NodeFilter and
// validates them with the same Normalize as list and claim.
func readWatchFilter(q url.Values) (watchFilter, error) {
	var nf registry.NodeFilter
	var fe registry.FieldErrors
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch {
		case !slices.Contains(watchParams, name):
			fe.Add(name, "is not a known watch parameter (%s)", strings.Join(watchParams, ", "))
		case len(q[name]) > 1:
			fe.Add(name, "appears more than once")
		}
	}
	intParam := func(name string) *int64 {
		if !q.Has(name) || fe.Has(name) {
			return nil
		}
		n, err := strconv.ParseInt(q.Get(name), 10, 64)
		if err != nil {
			fe.Add(name, "must be an integer")
			return nil
		}
		return &n
	}
	strParam := func(name string) *string {
		if !q.Has(name) || fe.Has(name) {
			return nil
		}
		v := q.Get(name)
		return &v
	}
	nf.HardwareGeneration = intParam("hardware_generation")
	if n := intParam("index"); n != nil {
		i := int(min(max(*n, -1), registry.MaxIndex+1)) // out of range stays out of range
		nf.Index = &i
	}
	nf.PK = intParam("node")
	nf.Source = strParam("source")
	nf.IP = strParam("ip")
	nf.Fabric = strParam("fabric")
	nf.Owner = strParam("owner")
	if v := strParam("selector"); v != nil {
		nf.Selector = readSelector(&fe, "selector", *v)
	}
	if v := strParam("state"); v != nil {
		// Comma-separated: state=cordoned,draining.
		for name := range strings.SplitSeq(*v, ",") {
			nf.State = append(nf.State, registry.State(name))
		}
	}
	for _, e := range registry.FieldsOf(nf.Normalize()) {
		if !fe.Has(e.Field) {
			fe = append(fe, e)
		}
	}
	return watchFilter{nf}, fe.Err()
}

// resumeFrom reads Last-Event-ID (or ?last_event_id= for clients that
// cannot set headers); -1 when absent.
func resumeFrom(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return -1, nil
	}
	id, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || id < 0 {
		return 0, badRequest("Last-Event-ID must be an event id (a non-negative integer)")
	}
	return id, nil
}

type eventJSON struct {
	Kind string        `json:"kind"`
	At   time.Time     `json:"at"`
	Node registry.Node `json:"node"`
}

// renewedJSON is the data of a renewed event: the job, its new lease and
// each renewed node's pk and new version (their updated_at is at).
type renewedJSON struct {
	Kind           string        `json:"kind"`
	At             time.Time     `json:"at"`
	Job            int64         `json:"job"`
	LeaseExpiresAt time.Time     `json:"lease_expires_at"`
	Nodes          []nodeVersion `json:"nodes"`
}

type nodeVersion struct {
	PK      int64 `json:"pk"`
	Version int64 `json:"version"`
}

// EncodeEvent is an event as a watch stream sends it: one Server-Sent
// Event with its id, type and NodeEvent document (LeaseRenewal for
// renewed). The watch hub encodes each event once with it and shares the
// bytes among every watcher.
func EncodeEvent(e registry.NodeEvent) ([]byte, error) {
	var data []byte
	var err error
	if e.Kind == registry.EventRenewed {
		data, err = encodeRenewal(e)
	} else {
		data, err = json.Marshal(eventJSON{Kind: e.Kind, At: e.At.UTC(), Node: e.Node})
	}
	if err != nil {
		return nil, fmt.Errorf("api: encode event %d: %w", e.ID, err)
	}
	b := make([]byte, 0, len(data)+len(e.Kind)+40)
	b = fmt.Appendf(b, "id: %d\nevent: %s\ndata: ", e.ID, e.Kind)
	b = append(b, data...)
	return append(b, "\n\n"...), nil
}

// encodeRenewal is the data of a renewed event of e.Nodes.
func encodeRenewal(e registry.NodeEvent) ([]byte, error) {
	if len(e.Nodes) == 0 || e.Nodes[0].CurrentJob == nil || e.Nodes[0].LeaseExpiresAt == nil {
		return nil, errors.New("a renewed event needs nodes that hold a job with a lease")
	}
	d := renewedJSON{Kind: e.Kind, At: e.At.UTC(), Job: *e.Nodes[0].CurrentJob,
		LeaseExpiresAt: e.Nodes[0].LeaseExpiresAt.UTC(), Nodes: make([]nodeVersion, len(e.Nodes))}
	for i, n := range e.Nodes {
		d.Nodes[i] = nodeVersion{n.PK, n.Version}
	}
	return json.Marshal(d)
}

// frameFor is what a watch of filter sends for e, whose shared encoding is
// frame: frame when e's node matches (for renewed, every node), nothing
// when it does not (for renewed, none), and for a renewal of which only
// some nodes match, an event of those alone.
func (f watchFilter) frameFor(e registry.NodeEvent, frame []byte) ([]byte, error) {
	if e.Kind != registry.EventRenewed {
		if !f.match(e.Node) {
			return nil, nil
		}
		return frame, nil
	}
	var some []registry.Node
	for i, n := range e.Nodes {
		switch {
		case f.match(n):
			if some != nil {
				some = append(some, n)
			}
		case some == nil:
			some = append(make([]registry.Node, 0, len(e.Nodes)), e.Nodes[:i]...)
		}
	}
	switch {
	case some == nil:
		return frame, nil
	case len(some) == 0:
		return nil, nil
	}
	e.Nodes, e.Node = some, some[0]
	return EncodeEvent(e)
}

// checkWatch makes the checks of a watch request that come before its
// stream opens (GET) or instead of it (HEAD): the filters, the resume
// point and whether watching is enabled here.
func (s *Server) checkWatch(r *http.Request) (filter watchFilter, resume int64, err error) {
	if filter, err = readWatchFilter(r.URL.Query()); err != nil {
		return watchFilter{}, 0, err
	}
	if resume, err = resumeFrom(r); err != nil {
		return watchFilter{}, 0, err
	}
	if s.events == nil {
		return watchFilter{}, 0, &httpError{status: http.StatusServiceUnavailable, detail: "watching is not enabled on this server"}
	}
	return filter, resume, nil
}

// setStreamHeaders sets the headers of an event stream.
func setStreamHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
}

// watchWriteTimeout bounds each write of a watch stream: a client that
// does not read for that long is dropped.
const watchWriteTimeout = 30 * time.Second

// watchNodes is GET /v1/nodes/watch, a Server-Sent Events stream of node
// changes. Each event's id increases; a client that reconnects with
// Last-Event-ID gets everything it missed from the change log, or a
// "reset" event when it cannot: retention already removed some, the id is
// of an earlier epoch of the feed, or ahead of it. When the feed begins a
// new epoch (a failover, a restore), an open stream gets a reset and
// ends. Streams are capped per
// server and per principal (429 beyond).
//
// Once the stream has started, every way it ends returns nil: the status
// is sent, and the reason is counted (Observer.WatchClosed).
func (s *Server) watchNodes(w http.ResponseWriter, r *http.Request) error {
	filter, resume, err := s.checkWatch(r)
	if err != nil {
		return err
	}
	// The token was verified as the stream opened; it is verified again
	// every watchRecheck, so that revoking it (or its expiry) ends the
	// stream too, not only requests to come.
	token, err := parseBearer(r.Header.Values("Authorization"))
	if err != nil {
		return err
	}
	ctx := r.Context()
	sub, err := s.events.Subscribe(ctx, principalFrom(ctx).Sub)
	if err != nil {
		if errors.Is(err, registry.ErrTooMany) {
			s.observer.WatchRefused()
		}
		return err
	}
	defer sub.Close()
	st := &watchStream{s: s, ctx: ctx, w: w, rc: http.NewResponseController(w),
		filter: filter, token: token, sub: sub, last: sub.Last(), end: watchEndWrite}
	s.observer.WatchOpened()
	defer func() { s.observer.WatchClosed(st.end) }()
	if !st.open(resume) || !st.backfill(resume) || st.bookmark() != nil {
		return nil
	}
	st.live()
	return nil
}

// watchStream is one watch response once its subscription is open: the
// steps open, backfill and live, in that order, write to it.
//
// Events come in batches: a batch gets one write deadline (deadline) and
// one flush; write buffers a chunk of it. send is a whole batch of one
// chunk.
type watchStream struct {
	s      *Server
	ctx    context.Context
	w      http.ResponseWriter
	rc     *http.ResponseController
	filter watchFilter
	token  string // re-verified every watchRecheck
	sub    EventStream
	// last is the id a reset event tells the client to resume after:
	// the subscription's Last, or the log's latest for an id ahead of it.
	last int64
	// floor: live events at or below it were covered by the backfill.
	floor int64
	// taken is the id of the newest event the stream has taken, sent or
	// filtered out: a client resuming after it misses nothing and gets
	// nothing twice. Bookmarks carry it.
	taken int64
	end   string // why the stream ended, one of the watchEnd reasons
}

func (st *watchStream) deadline() { _ = st.rc.SetWriteDeadline(time.Now().Add(watchWriteTimeout)) }

func (st *watchStream) write(chunk []byte) error {
	_, err := st.w.Write(chunk)
	return err
}

func (st *watchStream) flush() error { return st.rc.Flush() }

func (st *watchStream) send(chunk string) error {
	st.deadline()
	if err := st.write([]byte(chunk)); err != nil {
		return err
	}
	return st.flush()
}

// reset tells the client to re-list, then watch after st.last.
func (st *watchStream) reset(reason string) error {
	data, _ := json.Marshal(map[string]any{"reason": reason, "last_event_id": st.last})
	return st.send(fmt.Sprintf("id: %d\nevent: reset\ndata: %s\n\n", st.last, data))
}

// bookmark tells the client where the stream stands (taken), as an event
// of its own: SSE clients keep its id as the one to resume after.
func (st *watchStream) bookmark() error {
	return st.send(fmt.Sprintf("id: %d\nevent: bookmark\ndata: {\"last_event_id\":%d}\n\n", st.taken, st.taken))
}

// open starts the response: the stream's headers, then a comment naming
// where it starts. The server's read and write timeouts are lifted, since
// a stream outlives them; each write gets its own deadline instead, so a
// stuck client is dropped. false when the client is gone.
func (st *watchStream) open(resume int64) bool {
	_ = st.rc.SetReadDeadline(time.Time{})
	_ = st.rc.SetWriteDeadline(time.Time{})
	setStreamHeaders(st.w.Header())
	st.w.WriteHeader(http.StatusOK)
	return st.send(fmt.Sprintf("retry: 2000\n: watching node changes after event %d\n\n", max(resume, st.last))) == nil
}

// backfill brings a client resuming after resume (-1: not resuming) up to
// the live feed: it sends the matching events in (resume, floor] from the
// change log, or a reset when retention removed some of them or resume is
// ahead of every event this registry issued. It sets floor, which the
// live step does not send again. false when the stream ends here.
func (st *watchStream) backfill(resume int64) bool {
	s, ctx := st.s, st.ctx
	st.floor = st.last
	if resume > st.last {
		// This replica's hub may lag the log by a moment (the client saw the
		// event through another replica): ask the log itself.
		latest, err := s.events.Latest(ctx)
		if err != nil {
			s.logger.WarnContext(ctx, "watch: reading the latest event failed", "request_id", requestID(ctx), "err", err)
			st.end = watchEndBackfill
			return false // the client retries
		}
		st.floor = max(st.floor, latest)
	}
	// Whatever happens below, the stream has taken every event up to floor:
	// sent from the log, or (not resuming, or reset) not owed.
	st.taken = st.floor
	switch {
	case resume < 0:
		return true
	case resume > st.floor:
		// An id this registry never issued (another database, a restore).
		st.last = st.floor
		return st.reset("Last-Event-ID is ahead of this registry's events; re-list") == nil
	}
	err := st.sendLog(resume)
	switch {
	case errors.Is(err, registry.ErrGone):
		return st.reset(publicMessage(err)) == nil
	case err != nil:
		if ctx.Err() == nil {
			s.logger.WarnContext(ctx, "watch backfill failed", "request_id", requestID(ctx), "err", err)
			st.end = watchEndBackfill
		} else {
			st.end = watchEndClient
		}
		return false // the client resumes from what it got
	}
	return true
}

// sendLog writes the matching events in (resume, floor] from the change
// log and flushes them; an error matching registry.ErrGone when retention
// removed some.
func (st *watchStream) sendLog(resume int64) error {
	err := st.s.events.Backfill(st.ctx, resume, st.floor, func(e registry.NodeEvent, frame []byte) error {
		frame, err := st.filter.frameFor(e, frame)
		if frame == nil || err != nil {
			return err
		}
		st.deadline()
		if err := st.write(frame); err != nil {
			return err
		}
		st.s.observer.WatchSent(1)
		return nil
	})
	if err == nil {
		st.deadline()
		err = st.flush()
	}
	return err
}

// live sends the hub's matching events after floor as they come, and a
// bookmark (which keeps the connection alive too) every watchKeepAlive, until the client goes, the
// token is no longer valid (checked every watchRecheck), the subscription
// falls behind (or the hub stops) or a write fails.
func (st *watchStream) live() {
	s := st.s
	keepAlive := time.NewTicker(s.watchKeepAlive)
	defer keepAlive.Stop()
	recheck := time.NewTicker(s.watchRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-st.ctx.Done():
			st.end = watchEndClient
			return
		case <-recheck.C:
			if _, err := s.auth.Verify(st.token); err != nil && !errors.Is(err, registry.ErrUnavailable) {
				// The reason stays out of the stream (a comment ends at a
				// newline); a reconnect with the token gets it in a 401.
				_ = st.send(": the token is no longer valid (revoked or expired); stream ended\n\n")
				st.end = watchEndToken
				return
			}
		case <-st.sub.Done():
			if reason, last := st.sub.Reset(); reason != "" {
				// A new epoch: the client re-lists, then reconnects with
				// Last-Event-ID, the reset's id.
				st.last = last
				_ = st.reset(reason)
				st.end = watchEndReset
				return
			}
			// Fell behind (or the server is stopping): end the stream; the
			// client resumes with Last-Event-ID from the change log.
			_ = st.send(": falling behind; reconnect with Last-Event-ID\n\n")
			st.end = watchEndBehind
			return
		case <-keepAlive.C:
			if st.bookmark() != nil {
				return
			}
		case <-st.sub.Wake():
			if st.sendPending() != nil {
				return
			}
		}
	}
}

// sendPending writes the subscription's pending events that match and
// are above floor, as one batch.
func (st *watchStream) sendPending() error {
	st.deadline()
	sent := 0
	err := st.sub.Next(func(e registry.NodeEvent, frame []byte) error {
		if e.ID <= st.floor {
			return nil
		}
		st.taken = e.ID // sent below, or filtered out: taken either way
		frame, err := st.filter.frameFor(e, frame)
		if frame == nil || err != nil {
			return err
		}
		if err := st.write(frame); err != nil {
			return err
		}
		sent++
		return nil
	})
	if err == nil && sent > 0 {
		err = st.flush()
	}
	st.s.observer.WatchSent(sent)
	return err
}
