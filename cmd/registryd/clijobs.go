package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// nodesLabel is `registryd nodes label PK… KEY=VALUE… KEY-…`: one merge
// patch of each node's labels, KEY- removing KEY, other labels kept.
func nodesLabel(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs := newFlagSet(c.name)
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return err
	}
	var pks []int64
	labels := map[string]*string{}
	for _, a := range rest {
		if pk, err := strconv.ParseInt(a, 10, 64); err == nil && pk > 0 {
			pks = append(pks, pk)
			continue
		}
		k, v, set := strings.Cut(a, "=")
		var change *string
		switch {
		case set && k != "":
			change = &v
		case !set && strings.HasSuffix(a, "-") && len(a) > 1:
			k = strings.TrimSuffix(a, "-")
		default:
			return usageError(e.stderr, c, fmt.Errorf("%q is neither a node pk, KEY=VALUE nor KEY-", a))
		}
		if err := checkLabelChange(k, change); err != nil {
			return usageError(e.stderr, c, err)
		}
		if _, twice := labels[k]; twice {
			return usageError(e.stderr, c, fmt.Errorf("label %q is changed twice: set it or remove it, once", k))
		}
		labels[k] = change
	}
	if len(pks) == 0 || len(labels) == 0 {
		return usageError(e.stderr, c, errors.New("name at least one node pk and one label change"))
	}
	cl, err := e.client(ctx)
	if err != nil {
		return err
	}
	return eachNode(pks, func(pk int64) error {
		n, err := cl.PatchNode(ctx, pk, client.NodePatch{Labels: labels})
		if err == nil {
			fmt.Fprintf(e.stdout, "node/%d labelled: %s\n", n.PK, labelsText(n.Labels))
		}
		return err
	})
}

// checkLabelChange is what the server holds a label change to: a key
// (and the value it is set to, nil to remove it) of a label's syntax.
func checkLabelChange(k string, v *string) error {
	if msg := registry.CheckLabelKey(k); msg != "" {
		return fmt.Errorf("label key %q: %s", k, msg)
	}
	if v != nil {
		if msg := registry.CheckLabelValue(*v); msg != "" {
			return fmt.Errorf("label %s's value %q: %s", k, *v, msg)
		}
	}
	return nil
}

// eachNode runs act on each pk in turn, and on every one of them: a
// failure for one node does not stop the others. Its error names each
// node that failed and why, then the pks that name no node; its exit
// status is the most severe: 1 when any failed otherwise, else 4 when a
// pk names no node (act's ErrNotFound). A failure that is no node's own
// (no answer, 401, 403) stops at once: it would be every node's.
func eachNode(pks []int64, act func(pk int64) error) error {
	var failed []string
	var missing []int64
	for i, pk := range pks {
		err := act(pk)
		var ce *client.Error
		switch {
		case err == nil:
		case errors.Is(err, client.ErrNotFound):
			missing = append(missing, pk)
		case !errors.As(err, &ce) || ce.Status == 401 || ce.Status == 403:
			if i == 0 {
				return err // nothing done yet: the failure is all there is to say
			}
			failed = append(failed, fmt.Sprintf("node/%d: %s", pk, errorText(err)))
			if left := pks[i+1:]; len(left) > 0 {
				failed = append(failed, "not tried: "+pksText(left))
			}
			return &exitError{code: 1, err: nodesFailed(failed, missing)}
		default:
			failed = append(failed, fmt.Sprintf("node/%d: %s", pk, errorText(err)))
		}
	}
	if len(failed) > 0 {
		return &exitError{code: 1, err: nodesFailed(failed, missing)}
	}
	return missingError(missing)
}

// nodesFailed is eachNode's failure: a line per node that failed, then
// the pks that name no node.
func nodesFailed(failed []string, missing []int64) error {
	if len(missing) > 0 {
		failed = append(failed, "no node "+pksText(missing))
	}
	return errors.New("not done for every node:\n" + strings.Join(failed, "\n"))
}

// errorText is err for people: a server's problem as problemText words it.
func errorText(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return problemText(ce)
	}
	return err.Error()
}

// jobOptions are the flags of claim, release and renew.
type jobOptions struct {
	filterOptions
	viewOptions
	job                  int64
	count, perHost       int
	sameHost, sameFabric bool
	lease                time.Duration
}

func jobFlags(name string) (*flag.FlagSet, *jobOptions) {
	o := &jobOptions{}
	fs := newFlagSet(name)
	fs.Int64Var(&o.job, "job", 0, "the `JOB` (required)")
	switch name {
	case "nodes claim":
		fs.IntVar(&o.count, "count", 1, "how many nodes: all of them or none")
		fs.IntVar(&o.perHost, "per-host", 0, "take whole groups of `N` nodes per host (count a multiple of it)")
		fs.BoolVar(&o.sameHost, "same-host", false, "every node on one host")
		fs.BoolVar(&o.sameFabric, "same-fabric", false, "every node in one fabric")
		fs.DurationVar(&o.lease, "lease", 0, "the claim ends by itself after this long unless renewed, such as 10m; 0: no lease")
		o.filterOptions.add(fs, 0)
	case "nodes renew":
		fs.DurationVar(&o.lease, "lease", 0, "extend every lease of the job to this long from now, such as 10m (required)")
	}
	o.viewOptions.add(fs, false)
	return fs, o
}

