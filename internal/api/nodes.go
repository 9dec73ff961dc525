package api

import (
	"bufio"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// Writable and read-only node fields, as the wire names them.
var (
	nodeWritable = []string{"ip", "index", "cpu_mem", "driver_version", "hardware_generation", "gpu_mem"}
)

// readNodePatch reads the writable fields that are present; full is a
// write that replaces the node's own labels (create, PUT) rather than
// merging them (PATCH).
func readNodePatch(f *fields, full bool) registry.NodePatch {
	return registry.NodePatch{
		GPUModel:           f.string("gpu_model", true),
		GPUUUID:            f.string("gpu_uuid", true),
		Fabric:             f.string("fabric", true),
		Labels:             f.labels("labels", full),
		IP:                 f.string("ip", false),
		Index:              f.int("index"),
		CPUMem:             f.int64("cpu_mem", false),
		DriverVersion:      f.string("driver_version", false),
		HardwareGeneration: f.int64("hardware_generation", true),
		GPUMem:             f.int64("gpu_mem", true),
	}
}

// readNodeEcho reads the read-only fields a client may send back.
func readNodeEcho(f *fields) registry.NodeEcho {
	return registry.NodeEcho{
		PK:             f.int64("pk", true),
		LastSeen:       f.time("last_seen"),
		CurrentJob:     f.int64("current_job", true),
		Owner:          f.string("owner", true),
		Source:         f.string("source", true),
		Schedulable:    f.bool("schedulable"),
		ExternalID:     f.string("external_id", true),
		ProviderState:  f.string("provider_state", true),
		CreatedAt:      f.stamp("created_at"),
		UpdatedAt:      f.stamp("updated_at"),
		State:          f.string("state", false),
		CordonReason:   f.string("cordon_reason", true),
		LeaseExpiresAt: f.stamp("lease_expires_at"),
		Version:        f.int64("version", false),
	}
}

func (s *Server) createNode(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	spec, err := readNodeCreate(obj)
	if err != nil {
		return err
	}
	if err := mayUseIP(r, spec.IP); err != nil {
		return err
	}
	n, adopted, err := s.store.CreateNode(r.Context(), actor(r), spec)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/nodes/"+strconv.FormatInt(n.PK, 10))
	w.Header().Set("ETag", etag(n.Version))
	if adopted {
		// The node existed (imported by the sync worker); the agent now owns it.
		return writeJSON(w, http.StatusOK, n)
	}
	return writeJSON(w, http.StatusCreated, n)
}

// readNodeCreate reads and validates the body of a create, reporting every
// bad field at once. A create carries no read-only fields: there is
// nothing to echo yet.
func readNodeCreate(obj object) (registry.NodeSpec, error) {
	f := newFields(obj)
	p := readNodePatch(f, true)
	f.require(nodeWritable...)
	spec, err := p.Apply(registry.NodeSpec{})
	f.check(err)
	f.check(spec.Normalize())
	return spec, f.err()
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	pk, err := pathPK(r, "node")
	if err != nil {
		return err
	}
	n, err := s.readNode(r, pk)
	if err != nil {
		return err
	}
	if notModified(w, r, etag(n.Version)) {
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	// The document in a pooled buffer (Write copies it), so that a read
	// by pk from memory allocates no document.
	bp := listBodies.Get().(*[]byte)
	b := append(n.AppendJSON((*bp)[:0]), '\n')
	_, _ = w.Write(b)
	*bp = b
	listBodies.Put(bp)
	return nil
}

// updateNode is PUT: every writable field must be present (the nullable ones
// possibly null), but for the topology fields (gpu_model, gpu_uuid, fabric,
// labels), which clients older than them do not send and which stay as they
// are when absent; read-only fields may be echoed unchanged.
func (s *Server) updateNode(w http.ResponseWriter, r *http.Request) error {
	return s.writeNode(w, r, true)
}

// patchNode is PATCH with JSON merge patch semantics (RFC 7396): absent
// members stay, null clears a nullable field.
func (s *Server) patchNode(w http.ResponseWriter, r *http.Request) error {
	return s.writeNode(w, r, false)
}

func (s *Server) writeNode(w http.ResponseWriter, r *http.Request, full bool) error {
	pk, err := pathPK(r, "node")
	if err != nil {
		return err
	}
	if err := mayWriteNode(r, pk); err != nil {
		return err
	}
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	p := readNodePatch(f, full)
	echo := readNodeEcho(f)
	if full {
		f.require(nodeWritable...)
	}
	if err := f.err(); err != nil {
		return err
	}
	// A bound token may not move a node outside its addresses. A bad
	// address is left to validation (400).
	if p.IP.Set {
		if ip, err := registry.CanonicalIP(p.IP.Value); err == nil {
			if err := mayUseIP(r, ip); err != nil {
				return err
			}
		}
	}
	match := ifMatch(r)
	n, err := s.store.UpdateNode(r.Context(), actor(r), pk, func(cur registry.Node) (registry.NodeSpec, error) {
		if match != nil {
			if err := match(etag(cur.Version)); err != nil {
				return registry.NodeSpec{}, err
			}
		}
		if err := echo.Check(cur); err != nil {
			return registry.NodeSpec{}, err
		}
		return p.Apply(cur.Spec())
	})
	if err != nil {
		return err
	}
	w.Header().Set("ETag", etag(n.Version))
	return writeJSON(w, http.StatusOK, n)
}

func (s *Server) deleteNode(w http.ResponseWriter, r *http.Request) error {
	pk, err := pathPK(r, "node")
	if err != nil {
		return err
	}
	if err := mayWriteNode(r, pk); err != nil {
		return err
	}
	force, err := forceFlag(r)
	if err != nil {
		return err
	}
	var check func(registry.Node) error
	if match := ifMatch(r); match != nil {
		check = func(cur registry.Node) error { return match(etag(cur.Version)) }
	}
	if _, err := s.store.DeleteNode(r.Context(), actor(r), pk, force, check); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forceFlag reads ?force=true, with which an admin deletes a node that
// still holds a job.
func forceFlag(r *http.Request) (bool, error) {
	q := r.URL.Query()
	if len(q["force"]) > 1 {
		return false, badRequest("send force once, not " + strconv.Itoa(len(q["force"])) + " times")
	}
	v := q.Get("force")
	if v == "" {
		return false, nil
	}
	force, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest("force must be true or false")
	}
	if force && principalFrom(r.Context()).Role != registry.RoleAdmin {
		return false, registry.Errorf(registry.ErrForbidden, "only an admin may force the deletion of a node")
	}
	return force, nil
}

// readNodeFilter reads the optional body of list.
func readNodeFilter(obj object) (registry.NodeFilter, error) {
	f := newFields(obj)
	nf := readFilterFields(f)
	f.check(nf.Normalize())
	return nf, f.err()
}

// readFilterFields reads the members list and claim share into the one
// filter type; its Normalize judges the values.
func readFilterFields(f *fields) registry.NodeFilter {
	var nf registry.NodeFilter
	if o := f.bool("free"); o.Set {
		nf.Free = &o.Value
	}
	if raw, ok := f.raw("state"); ok {
		states, msg := parseStates(raw)
		if msg != "" {
			f.errs.Add("state", "%s", msg)
		}
		nf.State = states
	}
	nf.CurrentJob = optPtr(f.int64("current_job", false))
	nf.HardwareGeneration = optPtr(f.int64("hardware_generation", false))
	nf.MinGPUMem = optPtr(f.int64("min_gpu_mem", false))
	nf.MinCPUMem = optPtr(f.int64("min_cpu_mem", false))
	if o := f.string("ip", false); o.Set {
		nf.IP = &o.Value
	}
	if o := f.int("index"); o.Set {
		nf.Index = &o.Value
	}
	if o := f.int64("seen_within", false); o.Set {
		d := seconds(o.Value)
		nf.SeenWithin = &d
	}
	if o := f.string("source", false); o.Set {
		nf.Source = &o.Value
	}
	if o := f.string("fabric", false); o.Set {
		nf.Fabric = &o.Value
	}
	if o := f.string("owner", false); o.Set {
		nf.Owner = &o.Value
	}
	if o := f.string("selector", false); o.Set {
		nf.Selector = readSelector(&f.errs, "selector", o.Value)
	}
	if o := f.int64("after", false); o.Set {
		nf.After = o.Value
	}
	// On the wire a limit is 1..MaxListLimit; the filter's 0 (no limit) is
	// what leaving it out means.
	if o := f.int64("limit", false); o.Set {
		if o.Value < 1 || o.Value > registry.MaxListLimit {
			f.errs.Add("limit", "must be between 1 and %d", registry.MaxListLimit)
		} else {
			nf.Limit = int(o.Value)
		}
	}
	return nf
}

// readSelector parses a label selector, recording an error that names
// field and the position at fault.
func readSelector(fe *registry.FieldErrors, field, text string) registry.Selector {
	sel, err := registry.ParseSelector(text)
	if err != nil {
		fe.Add(field, "is not a valid label selector: %s", err.Error())
		return registry.Unparsed
	}
	return sel
}

// seconds converts a count of seconds to a duration, saturating where a
// duration ends so that Normalize sees an out-of-range value, not a wrapped
// one.
func seconds(n int64) time.Duration {
	const limit = int64(math.MaxInt64 / time.Second)
	return time.Duration(min(max(n, -limit), limit)) * time.Second
}

func optPtr[T any](o registry.Optional[T]) *T {
	if !o.Set || o.Null {
		return nil
	}
	return &o.Value
}

// listWriters are the 32 KiB buffers list responses are written through,
// reused across requests: a page of free nodes is the request schedulers
// send most.
var listWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 32<<10) }}

