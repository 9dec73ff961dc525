package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// noSuchNode is the reason the API gives for a pk that names no node.
const noSuchNode = "no such node"

// maxPKsPerRequest is the most node pks one cordon or uncordon request
// takes (the API's limit); the CLI sends longer lists in batches of it.
const maxPKsPerRequest = registry.MaxCordon

// cordonOptions are the flags of cordon, uncordon and drain.
type cordonOptions struct {
	filterOptions
	reason    string
	reasonSet bool // --reason was given: it replaces every node's reason
	deadline  time.Duration
	interval  time.Duration
	// all lets filters take more nodes out of scheduling than the API
	// cordons by filter at once (maxPKsPerRequest): a filter that
	// selects more is refused without it, as the server refuses it.
	all bool
}

// defaultReason is the reason a cordon or drain without --reason gives
// the nodes that are not cordoned yet. Nodes already cordoned keep their
// own: an admin's reason is never replaced by this.
func defaultReason(command string) string {
	if command == "nodes drain" {
		return "drained with registryd nodes drain"
	}
	return "cordoned with registryd nodes cordon"
}

func cordonFlags(name string) (*flag.FlagSet, *cordonOptions) {
	o := &cordonOptions{}
	fs := newFlagSet(name)
	o.filterOptions.add(fs, allFilters)
	if name != "nodes uncordon" {
		fs.Func("reason", fmt.Sprintf("`TEXT` saying why, for the other admins (cordon_reason, 1 to %d characters); it replaces the reason "+
			"of nodes already cordoned. Without it, those keep theirs and the others get %q", registry.MaxCordonReasonLen, defaultReason(name)),
			func(s string) error { o.reason, o.reasonSet = s, true; return nil })
	}
	if name != "nodes uncordon" {
		fs.BoolVar(&o.all, "all", false, fmt.Sprintf("let the filters select more than %d nodes (the most the API cordons by filter): they are cordoned in batches", maxPKsPerRequest))
	}
	if name == "nodes drain" {
		fs.DurationVar(&o.deadline, "deadline", 0, "give up waiting after this long (exit 3), such as 2h; 0: wait until every node is released")
		fs.DurationVar(&o.interval, "interval", 2*time.Second, "how often to look whether the nodes are released")
	}
	return fs, o
}

// checkReason is what the server holds a cordon's reason to, checked
// before anything is sent.
func checkReason(r string) error {
	switch {
	case r == "":
		return errors.New("--reason must not be empty: say why the nodes are cordoned (or leave --reason out)")
	case strings.TrimSpace(r) != r:
		return errors.New("--reason must not start or end with whitespace")
	}
	if msg := registry.CheckLabel(r, registry.MaxCordonReasonLen); msg != "" {
		return fmt.Errorf("--reason %s", msg)
	}
	return nil
}

// start reads the nodes a cordon, uncordon or drain acts on (pks, or
// filters, not both) and makes the client that acts.
func (o *cordonOptions) start(ctx context.Context, e *cliEnv, c command, fs *flag.FlagSet, args []string) ([]int64, *client.Client, error) {
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return nil, nil, err
	}
	pks, err := parsePKs(rest)
	switch {
	case err != nil:
	case len(pks) > 0 && o.any():
		err = errors.New("name nodes by pk or select them with filters, not both")
	case len(pks) == 0 && !o.any():
		err = errors.New("name nodes (PK …) or select them (--selector, --ip, --fabric …)")
	case o.interval < 0 || o.deadline < 0:
		err = errors.New("--deadline and --interval must not be negative")
	case o.reasonSet:
		err = checkReason(o.reason)
	}
	if err == nil {
		err = o.check()
	}
	if err != nil {
		return nil, nil, usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	return distinct(pks), cl, err
}

// distinct is pks sorted, each once.
func distinct(pks []int64) []int64 {
	return slices.Compact(slices.Sorted(slices.Values(pks)))
}

