package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
)

// noSuchNode is the reason the API gives for a pk that names no node.
const noSuchNode = "no such node"

// cordonOptions are the flags of cordon, uncordon and drain.
type cordonOptions struct {
	filterOptions
	reason   string
	deadline time.Duration
	interval time.Duration
}

func cordonFlags(name, defaultReason string) (*flag.FlagSet, *cordonOptions) {
	o := &cordonOptions{}
	fs := newFlagSet(name)
	o.filterOptions.add(fs, allFilters)
	if defaultReason != "" {
		fs.StringVar(&o.reason, "reason", defaultReason, "why, for the other admins (cordon_reason, at most 200 characters)")
	}
	if name == "nodes drain" {
		fs.DurationVar(&o.deadline, "deadline", 0, "give up waiting after this long (exit 3), such as 2h; 0: wait until every node is released")
		fs.DurationVar(&o.interval, "interval", 2*time.Second, "how often to look whether the nodes are released")
	}
	return fs, o
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
	default:
		err = o.check()
	}
	if err != nil {
		return nil, nil, usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	return pks, cl, err
}

// cordon cordons the nodes pks names, or those o's filters select, and
// prints what became of each; it returns the nodes cordoned (draining
// ones included) and the pks that name no node.
func (o *cordonOptions) cordon(ctx context.Context, e *cliEnv, cl *client.Client, pks []int64) (cordoned []client.Node, missing []int64, err error) {
	req := client.NodeCordon{Reason: o.reason}
	if len(pks) > 0 {
		req.Nodes = &pks
	} else {
		f, err := o.filter(ctx, cl)
		if err != nil {
			return nil, nil, err
		}
		req = cordonOf(f, o.reason)
	}
	res, err := cl.CordonNodes(ctx, req, client.IdempotencyKey(client.NewIdempotencyKey()))
	if err != nil {
		return nil, nil, err
	}
	for _, n := range res.Cordoned {
		if n.CurrentJob != nil {
			fmt.Fprintf(e.stdout, "node/%d %s (job %d holds it)\n", n.PK, n.State, *n.CurrentJob)
		} else {
			fmt.Fprintf(e.stdout, "node/%d %s\n", n.PK, n.State)
		}
	}
	for _, nd := range res.NotCordoned {
		fmt.Fprintf(e.stderr, "node/%d: %s\n", nd.PK, nd.Reason)
		if nd.Reason == noSuchNode {
			missing = append(missing, nd.PK)
		}
	}
	if len(res.Cordoned) == 0 && len(res.NotCordoned) == 0 {
		fmt.Fprintln(e.stderr, "no node matched")
	}
	return res.Cordoned, missing, nil
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
	fs, o := cordonFlags(c.name, "cordoned with registryd nodes cordon")
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	_, missing, err := o.cordon(ctx, e, cl, pks)
	if err != nil {
		return err
	}
	return missingError(missing)
}

// nodesUncordon is `registryd nodes uncordon`. With filters, it uncordons
// the cordoned and draining nodes they select.
func nodesUncordon(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := cordonFlags(c.name, "")
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
	res, err := cl.UncordonNodes(ctx, client.NodeUncordon{Nodes: pks}, client.IdempotencyKey(client.NewIdempotencyKey()))
	if err != nil {
		return err
	}
	for _, n := range res.Uncordoned {
		fmt.Fprintf(e.stdout, "node/%d uncordoned (%s)\n", n.PK, n.State)
	}
	var missing []int64
	for _, nd := range res.NotUncordoned {
		if nd.Reason == noSuchNode {
			missing = append(missing, nd.PK)
			fmt.Fprintf(e.stderr, "node/%d: %s\n", nd.PK, nd.Reason)
			continue
		}
		fmt.Fprintf(e.stdout, "node/%d %s\n", nd.PK, nd.Reason)
	}
	return missingError(missing)
}

// nodesDrain is `registryd nodes drain`: it cordons the nodes, then waits
// until no job holds any of them. Its progress goes to stdout whenever it
// changes; at the deadline it fails with exit status 3, naming the jobs
// that still hold nodes and which.
func nodesDrain(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := cordonFlags(c.name, "drained with registryd nodes drain")
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	if o.interval == 0 {
		o.interval = 2 * time.Second
	}
	cordoned, missing, err := o.cordon(ctx, e, cl, pks)
	if err != nil {
		return err
	}
	set := map[int64]bool{}
	for _, n := range cordoned {
		set[n.PK] = true
	}
	wait := ctx
	if o.deadline > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, o.deadline)
		defer cancel()
	}
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	var held map[int64][]int64
	last := ""
	for {
		h, err := heldByJobs(wait, cl, set)
		switch {
		case err == nil:
			held = h
		case wait.Err() == nil:
			return err
		}
		if err == nil {
			if len(held) == 0 {
				fmt.Fprintf(e.stdout, "%d of %d nodes drained: no job holds any\n", len(set), len(set))
				return missingError(missing)
			}
			if line := progressLine(held, len(set)); line != last {
				fmt.Fprintln(e.stdout, line)
				last = line
			}
		}
		select {
		case <-wait.Done():
			if ctx.Err() != nil {
				// Ctrl-C: the nodes stay cordoned, and the drain is not
				// done, which the exit status must not hide.
				return fmt.Errorf("interrupted: %s", heldText(held, len(set)))
			}
			return &exitError{code: exitDeadline, err: fmt.Errorf("deadline %s reached: %s", o.deadline, heldText(held, len(set)))}
		case <-tick.C:
		}
	}
}

// heldByJobs is, for each job holding nodes of set, the pks it holds. A
// cordoned node a job holds is draining (or lost or gone, which come
// first), so one list of those states finds every one.
func heldByJobs(ctx context.Context, cl *client.Client, set map[int64]bool) (map[int64][]int64, error) {
	f := client.NodeFilter{State: client.States(client.StateDraining, client.StateLost, client.StateGone)}
	nodes, err := listAll(ctx, cl, f, 0)
	if err != nil {
		return nil, err
	}
	held := map[int64][]int64{}
	for _, n := range nodes {
		if set[n.PK] && n.CurrentJob != nil {
			held[*n.CurrentJob] = append(held[*n.CurrentJob], n.PK)
		}
	}
	return held, nil
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
