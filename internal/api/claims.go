package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

type claimJSON struct {
	Job   int64           `json:"job"`
	Nodes []registry.Node `json:"nodes"`
}

// renewJSON is a renewal's answer: the nodes the job holds, and the pks
// of those whose lease of it ran out.
type renewJSON struct {
	claimJSON
	Expired []int64
}

// MarshalJSON writes {"job":…,"nodes":[…],"expired":[…]}.
func (r renewJSON) MarshalJSON() ([]byte, error) {
	b, _ := r.claimJSON.MarshalJSON()
	b = append(b[:len(b)-1], `,"expired":[`...)
	for i, pk := range r.Expired {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, pk, 10)
	}
	return append(b, "]}"...), nil
}

type notReleasedJSON struct {
	PK     int64  `json:"pk"`
	Reason string `json:"reason"`
}

type releaseJSON struct {
	Job         int64             `json:"job"`
	Released    []registry.Node   `json:"released"`
	NotReleased []notReleasedJSON `json:"not_released"`
}

// MarshalJSON writes the answer as encoding/json writes the struct, each
// node as its document (registry.Node.AppendJSON) without reflection: a
// claim's answer is most of what encoding a claim costs.
func (c claimJSON) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 32+640*len(c.Nodes))
	b = append(b, `{"job":`...)
	b = strconv.AppendInt(b, c.Job, 10)
	b = append(b, `,"nodes":`...)
	b = appendNodes(b, c.Nodes)
	return append(b, '}'), nil
}

// MarshalJSON writes the answer as encoding/json writes the struct (see
// claimJSON's).
func (r releaseJSON) MarshalJSON() ([]byte, error) {
	notReleased, err := json.Marshal(r.NotReleased)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 64+640*len(r.Released)+len(notReleased))
	b = append(b, `{"job":`...)
	b = strconv.AppendInt(b, r.Job, 10)
	b = append(b, `,"released":`...)
	b = appendNodes(b, r.Released)
	b = append(b, `,"not_released":`...)
	b = append(b, notReleased...)
	return append(b, '}'), nil
}

// appendNodes appends nodes as a JSON array of their documents; nil is
// null, as encoding/json writes a nil slice.
func appendNodes(b []byte, nodes []registry.Node) []byte {
	if nodes == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, n := range nodes {
		if i > 0 {
			b = append(b, ',')
		}
		b = n.AppendJSON(b)
	}
	return append(b, ']')
}

// nodesJSON is a list of nodes as JSON: never null, even when empty.
func nodesJSON(nodes []registry.Node) []registry.Node {
	if nodes == nil {
		return []registry.Node{}
	}
	return nodes
}

// claimNodes is POST /v1/nodes/claim: {"job": J, "count": N, "same_host":
// bool, ...list filters}. All or nothing; 409 when not enough nodes match.
func (s *Server) claimNodes(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	c := registry.Claim{Count: 1}
	job := f.int64("job", false)
	c.Job = job.Value
	if o := f.int64("count", false); o.Set {
		c.Count = int(min(max(o.Value, -1), registry.MaxClaim+1)) // out of range stays out of range
	}
	c.SameHost = f.bool("same_host").Value
	if o := f.int64("per_host", false); o.Set {
		c.PerHost = int(min(max(o.Value, -1), registry.MaxClaim+1))
		if c.PerHost == 0 {
			c.PerHost = -1 // on the wire, 0 is out of range, not "unset"
		}
	}
	c.SameFabric = f.bool("same_fabric").Value
	if raw, ok := f.raw("nodes"); ok {
		pks, msg := parseIntArray(raw, registry.MaxClaim)
		if msg != "" {
			f.errs.Add("nodes", "%s", msg)
		}
		c.Nodes = pks
		if _, counted := obj["count"]; !counted && msg == "" {
			c.Count = 0 // the number named
		}
	}
	if o := f.int64("lease_seconds", false); o.Set {
		d := seconds(o.Value)
		c.Lease = &d
	}
	c.Filter = readFilterFields(f)
	f.require("job")
	f.check(c.Normalize()) // skips the fields already refused above
	if err := f.err(); err != nil {
		return err
	}
	// A claim whose client left is not started, or is taken back up to
	// its COMMIT (a retry with its Idempotency-Key runs it again): the
	// store asks this look at the socket, which notices the client go
	// sooner than the server's reader does under load.
	ctx := registry.WithGoneProbe(r.Context(), func() bool { return clientGone(r) })
	start := time.Now()
	nodes, err := s.store.ClaimNodes(ctx, actor(r), c)
	s.observer.Claimed(claimOutcome(err), len(nodes), time.Since(start))
	if err != nil {
		return err
	}
	if (r.Context().Err() != nil || clientGone(r)) && r.Header.Get("Idempotency-Key") == "" {
		// The claim committed after its caller gave up (a COMMIT already
		// on its way, or a claim that began before the server saw the
		// caller go): nobody will learn what it took, so it gives it back.
		// (With a key, a retry learns it: the nodes stay.)
		s.giveBack(r, c.Job, nodes)
		return context.Canceled
	}
	return writeJSON(w, http.StatusOK, claimJSON{Job: c.Job, Nodes: nodesJSON(nodes)})
}

// giveBack releases nodes a claim of job took for a caller that gave up,
// as that caller (audited as its release).
func (s *Server) giveBack(r *http.Request, job int64, nodes []registry.Node) {
	pks := make([]int64, len(nodes))
	for i, n := range nodes {
		pks[i] = n.PK
	}
	ctx := context.WithoutCancel(r.Context())
	if _, _, err := s.store.ReleaseNodes(ctx, actor(r), registry.Release{Job: job, Nodes: pks}); err != nil {
		s.logger.WarnContext(ctx, "a claim whose caller gave up could not give its nodes back; they stay held until released", "job", job, "nodes", pks, "err", err)
	}
}

// releaseNodes is POST /v1/nodes/release: {"job": J, "nodes": [pk, ...]}.
func (s *Server) releaseNodes(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	var rel registry.Release
	rel.Job = f.int64("job", false).Value
	f.require("job")
	if raw, ok := f.raw("nodes"); ok && !isNull(raw) {
		pks, msg := parseIntArray(raw, registry.MaxClaim)
		if msg != "" {
			f.errs.Add("nodes", "%s", msg)
		}
		rel.Nodes = pks
		if rel.Nodes == nil {
			rel.Nodes = []int64{}
		}
	}
	if !f.errs.Has("job") {
		f.check(rel.Normalize())
	}
	if err := f.err(); err != nil {
		return err
	}
	start := time.Now()
	released, notReleased, err := s.store.ReleaseNodes(r.Context(), actor(r), rel)
	if err != nil {
		return err
	}
	s.observer.Released(len(released), len(notReleased), time.Since(start))
	out := releaseJSON{Job: rel.Job, Released: nodesJSON(released), NotReleased: []notReleasedJSON{}}
	for _, n := range notReleased {
		out.NotReleased = append(out.NotReleased, notReleasedJSON{PK: n.PK, Reason: n.Reason})
	}
	return writeJSON(w, http.StatusOK, out)
}