// targets lists the nodes a command acts on: those pks names (the ones
// that exist), or with no pks those the filters select. f is the filter
// it listed by (nil for pks).
func (o *cordonOptions) targets(ctx context.Context, cl *client.Client, pks []int64) (nodes []client.Node, f *client.NodeFilter, err error) {
	if len(pks) > 0 {
		nodes, err = nodesByPK(ctx, cl, pks)
		return nodes, nil, err
	}
	filter, err := o.filter(ctx, cl)
	if err != nil {
		return nil, nil, err
	}
	nodes, err = listAll(ctx, cl, filter, 0)
	return nodes, &filter, err
}

// nodesByPK reads the nodes of pks (sorted, distinct) by listing: one
// request per run of consecutive pks (at most a page), so that a range
// of nodes costs a page, not a request each. Pks that name no node are
// left out.
func nodesByPK(ctx context.Context, cl *client.Client, pks []int64) ([]client.Node, error) {
	var out []client.Node
	for i := 0; i < len(pks); {
		j := i + 1
		for j < len(pks) && pks[j] == pks[j-1]+1 && j-i < listPageSize {
			j++
		}
		after, n := pks[i]-1, j-i
		page, err := cl.ListNodes(ctx, client.NodeFilter{After: &after, Limit: &n})
		if err != nil {
			return nil, err
		}
		for _, nd := range page {
			if nd.PK <= pks[j-1] {
				out = append(out, nd)
			}
		}
		i = j
	}
	return out, nil
}

// cordonResult is what a cordon did: the nodes cordoned (draining ones
// included), those that kept the reason they had, and the pks that name
// no node.
type cordonResult struct {
	cordoned, kept []client.Node
	missing        []int64
	listedBy       *client.NodeFilter // the filters' listing; nil for pks
}

// all is every node the cordon leaves cordoned, by pk.
func (r cordonResult) all() []client.Node {
	out := slices.Concat(r.cordoned, r.kept)
	slices.SortFunc(out, func(a, b client.Node) int { return cmp.Compare(a.PK, b.PK) })
	return out
}

// cordon cordons the nodes pks names, or those o's filters select, and
// prints what became of each. With --reason every node takes it; without,
// a node already cordoned keeps its reason (nothing is sent for it) and
// the others get the default. The nodes are sent by pk, in batches of
// maxPKsPerRequest; filters are listed first.
func (o *cordonOptions) cordon(ctx context.Context, e *cliEnv, c command, cl *client.Client, pks []int64) (cordonResult, error) {
	var res cordonResult
	send, reason := pks, o.reason
	if len(pks) == 0 || !o.reasonSet {
		nodes, f, err := o.targets(ctx, cl, pks)
		if err != nil {
			return res, err
		}
		res.listedBy = f
		if f != nil && len(nodes) > maxPKsPerRequest && !o.all {
			return res, fmt.Errorf("the filters select %d nodes, more than the %d the API takes out of scheduling by filter at once; "+
				"narrow them, or pass --all to cordon every one (in batches)", len(nodes), maxPKsPerRequest)
		}
		found := map[int64]bool{}
		send = nil
		for _, n := range nodes {
			found[n.PK] = true
			if !o.reasonSet && n.CordonReason != nil {
				res.kept = append(res.kept, n)
			} else {
				send = append(send, n.PK)
			}
		}
		// Pks that name no node are sent too: the server says so.
		for _, pk := range pks {
			if !found[pk] {
				send = append(send, pk)
			}
		}
		slices.Sort(send)
	}
	if !o.reasonSet {
		reason = defaultReason(c.name)
	}
	for i, batch := range chunks(send) {
		r, err := cl.CordonNodes(ctx, client.NodeCordon{Nodes: &batch, Reason: reason}, client.IdempotencyKey(client.NewIdempotencyKey()))
		if err != nil {
			return res, partly(err, i, "cordoned", len(res.cordoned), send[i*maxPKsPerRequest:])
		}
		res.cordoned = append(res.cordoned, r.Cordoned...)
		for _, nd := range r.NotCordoned {
			fmt.Fprintf(e.stderr, "node/%d: %s\n", nd.PK, nd.Reason)
			if nd.Reason == noSuchNode {
				res.missing = append(res.missing, nd.PK)
			}
		}
	}
	kept := map[int64]bool{}
	for _, n := range res.kept {
		kept[n.PK] = true
	}
	for _, n := range res.all() {
		var notes []string
		if n.CurrentJob != nil {
			notes = append(notes, fmt.Sprintf("job %d holds it", *n.CurrentJob))
		}
		if kept[n.PK] {
			notes = append(notes, "already cordoned: "+*n.CordonReason)
		}
		if len(notes) > 0 {
			fmt.Fprintf(e.stdout, "node/%d %s (%s)\n", n.PK, n.State, strings.Join(notes, "; "))
		} else {
			fmt.Fprintf(e.stdout, "node/%d %s\n", n.PK, n.State)
		}
	}
	if len(send) == 0 && len(res.kept) == 0 {
		fmt.Fprintln(e.stderr, "no node matched")
	}
	return res, nil
}

