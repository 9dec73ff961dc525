package main

import (
	"context"
	"errors"
	"strings"
	"testing"

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