// start reads a job command's flags (the job is required) and makes the
// client that acts.
func (o *jobOptions) start(ctx context.Context, e *cliEnv, c command, fs *flag.FlagSet, args []string) ([]int64, *client.Client, error) {
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return nil, nil, err
	}
	pks, err := parsePKs(rest)
	switch {
	case err != nil:
	case o.job <= 0:
		err = errors.New("--job is required (a positive job id)")
	case len(pks) > 0 && c.name != "nodes release":
		err = fmt.Errorf("unexpected argument %q", rest[0])
	case o.lease < 0 || o.lease > 0 && o.lease < time.Second:
		err = errors.New("--lease is at least 1s")
	case c.name == "nodes renew" && o.lease == 0:
		err = errors.New("--lease is required")
	case c.name == "nodes claim" && (o.count < 1 || o.perHost < 0):
		err = errors.New("--count must be positive and --per-host not negative")
	default:
		err = errors.Join(o.filterOptions.check(), o.viewOptions.check())
	}
	if err != nil {
		return nil, nil, usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	return pks, cl, err
}

// nodesClaim is `registryd nodes claim`, for debugging a scheduler: the
// claim a scheduler would send, and the nodes it took.
func nodesClaim(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := jobFlags(c.name)
	_, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	f, err := o.filter(ctx, cl)
	if err != nil {
		return err
	}
	claim := client.NodeClaim{Job: o.job, Count: &o.count, Fabric: f.Fabric, Selector: f.Selector, IP: f.IP,
		Owner: f.Owner, MinGPUMem: f.MinGPUMem, HardwareGeneration: f.HardwareGeneration}
	if o.perHost > 0 {
		claim.PerHost = &o.perHost
	}
	if o.sameHost {
		claim.SameHost = client.Ptr(true)
	}
	if o.sameFabric {
		claim.SameFabric = client.Ptr(true)
	}
	if o.lease > 0 {
		claim.LeaseSeconds = client.Ptr(int64(o.lease / time.Second))
	}
	res, err := cl.ClaimNodes(ctx, claim)
	if err != nil {
		return err
	}
	return printNodes(e, o.viewOptions, res.Nodes, false)
}

// nodesRelease is `registryd nodes release --job J [PK…]`.
func nodesRelease(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := jobFlags(c.name)
	pks, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	r := client.NodeRelease{Job: o.job}
	if len(pks) > 0 {
		r.Nodes = &pks
	}
	res, err := cl.ReleaseNodes(ctx, r, client.IdempotencyKey(client.NewIdempotencyKey()))
	if err != nil {
		return err
	}
	var missing []int64
	for _, nr := range res.NotReleased {
		fmt.Fprintf(e.stderr, "node/%d: %s\n", nr.PK, nr.Reason)
		if nr.Reason == noSuchNode {
			missing = append(missing, nr.PK)
		}
	}
	if err := printNodes(e, o.viewOptions, res.Released, false); err != nil {
		return err
	}
	return missingError(missing)
}

// nodesRenew is `registryd nodes renew --job J --lease D`.
func nodesRenew(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := jobFlags(c.name)
	_, cl, err := o.start(ctx, e, c, fs, args)
	if err != nil {
		return err
	}
	res, err := cl.RenewLeases(ctx, client.NodeRenew{Job: o.job, LeaseSeconds: int64(o.lease / time.Second)})
	if err != nil {
		return err
	}
	return printNodes(e, o.viewOptions, res.Nodes, false)
}

// nodesDelete is `registryd nodes delete PK… [--force]`.
func nodesDelete(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, force := deleteFlags()
	rest, err := parseArgs(e, c, fs, args)
	if err != nil {
		return err
	}
	pks, err := parsePKs(rest)
	if err == nil && len(pks) == 0 {
		err = errors.New("name at least one node pk")
	}
	if err != nil {
		return usageError(e.stderr, c, err)
	}
	cl, err := e.client(ctx)
	if err != nil {
		return err
	}
	return eachNode(pks, func(pk int64) error {
		del := cl.DeleteNode
		if *force {
			del = cl.ForceDeleteNode
		}
		err := del(ctx, pk)
		if err == nil {
			fmt.Fprintf(e.stdout, "node/%d deleted\n", pk)
		}
		return err
	})
}

func deleteFlags() (*flag.FlagSet, *bool) {
	fs := newFlagSet("nodes delete")
	return fs, fs.Bool("force", false, "delete nodes a job holds too (admins): the job loses them")
}