// missingError is the not-found failure of pks that name no node; nil
// when there are none.
func missingError(missing []int64) error {
	if len(missing) == 0 {
		return nil
	}
	return notFound(fmt.Errorf("no node %s", pksText(missing)))
}

// nodesCordon is `registryd nodes cordon`.
func nodesCordon(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := cordonFlags(c.name)
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	res, err := o.cordon(ctx, e, c, cl, pks)
	if err != nil {
		return err
	}
	return missingError(res.missing)
}

// nodesUncordon is `registryd nodes uncordon`. With filters, it uncordons
// the cordoned and draining nodes they select. The nodes are sent by pk,
// in batches of maxPKsPerRequest.
func nodesUncordon(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := cordonFlags(c.name)
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	if len(pks) == 0 {
		f, err := o.filter(ctx, cl)
		if err != nil {
			return err
		}
		if f.State == nil {
			f.State = client.States(client.StateCordoned, client.StateDraining)
		}
		nodes, err := listAll(ctx, cl, f, 0)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			pks = append(pks, n.PK)
		}
		if len(pks) == 0 {
			fmt.Fprintln(e.stderr, "no cordoned node matched")
			return nil
		}
	}
	var missing []int64
	for i, batch := range chunks(pks) {
		res, err := cl.UncordonNodes(ctx, client.NodeUncordon{Nodes: batch}, client.IdempotencyKey(client.NewIdempotencyKey()))
		if err != nil {
			return partly(err, i, "sent to be uncordoned", i*maxPKsPerRequest, pks[i*maxPKsPerRequest:])
		}
		for _, n := range res.Uncordoned {
			fmt.Fprintf(e.stdout, "node/%d uncordoned (%s)\n", n.PK, n.State)
		}
		for _, nd := range res.NotUncordoned {
			if nd.Reason == noSuchNode {
				missing = append(missing, nd.PK)
				fmt.Fprintf(e.stderr, "node/%d: %s\n", nd.PK, nd.Reason)
				continue
			}
			fmt.Fprintf(e.stdout, "node/%d %s\n", nd.PK, nd.Reason)
		}
	}
	return missingError(missing)
}

