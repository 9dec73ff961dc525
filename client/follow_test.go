package client_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/registry"
)

// Reads take MaxStale and NoCache (the server accepts both directives),
// and a list and then a watch from its
// position see every change once, with writers writing all along, and
// an informer's view ends equal to a strong list.
func TestFollowRealServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	var pks []int64
	for i := range int32(6) {
		n, _, err := admin.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.1", Index: i, CPUMem: gib, DriverVersion: "550"})
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	for _, opt := range []client.CallOption{client.MaxStale(), client.NoCache()} {
		if _, err := admin.GetNode(ctx, pks[0], opt); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.HeadNode(ctx, pks[0], opt); err != nil {
			t.Fatal(err)
		}
		if l, err := admin.ListNodes(ctx, client.NodeFilter{}, opt); err != nil || len(l) != len(pks) {
			t.Fatalf("list: %d nodes, %v", len(l), err)
		}
	}
	// Writers write before, during and after the list.
	writes := func(round int) {
		var wg sync.WaitGroup
		for i, pk := range pks[:4] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := admin.PatchNode(ctx, pk, client.NodePatch{DriverVersion: client.Ptr(fmt.Sprint("d", round, i))}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for round := range 20 {
			writes(round)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	list, err := admin.ListNodesWithPosition(ctx, client.NodeFilter{})
	<-done // the writers are done before the test may end
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := admin.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.2", Index: 0, CPUMem: gib, DriverVersion: "550"}); err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteNode(ctx, pks[5]); err != nil {
		t.Fatal(err)
	}
	want, err := admin.ListNodesWithPosition(ctx, client.NodeFilter{}, client.NoCache())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range want.Nodes {
		if etag, err := admin.HeadNode(ctx, n.PK); err != nil || etag != strconv.Quote(strconv.FormatInt(n.Version, 10)) {
			t.Errorf("node %d: version %d, ETag %s, %v", n.PK, n.Version, etag, err)
		}
	}

	// The list, then the events after its position, in order and each
	// once, make the fleet as a strong list shows it. (This server lists
	// from PostgreSQL, so the list may already show some of those
	// events: they are told apart by version, as the Informer does.)
	view := map[int64]client.Node{}
	for _, n := range list.Nodes {
		view[n.PK] = n
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	last := list.EventID
	err = s.watcher(s.token("sched", registry.RoleScheduler), nil).Watch(wctx, client.WatchOptions{After: &list.EventID},
		func(ev client.Event) error {
			if ev.ID < last || ev.Node != nil && ev.ID == last {
				return fmt.Errorf("event %d (%s) after %d", ev.ID, ev.Type, last)
			}
			last = ev.ID
			var held client.Node
			if ev.Node != nil {
				held = view[ev.Node.Node.PK]
			}
			switch {
			case ev.Reset != nil:
				return fmt.Errorf("reset: %+v", ev.Reset)
			case ev.Node != nil && ev.Node.Kind == client.EventDeleted:
				delete(view, ev.Node.Node.PK)
			case ev.Node != nil && (ev.Node.Node.Version == 0 || ev.Node.Node.Version > held.Version):
				view[ev.Node.Node.PK] = ev.Node.Node
			}
			if cmp.Equal(want.Nodes, byPK(view)) {
				cancel()
			}
			return nil
		})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("watch from the list's position %d: %v (at %d; the strong list at %d)\n%s", list.EventID, err, last, want.EventID,
			cmp.Diff(want.Nodes, byPK(view)))
	}

	// An informer follows the same fleet to the same view.
	in := client.NewInformer(s.watcher(s.token("sched", registry.RoleScheduler), nil), client.InformerOptions{})
	runInformer(t, in)
	writes(99)
	final, err := admin.ListNodesWithPosition(ctx, client.NodeFilter{}, client.NoCache())
	if err != nil {
		t.Fatal(err)
	}
	var diff string
	apitest.Eventually(t, 10*time.Second, "the informer's view is a strong list", func() bool {
		view, _ := in.Nodes()
		diff = cmp.Diff(final.Nodes, view)
		return diff == ""
	})
	if diff != "" {
		t.Errorf("informer (-strong list +view):\n%s", diff)
	}
}
