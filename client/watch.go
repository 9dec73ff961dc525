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
	// After resumes after this event id: every later event is replayed
	// first. Nil starts with the changes made once the stream is open
	// (list the nodes first for the state before).
	After *int64
	// Reconnect is the wait before reconnecting once a stream ended; 0
	// takes what the server's retry field asks (2s). Failed reconnects
	// back off from it, doubling up to the client's Retry.MaxDelay.
	Reconnect time.Duration
	// IdleTimeout ends a stream that brought nothing, not even the
	// server's keep-alive (every 15s), for this long, and reconnects: a
	// connection that died silently is noticed. Default 1 minute.
	IdleTimeout time.Duration
}

// Event is one event of the watch stream.
type Event struct {
	// ID is the event id: Watch resumes after it (WatchOptions.After).
	ID int64
	// Type is the SSE event name: a NodeEventKind (created, updated,
	// deleted, claimed, released, lost, found, cordoned, uncordoned,
	// expired) or "reset".
	Type string
	// Node is the data of a node event.
	Node *NodeEvent
	// Reset is the data of a reset event: the events after the id the
	// watch resumed from are gone (retention) or were never issued; list
	// the nodes again. The watch goes on after Reset.LastEventID.
	Reset *WatchReset
	// Data is the event's data as sent, for types this client does not know.
	Data json.RawMessage
}

// EventReset is the Type of a reset event.
const EventReset = "reset"

// maxEventBytes bounds one line of the stream (a node event is under 1 KiB).
const maxEventBytes = 1 << 20

// Watch streams node events to fn, in order, until ctx ends (it returns
// ctx.Err()) or fn returns an error (it returns that error). When the
// stream ends or the connection drops, it reconnects with Last-Event-ID,
// so the server replays what was missed: no event is lost or repeated.
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
		var wait time.Duration
		var se *Error
		var he handlerError
		switch {
		case errors.As(err, &se):
			switch {
			case se.Status == http.StatusTooManyRequests || se.Status == http.StatusServiceUnavailable && se.retryLater:
				wait = se.RetryAfter
			case se.Status >= 500 && se.Status != http.StatusServiceUnavailable:
			default:
				return err
			}
		case errors.As(err, &he):
			return he.err
		case errors.Is(err, errProtocol):
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

// HeadWatch checks a watch request as the server would before opening a
// stream (filters, After, the caps on streams: ErrTooManyRequests) and
// opens none.
func (c *Client) HeadWatch(ctx context.Context, w WatchOptions, opts ...CallOption) error {
	cl := newCall(opts)
	p := watchParams(w, cl)
	resp, err := c.raw.HeadWatchNodes(cl.ctx(ctx), &oapi.HeadWatchNodesParams{
		HardwareGeneration: p.HardwareGeneration, Index: p.Index, Node: p.Node, Source: p.Source, IP: p.IP,
		State: p.State, NodeID: p.NodeID, LastEventID: p.LastEventID,
	}, cl.editors()...)
	_, err = cl.finish(resp, err, nil, http.StatusOK)
	return err
}

func watchParams(w WatchOptions, cl *call) *oapi.WatchNodesParams {
	return &oapi.WatchNodesParams{HardwareGeneration: w.HardwareGeneration, Index: w.Index, Node: w.Node,
		Source: w.Source, IP: w.IP, State: watchStates(w.State), NodeID: cl.nodeID, LastEventID: w.After}
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
	if typ == "bookmark" {
		// Where the stream stands: resuming after it loses and repeats
		// nothing. (Handing bookmarks to the caller is the client's next
		// step, issue 22 part 5.)
		s.last = id
		return nil
	}
	switch NodeEventKind(typ) {
	case EventReset:
		ev.Reset = new(WatchReset)
		err = json.Unmarshal(data, ev.Reset)
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