// nodesDrain is `registryd nodes drain`: it cordons the nodes, then waits
// until no job holds any of them. Its progress goes to stdout whenever it
// changes; at the deadline it fails with exit status 3, naming the jobs
// that still hold nodes and which. A look that fails for a while (the
// registry restarting, a 5xx, a timeout) is said once and tried again
// every interval; other refusals end the drain.
func nodesDrain(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := cordonFlags(c.name)
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	if o.interval == 0 {
		o.interval = 2 * time.Second
	}
	res, err := o.cordon(ctx, e, c, cl, pks)
	if err != nil {
		return err
	}
	w := &drainWatch{cl: cl, stderr: e.stderr, warned: map[int64]bool{}, filter: lifecycleFree(res.listedBy)}
	for _, n := range res.all() {
		w.pks = append(w.pks, n.PK)
	}
	total := len(w.pks)
	wait := ctx
	if o.deadline > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, o.deadline)
		defer cancel()
	}
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	var held map[int64][]int64
	last, failing := "", false
	for {
		v, err := w.look(wait)
		switch {
		case err == nil:
			if failing {
				fmt.Fprintln(e.stderr, "the registry answers again")
				failing = false
			}
			held = v.held
			if len(held) == 0 {
				return drainDone(e, v, total, res.missing)
			}
			if line := progressLine(held, total); line != last {
				fmt.Fprintln(e.stdout, line)
				last = line
			}
		case wait.Err() != nil:
		case transient(err):
			if !failing {
				fmt.Fprintf(e.stderr, "warning: cannot read the nodes: %s; trying again every %s\n", errorText(err), o.interval)
				failing = true
			}
		default:
			return err
		}
		select {
		case <-wait.Done():
			what := heldText(held, total)
			if failing && held != nil {
				what += " (as last read: the registry has not answered since)"
			}
			if ctx.Err() != nil {
				// Ctrl-C: the nodes stay cordoned, and the drain is not
				// done, which the exit status must not hide.
				return fmt.Errorf("interrupted: %s", what)
			}
			return &exitError{code: exitDeadline, err: fmt.Errorf("deadline %s reached: %s", o.deadline, what)}
		case <-tick.C:
		}
	}
}

// drainDone ends a drain no job holds a node of: done, unless someone
// uncordoned nodes of it meanwhile, which are not drained (a claim may
// take them) and fail it.
func drainDone(e *cliEnv, v drainView, total int, missing []int64) error {
	if n := len(v.uncordoned); n > 0 {
		verb := "is"
		if n > 1 {
			verb = "are"
		}
		return fmt.Errorf("no job holds any of the %d nodes, but %d of them (%s) %s no longer cordoned: someone uncordoned them; %d of %d nodes drained",
			total, n, pksText(v.uncordoned), verb, total-n, total)
	}
	fmt.Fprintf(e.stdout, "%d of %d nodes drained: no job holds any\n", total, total)
	return missingError(missing)
}

// drainWatch reads the nodes of a drain, by any state: a node someone
// uncordons during the drain is still the drain's.
type drainWatch struct {
	cl     *client.Client
	stderr io.Writer
	pks    []int64 // the drain's nodes, sorted
	// filter, when the drain selected its nodes by filters that a drain
	// does not change, lists most of them in a page or two; the rest (or
	// all, for a drain of pks) are read by pk.
	filter *client.NodeFilter
	warned map[int64]bool
}

// drainView is one look at a drain's nodes.
type drainView struct {
	held       map[int64][]int64 // job → the nodes of the drain it holds
	uncordoned []int64           // nodes no job holds that are not cordoned
}

// look reads the drain's nodes and says, once per node, which left the
// drain: uncordoned by someone else, or deleted.
func (w *drainWatch) look(ctx context.Context) (drainView, error) {
	got := map[int64]client.Node{}
	want := map[int64]bool{}
	for _, pk := range w.pks {
		want[pk] = true
	}
	if w.filter != nil {
		nodes, err := listAll(ctx, w.cl, *w.filter, 0)
		if err != nil {
			return drainView{}, err
		}
		for _, n := range nodes {
			if want[n.PK] {
				got[n.PK] = n
			}
		}
	}
	var rest []int64
	for _, pk := range w.pks {
		if _, ok := got[pk]; !ok {
			rest = append(rest, pk)
		}
	}
	nodes, err := nodesByPK(ctx, w.cl, rest)
	if err != nil {
		return drainView{}, err
	}
	for _, n := range nodes {
		got[n.PK] = n
	}
	v := drainView{held: map[int64][]int64{}}
	for _, pk := range w.pks {
		n, ok := got[pk]
		switch {
		case !ok:
			w.warn(pk, "node/%d was deleted; it holds no job")
			continue
		case n.CordonReason == nil:
			w.warn(pk, "node/%d was uncordoned by someone else; it is no longer draining")
			if n.CurrentJob == nil {
				v.uncordoned = append(v.uncordoned, pk)
			}
		}
		if n.CurrentJob != nil {
			v.held[*n.CurrentJob] = append(v.held[*n.CurrentJob], pk)
		}
	}
	return v, nil
}