// listNodes streams the matching nodes as one JSON array. It reads them in
// keyset batches so memory stays flat and no query holds a connection while
// a slow client drains the response.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, true)
	if err != nil {
		return err
	}
	filter, err := readNodeFilter(obj)
	if err != nil {
		return err
	}
	remaining := filter.Limit // 0: all
	batch := filter
	batch.Limit = s.listBatch // every page asks for a batch (see next)
	pages := s.listReader(r, batch)
	next := func() ([]registry.Node, error) {
		page := filter
		page.Limit = s.listBatch
		if remaining > 0 {
			page.Limit = min(page.Limit, remaining)
		}
		nodes, err := pages.page(page)
		if err != nil {
			return nil, err
		}
		if len(nodes) > 0 {
			filter.After = nodes[len(nodes)-1].PK
		}
		if remaining > 0 {
			remaining -= len(nodes)
		}
		return nodes, nil
	}
	// The first batch is read before anything is written, so a failing
	// database still gets a proper problem response.
	nodes, err := next()
	if err != nil {
		return err
	}
	pages.setPosition(w.Header())
	if len(nodes) < s.listBatch || remaining == 0 && filter.Limit > 0 {
		return s.writeListPage(w, r, nodes)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := listWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() {
		bw.Reset(nil) // holds no response after this one
		listWriters.Put(bw)
	}()
	bw.WriteByte('[')
	first := true
	rc := http.NewResponseController(w)
	var buf []byte
	for {
		for _, n := range nodes {
			if !first {
				bw.WriteByte(',')
			}
			first = false
			buf = n.AppendJSON(buf[:0]) // the node's document, as json.Marshal writes it
			bw.Write(buf)
		}
		done := len(nodes) < s.listBatch || remaining == 0 && filter.Limit > 0
		if s.nodes != nil {
			s.nodes.Recycle(nodes)
		}
		if done {
			break
		}
		if err := bw.Flush(); err != nil {
			return s.abortStream(r, err)
		}
		_ = rc.Flush()
		if nodes, err = next(); err != nil {
			return s.abortStream(r, err)
		}
	}
	bw.WriteString("]\n")
	if err := bw.Flush(); err != nil {
		return s.abortStream(r, err)
	}
	return nil
}

