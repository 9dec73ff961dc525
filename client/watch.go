package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client/internal/oapi"
)

// WatchOptions selects the events of a watch and where it starts. Nil
// filters do not filter; they are ANDed.
type WatchOptions struct {
	HardwareGeneration *int64
	Index              *int32
	Node               *int64
	Source             *Source
	IP                 *string
	// State selects events whose node is, after the change, in one of
	// these states; empty does not filter.
	State []NodeState
	// Fabric selects the events of one fabric's nodes.
	Fabric *string
	// Selector selects events whose node's labels match this label
	// selector (team=research,tier in (gold,silver)).
	Selector *string
	// After resumes after this event id: every later event is replayed
	// first. To follow the fleet, set it to the EventID of
	// ListNodesWithPosition (or use an Informer). Nil starts with the
	// changes made once the first stream is open; its opening bookmark
	// says where that is.
	After *int64
	// Reconnect is the wait before reconnecting once a stream ended; 0
	// takes what the server's retry field asks (2s). Failed reconnects
	// back off from it, doubling up to the client's Retry.MaxDelay.
	Reconnect time.Duration
	// Opened, if set, is called each time a stream opens (answers 200),
	// before its events, with the position it resumes after: After, or
	// the id of the last event or bookmark fn took; nil while the watch
	// knows no position (no After, nothing taken yet): that stream's
	// opening bookmark says where it starts.
	Opened func(after *int64)
	// IdleTimeout ends a stream that brought nothing, not even the
	// server's keep-alive (every 15s), for this long, and reconnects: a
	// connection that died silently is noticed. Default 1 minute.
	IdleTimeout time.Duration
}

// Event is one event of the watch stream.
type Event struct {
	// ID is the event id: Watch resumes after it (WatchOptions.After).
	// For a bookmark or a reset it is the stream's position.
	ID int64
	// Type is the SSE event name: a NodeEventKind (created, updated,
	// deleted, claimed, released, lost, found, cordoned, uncordoned,
	// expired), "renewed", "reset" or "bookmark".
	Type string
	// Node is the data of a node event.
	Node *NodeEvent
	// Renewal is the data of a renewed event: a renewal of a job's leases
	// moved the lease_expires_at of its nodes, changing nothing else of
	// them but their version and updated_at (the event's At). One event
	// per renewal, listing every renewed node (that matches the watch's
	// filters).
	Renewal *LeaseRenewal
	// Reset is the data of a reset event: the events after the position
	// the watch resumed from cannot be replayed (retention removed them,
	// or the registry cannot vouch for that position, as after a failover
	// that lost events), or the feed started a new epoch. Everything
	// learnt from the stream before may be stale: list the nodes again
	// (ListNodesWithPosition). The watch itself goes on after
	// Reset.LastEventID.
	Reset *WatchReset
	// Bookmark is the data of a bookmark event: the stream's position,
	// with no change. Every stream opens with one (or with a reset), and
	// an idle stream sends one now and then.
	Bookmark *WatchBookmark
	// Data is the event's data as sent, for types this client does not know.
	Data json.RawMessage
}

// Types of the watch stream's events besides the NodeEventKinds.
const (
	EventRenewed  = "renewed"
	EventReset    = "reset"
	EventBookmark = "bookmark"
)

// maxEventBytes bounds one line of the stream (a node event is under 1 KiB).
const maxEventBytes = 1 << 20

