package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
)

// viewOptions are how nodes are shown: -o, --no-headers, --sort-by.
type viewOptions struct {
	output    string
	noHeaders bool
	sortBy    string
}

// sortKeys are --sort-by's keys; each sorts ascending, then by pk.
var sortKeys = map[string]func(a, b client.Node) int{
	"pk":   func(a, b client.Node) int { return 0 },
	"host": compareHost,
	"ip":   compareHost,
	"name": compareHost,
	"state": func(a, b client.Node) int {
		return cmp.Compare(slices.Index(nodeStates, a.State), slices.Index(nodeStates, b.State))
	},
	"seen": func(a, b client.Node) int { return compareTimes(a.LastSeen, b.LastSeen) },
	"age":  func(a, b client.Node) int { return compareTimes(&b.CreatedAt, &a.CreatedAt) },
	"job":  func(a, b client.Node) int { return compareInts(a.CurrentJob, b.CurrentJob) },
	"fabric": func(a, b client.Node) int {
		return cmp.Compare(dash(a.Fabric), dash(b.Fabric))
	},
	"gpu-mem": func(a, b client.Node) int { return compareInts(a.GPUMem, b.GPUMem) },
}

// sortKeyWords are sortKeys' keys in the order help, errors and
// completion list them.
var sortKeyWords = []string{"pk", "host", "ip", "name", "state", "seen", "age", "job", "fabric", "gpu-mem"}

// sortKeyNames lists sortKeys for help and errors.
var sortKeyNames = strings.Join(sortKeyWords, ", ")

func compareHost(a, b client.Node) int {
	x, _ := netip.ParseAddr(a.IP)
	y, _ := netip.ParseAddr(b.IP)
	return cmp.Or(x.Compare(y), cmp.Compare(a.Index, b.Index))
}

// compareTimes orders nil (never) first.
func compareTimes(a, b *time.Time) int { return compareNil(a, b, time.Time.Compare) }

// compareInts orders nil first.
func compareInts(a, b *int64) int { return compareNil(a, b, cmp.Compare[int64]) }

// compareNil orders nil first, then by compare.
func compareNil[T any](a, b *T, compare func(T, T) int) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return compare(*a, *b)
}

func (v *viewOptions) add(fs *flag.FlagSet, sortable bool) {
	outputFlag(fs, &v.output, outputFormats...)
	fs.BoolVar(&v.noHeaders, "no-headers", false, "tables without their header line, for scripts")
	if sortable {
		fs.StringVar(&v.sortBy, "sort-by", "pk", "sort by `KEY`: "+sortKeyNames)
	}
}

func (v *viewOptions) check() error {
	if err := checkOutput(v.output, outputFormats...); err != nil {
		return err
	}
	if _, ok := sortKeys[v.sortBy]; v.sortBy != "" && !ok {
		return fmt.Errorf("--sort-by %s: want one of %s", v.sortBy, sortKeyNames)
	}
	return nil
}

// sort orders nodes by --sort-by, then pk.
func (v *viewOptions) sort(nodes []client.Node) {
	by := sortKeys[cmp.Or(v.sortBy, "pk")]
	slices.SortStableFunc(nodes, func(a, b client.Node) int { return cmp.Or(by(a, b), cmp.Compare(a.PK, b.PK)) })
}

// nodeTable is the table of nodes for -o table or wide.
func nodeTable(e *cliEnv, wide bool) *table {
	t := &table{header: []string{"PK", "HOST", "GPU", "MEM", "STATE", "JOB", "FABRIC", "SEEN"}}
	if wide {
		t.header = []string{"PK", "HOST", "GPU", "MEM", "MODEL", "HW", "STATE", "JOB", "LEASE", "FABRIC", "OWNER", "SOURCE", "DRIVER", "SEEN", "AGE", "LABELS", "REASON"}
	}
	if colourful(e.stdout, e.rawenv) {
		col := slices.Index(t.header, "STATE")
		t.paint = func(i int, cell string) string {
			if i == col {
				return paintState(cell)
			}
			return cell
		}
	}
	return t
}

// watchWidths are the least widths of a watch's columns.
var watchWidths = map[string]int{"PK": 6, "HOST": 15, "MEM": 6, "STATE": len("draining"), "JOB": 10,
	"LEASE": len("expired"), "SEEN": len("59m ago"), "AGE": len("59m ago")}

// nodeRow is n's row of a table; state overrides its state ("deleted").
func nodeRow(n client.Node, wide bool, now time.Time, state string) []string {
	if state == "" {
		state = string(n.State)
	}
	if !wide {
		return []string{strconv.FormatInt(n.PK, 10), clip(n.IP), strconv.Itoa(int(n.Index)), bytesText(n.GPUMem),
			state, intDash(n.CurrentJob), clip(dash(n.Fabric)), ago(n.LastSeen, now)}
	}
	return []string{strconv.FormatInt(n.PK, 10), clip(n.IP), strconv.Itoa(int(n.Index)), bytesText(n.GPUMem),
		clip(dash(n.GPUModel)), intDash(n.HardwareGeneration), state, intDash(n.CurrentJob),
		until(n.LeaseExpiresAt, now), clip(dash(n.Fabric)), clip(dash(n.Owner)), string(n.Source), clip(n.DriverVersion),
		ago(n.LastSeen, now), ago(&n.CreatedAt, now), clip(labelsText(n.Labels)), clip(dash(n.CordonReason))}
}