// warn prints format (with pk) on stderr, once per node.
func (w *drainWatch) warn(pk int64, format string) {
	if !w.warned[pk] {
		w.warned[pk] = true
		fmt.Fprintf(w.stderr, "warning: "+format+"\n", pk)
	}
}

// lifecycleFree is f without the members a cordon or a release changes
// (state, free, current job), so that it still lists the drain's nodes
// when they drain and are released; nil when nothing else is left of it
// (a list of the whole fleet would be no narrower than reading by pk).
func lifecycleFree(f *client.NodeFilter) *client.NodeFilter {
	if f == nil || f.Fabric == nil && f.Selector == nil && f.IP == nil && f.Owner == nil && f.MinGPUMem == nil && f.HardwareGeneration == nil {
		return nil
	}
	g := *f
	g.State, g.Free, g.CurrentJob, g.After, g.Limit = nil, nil, nil, nil, nil
	return &g
}

// transient reports whether a failure may pass by itself: no answer (the
// connection refused, reset or cut, a timeout), a 5xx, 408 or 429.
func transient(err error) bool {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Status >= 500 || ce.Status == 408 || ce.Status == 429
	}
	var op *net.OpError
	var ne net.Error
	return errors.As(err, &op) || errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// progressLine is "3 of 8 nodes still held by jobs 41, 42".
func progressLine(held map[int64][]int64, total int) string {
	n := 0
	for _, pks := range held {
		n += len(pks)
	}
	jobs := slices.Sorted(maps.Keys(held))
	word := "job"
	if len(jobs) > 1 {
		word = "jobs"
	}
	s := make([]string, len(jobs))
	for i, j := range jobs {
		s[i] = strconv.FormatInt(j, 10)
	}
	return fmt.Sprintf("%d of %d nodes still held by %s %s", n, total, word, strings.Join(s, ", "))
}

// heldText names which job holds which nodes: "2 of 8 nodes still held:
// job 41 holds nodes 5 and 6; job 42 holds node 7".
func heldText(held map[int64][]int64, total int) string {
	if held == nil {
		return "the nodes' holders could not be read before it"
	}
	n := 0
	var parts []string
	for _, j := range slices.Sorted(maps.Keys(held)) {
		pks := held[j]
		slices.Sort(pks)
		n += len(pks)
		word := "node"
		if len(pks) > 1 {
			word = "nodes"
		}
		parts = append(parts, fmt.Sprintf("job %d holds %s %s", j, word, pksText(pks)))
	}
	return fmt.Sprintf("%d of %d nodes still held: %s", n, total, strings.Join(parts, "; "))
}

// chunks is pks in batches of the most a request takes, in order.
func chunks(pks []int64) [][]int64 {
	return slices.Collect(slices.Chunk(pks, maxPKsPerRequest))
}

// partly is err from batch i, after done nodes were acted on: past the
// first batch the admin is told what was done and what was not sent
// (the same command again does the rest).
func partly(err error, i int, did string, done int, unsent []int64) error {
	if i == 0 {
		return err
	}
	return fmt.Errorf("%w\n%d nodes were %s before this failure; %d not sent (node/%d to node/%d): the same command again does the rest",
		err, done, did, len(unsent), unsent[0], unsent[len(unsent)-1])
}