// Watch streams node events to fn, in order, until ctx ends (it returns
// ctx.Err()) or fn returns an error (it returns that error). Each stream
// opens with a bookmark (or a reset) saying where it starts, after any
// replay, and idle streams send bookmarks now and then; fn gets them too
// (and WatchOptions.Opened learns when a stream opens, and from where). When the stream
// ends or the connection drops, it reconnects with Last-Event-ID set to
// the id of the last event or bookmark fn took (or After, when it took
// none yet), so the server replays what was missed: no event is lost or
// repeated. Without After, a stream that ends before its opening
// bookmark gave nothing to fn, and the watch starts afresh; once any
// position is known, every reconnection carries it. A reset is handed
// to fn like any event.
// While the server is unreachable, overloaded (429, 503 with Retry-After)
// or failing (5xx) it keeps trying, backing off with jitter and honouring
// Retry-After; a refusal that retrying cannot cure (400, 401, 403, 404,
// watching disabled) ends it with an *Error. Every connection asks the
// TokenSource afresh. With AsNode, each stream's end is the node's
// heartbeat.
func (c *Client) Watch(ctx context.Context, w WatchOptions, fn func(Event) error, opts ...CallOption) error {
	if w.IdleTimeout <= 0 {
		w.IdleTimeout = time.Minute
	}
	s := &stream{c: c, w: w, fn: fn, cl: newCall(opts), last: -1, retry: 2 * time.Second}
	if w.After != nil {
		s.last = *w.After
	}
	failures := 0
	for {
		delivered, err := s.connect(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he handlerError
		if errors.As(err, &he) {
			return he.err
		}
		wait, ok := transient(err)
		if err != nil && !ok {
			return err
		}
		if delivered {
			failures = 0
		}
		failures++
		base := s.retry
		if w.Reconnect > 0 {
			base = w.Reconnect
		}
		r := Retry{MinDelay: base, MaxDelay: max(c.retry.MaxDelay, base)}
		if err := sleep(ctx, max(wait, r.backoff(failures))); err != nil {
			return err
		}
	}
}

// transient says whether a call or stream that failed with err may
// succeed when tried again, and how long the server asked to wait first:
// yes for a connection that failed or dropped, 429, 503 with Retry-After
// (the database unavailable, a lock waited on too long) and other 5xx;
// no for any other answer (400, 401, 403, 404, watching disabled) and a
// stream this client cannot read.
func transient(err error) (wait time.Duration, ok bool) {
	var se *Error
	switch {
	case errors.As(err, &se):
		switch {
		case se.Status == http.StatusTooManyRequests || se.Status == http.StatusServiceUnavailable && se.retryLater:
			return se.RetryAfter, true
		case se.Status >= 500 && se.Status != http.StatusServiceUnavailable:
			return 0, true
		}
		return 0, false
	case errors.Is(err, errProtocol), errors.Is(err, ErrNoPosition):
		return 0, false
	}
	return 0, true
}

// HeadWatch checks a watch request as the server would before opening a
// stream (filters, After, the caps on streams: ErrTooManyRequests) and
// opens none.
func (c *Client) HeadWatch(ctx context.Context, w WatchOptions, opts ...CallOption) error {
	cl := newCall(opts)
	p := watchParams(w, cl)
	resp, err := c.raw.HeadWatchNodes(cl.ctx(ctx), &oapi.HeadWatchNodesParams{
		HardwareGeneration: p.HardwareGeneration, Index: p.Index, Node: p.Node, Source: p.Source, IP: p.IP,
		State: p.State, Fabric: p.Fabric, Selector: p.Selector, NodeID: p.NodeID, LastEventID: p.LastEventID,
	}, cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}

func watchParams(w WatchOptions, cl *call) *oapi.WatchNodesParams {
	return &oapi.WatchNodesParams{HardwareGeneration: w.HardwareGeneration, Index: w.Index, Node: w.Node,
		Source: w.Source, IP: w.IP, State: watchStates(w.State), Fabric: w.Fabric, Selector: w.Selector,
		NodeID: cl.nodeID, LastEventID: w.After}
}

// watchStates is the state parameter: the states separated by commas.
func watchStates(states []NodeState) *oapi.WatchState {
	if len(states) == 0 {
		return nil
	}
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	v := oapi.WatchState(strings.Join(names, ","))
	return &v
}

// errProtocol is a stream this client cannot read.
var errProtocol = errors.New("client: watch stream")

// handlerError carries the error of the caller's function out of a stream.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }

// stream is one watch: its position and what it reconnects with.
type stream struct {
	c     *Client
	w     WatchOptions
	fn    func(Event) error
	cl    *call
	last  int64 // the id to resume after; -1: none yet
	retry time.Duration
}

// connect opens one stream and reads it until it ends. delivered says
// whether it was open (a 200) and so whether the next failure starts a
// new backoff.
func (s *stream) connect(ctx context.Context) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.w
	if s.last >= 0 {
		w.After = &s.last
	}
	rctx := context.WithValue(s.cl.ctx(ctx), noRetryKey{}, true)
	resp, err := s.c.raw.WatchNodes(rctx, watchParams(w, s.cl), s.cl.editors()...)
	if err != nil {
		return false, fmt.Errorf("client: watch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := s.cl.finish(resp, nil, nil, http.StatusOK)
		return false, err
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "text/event-stream" {
		return false, fmt.Errorf("%w: answered %q, not text/event-stream", errProtocol, resp.Header.Get("Content-Type"))
	}
	if w.Opened != nil {
		w.Opened(w.After)
	}
	// A stream that brings nothing for IdleTimeout is dead: cancel it.
	idle := time.AfterFunc(w.IdleTimeout, cancel)
	defer idle.Stop()
	return true, s.read(bufio.NewReaderSize(resp.Body, 32<<10), func() { idle.Reset(w.IdleTimeout) })
}

// read parses Server-Sent Events (WHATWG HTML § 9.2) and hands each to
// the caller; alive is called for every line, comments included.
func (s *stream) read(r *bufio.Reader, alive func()) error {
	var (
		typ  string
		id   []byte
		data bytes.Buffer
		line []byte
	)
	for {
		line = line[:0]
		for {
			chunk, err := r.ReadSlice('\n')
			line = append(line, chunk...)
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) && len(line) <= maxEventBytes {
				continue
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				return fmt.Errorf("%w: a line longer than %d bytes", errProtocol, maxEventBytes)
			}
			return err // the stream ended: reconnect
		}
		alive()
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if len(line) == 0 {
			if data.Len() > 0 {
				if err := s.dispatch(typ, id, bytes.TrimSuffix(data.Bytes(), []byte("\n"))); err != nil {
					return err
				}
			}
			typ, id = "", nil
			data.Reset()
			continue
		}
		if line[0] == ':' {
			continue // a comment: keep-alive
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			typ = string(value)
		case "data":
			if data.Len()+len(value) > maxEventBytes {
				return fmt.Errorf("%w: an event larger than %d bytes", errProtocol, maxEventBytes)
			}
			data.Write(value)
			data.WriteByte('\n')
		case "id":
			id = append(id[:0], value...)
		case "retry":
			if ms, err := strconv.ParseInt(string(value), 10, 64); err == nil && ms >= 0 {
				s.retry = min(time.Duration(ms)*time.Millisecond, time.Minute)
			}
		}
	}
}

// dispatch decodes one event, hands it to the caller and, once the caller
// took it, moves the resume point past it.
func (s *stream) dispatch(typ string, rawID, data []byte) error {
	ev := Event{Type: typ, Data: json.RawMessage(bytes.Clone(data))}
	id, err := strconv.ParseInt(string(rawID), 10, 64)
	if err != nil || id < 0 {
		return fmt.Errorf("%w: event id %q is not an event id", errProtocol, rawID)
	}
	ev.ID = id
	switch NodeEventKind(typ) {
	case EventReset:
		ev.Reset = new(WatchReset)
		err = json.Unmarshal(data, ev.Reset)
	case EventBookmark:
		ev.Bookmark = new(WatchBookmark)
		err = json.Unmarshal(data, ev.Bookmark)
	case EventRenewed:
		ev.Renewal = new(LeaseRenewal)
		err = json.Unmarshal(data, ev.Renewal)
	case EventCreated, EventUpdated, EventDeleted, EventClaimed, EventReleased,
		EventLost, EventFound, EventCordoned, EventUncordoned, EventExpired:
		ev.Node = new(NodeEvent)
		err = json.Unmarshal(data, ev.Node)
	}
	if err != nil {
		return fmt.Errorf("%w: event %d (%s): %v", errProtocol, id, typ, err)
	}
	if err := s.fn(ev); err != nil {
		return handlerError{err}
	}
	s.last = id
	return nil
}