// labelsText is a node's labels as a selector would name them, by key.
func labelsText(l client.NodeLabels) string {
	if len(l) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + l[k]
	}
	return strings.Join(keys, ",")
}

// printNodes shows nodes as -o asks: a table, the API's documents (one
// document when one node is asked for, else a list), or node/PK lines.
func printNodes(e *cliEnv, v viewOptions, nodes []client.Node, one bool) error {
	switch v.output {
	case outJSON, outYAML:
		docs := make([]json.RawMessage, len(nodes))
		for i, n := range nodes {
			d, err := e.docs.doc(n)
			if err != nil {
				return err
			}
			docs[i] = d
		}
		if one && len(docs) == 1 {
			return writeRaw(e.stdout, v.output, docs[0])
		}
		return writeRaw(e.stdout, v.output, jsonList(docs))
	case outName:
		for _, n := range nodes {
			fmt.Fprintf(e.stdout, "node/%d\n", n.PK)
		}
		return nil
	}
	if len(nodes) == 0 && !v.noHeaders {
		fmt.Fprintln(e.stderr, "no nodes")
		return nil
	}
	t := nodeTable(e, v.output == outWide)
	now := time.Now()
	for _, n := range nodes {
		t.rows = append(t.rows, nodeRow(n, v.output == outWide, now, ""))
	}
	t.write(e.stdout, v.noHeaders)
	return nil
}

// Types of a watch's events as -o json and yaml print them, kubectl
// --output-watch-events style.
const (
	watchAdded    = "added"    // listed, or entered the filters
	watchModified = "modified" // changed (or left the filters: as it now is)
	watchDeleted  = "deleted"
)

// printEvent prints one event of a watch for -o json (one compact
// {"type", "object"} per line), yaml (the same, a --- document each) or
// name (node/PK, and "deleted" after a deleted one).
func printEvent(e *cliEnv, output, typ string, n client.Node) error {
	if output == outName {
		if typ == watchDeleted {
			_, err := fmt.Fprintf(e.stdout, "node/%d deleted\n", n.PK)
			return err
		}
		_, err := fmt.Fprintf(e.stdout, "node/%d\n", n.PK)
		return err
	}
	doc, err := e.docs.doc(n)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString(`{"type":"` + typ + `","object":`)
	if err := json.Compact(&b, doc); err != nil {
		return err
	}
	b.WriteString("}")
	if output == outJSON {
		b.WriteByte('\n')
		_, err := e.stdout.Write(b.Bytes())
		return err
	}
	if _, err := io.WriteString(e.stdout, "---\n"); err != nil {
		return err
	}
	return writeRaw(e.stdout, output, b.Bytes())
}

// listPageSize is how many nodes one list request asks for; the CLI
// pages through the fleet by pk (after) until a page comes back short.
const listPageSize = 500

// listAll lists the nodes f selects, page by page, at most limit of them
// (0: every one), by pk.
func listAll(ctx context.Context, c *client.Client, f client.NodeFilter, limit int) ([]client.Node, error) {
	var out []client.Node
	size := func() int {
		if limit > 0 {
			return min(listPageSize, limit-len(out))
		}
		return listPageSize
	}
	err := pageThrough(f.After, size,
		func(after *int64, n int) ([]client.Node, error) {
			f.After, f.Limit = after, &n
			return c.ListNodes(ctx, f)
		},
		func(n client.Node) int64 { return n.PK },
		func(page []client.Node) bool {
			out = append(out, page...)
			return limit == 0 || len(out) < limit
		})
	return out, err
}

// listOptions are nodes list's flags.
type listOptions struct {
	filterOptions
	viewOptions
	limit int
	watch bool
}

func listFlags() (*flag.FlagSet, *listOptions) {
	o := &listOptions{}
	fs := newFlagSet("nodes list")
	o.filterOptions.add(fs, allFilters)
	o.viewOptions.add(fs, true)
	fs.IntVar(&o.limit, "limit", 0, "at most `N` nodes, the first by pk (0: every one)")
	fs.BoolVar(&o.watch, "watch", false, "after the list, print each node again as it changes (until Ctrl-C)")
	return fs, o
}

