package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
)

// nodes delete and label act on every pk named, whatever becomes of one:
// each failure is named, and the exit status is the most severe (1 for
// any failure, else 4 for a pk that names no node). The server's
// conflict says which job holds the node.
func TestNodesCLIEveryPK(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f) // job 41 holds nodes 1 and 2
	ctx := context.Background()
	r := cli(t, f.env(t), "nodes", "delete", "99999", "1", "4")
	if r.code != 1 || r.stdout != "node/4 deleted\n" {
		t.Errorf("delete 99999 1 4: %+v", r)
	}
	for _, want := range []string{"node/1: 409 Conflict: job 41 holds node 1;", "no node 99999"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("delete 99999 1 4: stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if _, err := f.api.GetNode(ctx, 4); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("node 4 after delete 99999 1 4: %v", err)
	}
	// Only pks that name nothing: 4.
	r = cli(t, f.env(t), "nodes", "label", "99999", "3", "5", "tier=gold")
	if r.code != exitNotFound || !strings.Contains(r.stderr, "no node 99999") {
		t.Errorf("label 99999 3 5: %+v", r)
	}
	for _, pk := range []int64{3, 5} {
		if n, err := f.api.GetNode(ctx, pk); err != nil || n.Labels["tier"] != "gold" {
			t.Errorf("node %d after label 99999 3 5: %v %v", pk, err, n.Labels)
		}
	}
}

// Mistakes the command line shows are usage errors (exit 2), and nothing
// is sent: a label key or value the server refuses, a label both set and
// removed, an --ip prefix with host bits.
func TestNodesCLIUsageNotSent(t *testing.T) {
	t.Parallel()
	f := setupCLI(t)
	aFleet(t, f)
	ctx := context.Background()
	before, err := f.api.ListNodes(ctx, client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"nodes", "label", "4", "bad key=1"},
		{"nodes", "label", "4", "a=bad value"},
		{"nodes", "label", "4", "x.-"},
		{"nodes", "label", "4", "a=1", "a-"},
		{"nodes", "label", "4", "a=1", "a=2"},
		{"nodes", "list", "--ip", "10.0.0.5/24"},
		{"nodes", "cordon", "--ip", "10.0.0.5/24"},
	} {
		r := cli(t, f.env(t), args...)
		if r.code != 2 || !strings.Contains(r.stderr, "usage: registryd") || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error (2)", args, r.code, r.stdout, r.stderr)
		}
	}
	after, err := f.api.ListNodes(ctx, client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("usage errors changed nodes (-before +after):\n%s", d)
	}
}