// listBodies are the buffers whole one-page list answers, and single
// nodes' documents, are made in.
var listBodies = sync.Pool{New: func() any { return new([]byte) }}

// writeListPage answers a list that is one page (a free page of 100, say:
// the list schedulers send most) with a Content-Length and one write,
// rather than the streamed form's chunks.
func (s *Server) writeListPage(w http.ResponseWriter, r *http.Request, nodes []registry.Node) error {
	bp := listBodies.Get().(*[]byte)
	b := append((*bp)[:0], '[')
	for i, n := range nodes {
		if i > 0 {
			b = append(b, ',')
		}
		b = n.AppendJSON(b) // the node's document, as json.Marshal writes it
	}
	b = append(b, "]\n"...)
	if s.nodes != nil {
		s.nodes.Recycle(nodes)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	if cap(b) <= 1<<20 { // a page of 500 is about 250 KB
		*bp = b
		listBodies.Put(bp)
	}
	if err != nil {
		return s.abortStream(r, err)
	}
	return nil
}

// abortStream ends a response whose status line is already sent: the client
// must see a broken response, not a short list that looks complete.
func (s *Server) abortStream(r *http.Request, err error) error {
	if r.Context().Err() == nil {
		s.logger.ErrorContext(r.Context(), "list aborted mid-stream", "request_id", requestID(r.Context()), "err", err)
	}
	panic(http.ErrAbortHandler)
}