// nodesList is `registryd nodes list`.
func nodesList(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := listFlags()
	if _, err := parseArgs(e, c, fs, args); err != nil {
		return err
	}
	err := errors.Join(o.filterOptions.check(), o.viewOptions.check())
	if o.limit < 0 {
		err = errors.Join(err, errors.New("--limit must not be negative"))
	}
	if err != nil {
		return usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	if err != nil {
		return err
	}
	f, err := o.filter(ctx, cl)
	if err != nil {
		return err
	}
	if o.watch {
		return watchNodes(ctx, e, cl, f, o)
	}
	nodes, err := listAll(ctx, cl, f, o.limit)
	if err != nil {
		return err
	}
	o.sort(nodes)
	return printNodes(e, o.viewOptions, nodes, false)
}

// errRelist ends a watch whose view must be listed again (a reset).
var errRelist = errors.New("re-list")

// watchNodes prints the nodes f selects, then each change of one as it
// arrives, kubectl get --watch style: a node that changes is printed
// again (a deleted one as state "deleted"), and one that leaves the
// filter is printed once more as it now is. It runs until ctx ends
// (Ctrl-C), which is not a failure. The stream is not filtered: the
// server drops an event whose node no longer matches, so a node leaving
// the filters would never be seen to leave. The filters are applied
// here, with the registry's own NodeFilter.Match.
func watchNodes(ctx context.Context, e *cliEnv, c *client.Client, f client.NodeFilter, o *listOptions) error {
	m, err := matcher(f)
	if err != nil {
		return err
	}
	wide := o.output == outWide
	t := nodeTable(e, wide)
	// Rows printed later are cut to the first table's widths: room for
	// the values that change (a job id, a state, a new pk).
	t.widths = make([]int, len(t.header))
	for i, h := range t.header {
		t.widths[i] = watchWidths[h]
	}
	shown := map[int64]bool{}
	first := true
	for {
		l, err := c.ListNodesWithPosition(ctx, f)
		if err != nil {
			return quiet(ctx, err)
		}
		o.sort(l.Nodes)
		clear(shown)
		for _, n := range l.Nodes {
			shown[n.PK] = true
		}
		switch {
		case o.output == outTable || wide:
			now := time.Now()
			for _, n := range l.Nodes {
				t.rows = append(t.rows, nodeRow(n, wide, now, ""))
			}
			t.write(e.stdout, o.noHeaders || !first)
			t.keep = true
		default:
			for _, n := range l.Nodes {
				if err := printEvent(e, o.output, watchAdded, n); err != nil {
					return err
				}
			}
		}
		first = false
		opts := client.WatchOptions{After: &l.EventID}
		err = c.Watch(ctx, opts, func(ev client.Event) error {
			switch {
			case ev.Reset != nil:
				return errRelist
			case ev.Node == nil:
				return nil
			}
			n := ev.Node.Node
			var doc struct{ Node json.RawMessage }
			if err := json.Unmarshal(ev.Data, &doc); err != nil {
				return err
			}
			rn, err := registryNode(doc.Node)
			if err != nil {
				return fmt.Errorf("event %d: %w", ev.ID, err)
			}
			e.docs.set(n.PK, doc.Node)
			typ := watchModified
			in := ev.Node.Kind != client.EventDeleted && m.Match(rn, time.Now())
			switch {
			case in && !shown[n.PK]:
				shown[n.PK] = true
				typ = watchAdded
			case in:
			case shown[n.PK]:
				delete(shown, n.PK)
				if ev.Node.Kind == client.EventDeleted {
					typ = watchDeleted
				}
			default:
				return nil
			}
			if o.output == outTable || wide {
				state := ""
				if typ == watchDeleted {
					state = "deleted"
				}
				t.rows = append(t.rows, nodeRow(n, wide, time.Now(), state))
				t.write(e.stdout, true)
				return nil
			}
			return printEvent(e, o.output, typ, n)
		})
		if !errors.Is(err, errRelist) {
			return quiet(ctx, err)
		}
	}
}

// quiet is err, or nil once ctx has ended: Ctrl-C ends a watch or a
// drain's wait, and is not a failure.
func quiet(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func getFlags() (*flag.FlagSet, *viewOptions) {
	o := &viewOptions{}
	fs := newFlagSet("nodes get")
	o.add(fs, false)
	return fs, o
}

// nodesGet is `registryd nodes get PK…`: the nodes found are printed, and
// pks that name no node are reported after them (exit 4).
func nodesGet(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := getFlags()
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return err
	}
	pks, err := parsePKs(rest)
	switch {
	case err != nil:
		return usageError(e.stderr, c, err)
	case len(pks) == 0:
		return usageError(e.stderr, c, errors.New("name at least one node pk"))
	}
	if err := o.check(); err != nil {
		return usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	if err != nil {
		return err
	}
	var nodes []client.Node
	err = eachNode(pks, func(pk int64) error {
		n, err := cl.GetNode(ctx, pk)
		if err == nil {
			nodes = append(nodes, n)
		}
		return err
	})
	var missing *exitError
	if err != nil && !errors.As(err, &missing) {
		return err
	}
	if len(nodes) > 0 {
		if err := printNodes(e, *o, nodes, len(pks) == 1); err != nil {
			return err
		}
	}
	return err
}

// pksText is "5, 6 and 9".
func pksText(pks []int64) string {
	s := make([]string, len(pks))
	for i, pk := range pks {
		s[i] = strconv.FormatInt(pk, 10)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
