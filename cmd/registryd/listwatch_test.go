package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// Two `registryd serve` replicas on one database, writers PATCHing nodes
// on A all along: a one-page list on B answered from B's node cache,
// then a watch on B from the list's X-Event-Id, delivers every change
// after the list exactly once: for each node the versions the watch
// brings are the listed version's successors up to the node's final
// version, in order, none missing, none twice. Faults caught (each tried
// once): the cache's list position one below what it applied (a version
// the list showed came again) and one above (a version missing).
func TestServeListThenWatchExactlyOnce(t *testing.T) {
	t.Parallel()
	urls, admin := replicas(t, pgtest.New(t), 2)
	a, b := urls[0], urls[1]
	ctx := t.Context()
	pks := make([]int64, 8)
	for i := range pks {
		pks[i] = createNode(t, a, admin, "10.22.6.1", i)
	}
	newClient := func(base string) *client.Client {
		c, err := client.New(base, client.WithToken(admin))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, cb := newClient(a), newClient(b)
	apitest.Eventually(t, 20*time.Second, "b's node cache holds the whole fleet", func() bool {
		return apitest.Scrape(t, b+"/metrics").Get(t, "registryd_node_cache_complete") == 1
	})

	// Writers: each PATCHes its two nodes in turn until told to stop.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	var errOnce sync.Once
	for w := range 4 {
		wg.Go(func() {
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				pk := pks[2*w+int(i%2)]
				v := 4096 + i
				if _, err := ca.PatchNode(ctx, pk, client.NodePatch{CPUMem: &v}); err != nil {
					errOnce.Do(func() { writeErr = err })
					return
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // writes before the list too

	// The list, answered from memory (one page: exact).
	limit := 100
	fromMemory := func() float64 {
		return apitest.Scrape(t, b+"/metrics").Get(t, "registryd_node_cache_list_pages_total", "source", "memory")
	}
	var list client.NodeList
	for try := 0; ; try++ {
		before := fromMemory()
		var err error
		if list, err = cb.ListNodesWithPosition(ctx, client.NodeFilter{Limit: &limit}); err != nil {
			t.Fatal(err)
		}
		if fromMemory() > before {
			break
		}
		if try == 50 {
			t.Fatal("50 lists on b, none answered from its node cache")
		}
	}
	listed := map[int64]int64{}
	for _, n := range list.Nodes {
		listed[n.PK] = n.Version
	}
	if len(listed) != len(pks) {
		t.Fatalf("the list has %d nodes, want %d", len(listed), len(pks))
	}

	var mu sync.Mutex
	got := map[int64][]int64{}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- cb.Watch(wctx, client.WatchOptions{After: &list.EventID}, func(e client.Event) error {
			if e.Reset != nil {
				return fmt.Errorf("reset: %+v", *e.Reset)
			}
			if e.Node != nil {
				mu.Lock()
				got[e.Node.Node.PK] = append(got[e.Node.Node.PK], e.Node.Node.Version)
				mu.Unlock()
			}
			return nil
		})
	}()
	time.Sleep(time.Second) // writes during the watch
	close(stop)
	wg.Wait()
	if writeErr != nil {
		t.Fatalf("a writer: %v", writeErr)
	}
	final, err := ca.ListNodes(ctx, client.NodeFilter{}, client.NoCache())
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64][]int64{}
	for _, n := range final {
		for v := listed[n.PK] + 1; v <= n.Version; v++ {
			want[n.PK] = append(want[n.PK], v)
		}
	}
	var diff string
	apitest.Eventually(t, 10*time.Second, "the watch delivers every change after the list", func() bool {
		mu.Lock()
		defer mu.Unlock()
		diff = ""
		for _, pk := range pks {
			if !slices.Equal(got[pk], want[pk]) {
				diff += fmt.Sprintf("\nnode %d (listed at version %d): got versions %v, want %v", pk, listed[pk], got[pk], want[pk])
			}
		}
		return diff == ""
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("watch: %v", err)
	}
	if diff != "" {
		t.Fatalf("list at %d, then watch:%s", list.EventID, diff)
	}
}
