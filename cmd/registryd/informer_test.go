package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// The Go client's Informer, following replica b while every write goes
// to replica a, keeps a view equal to a strong list (Cache-Control:
// no-cache) of a: across a restart of b (with writes while b is down),
// before a lossy failover, after it (the writes the new primary lost
// leave the view: the reset makes it list again) and with writes after
// it. Before epochs and positions the view kept the lost
// node and missed later changes (ids handed out again).
func TestServeInformerThroughLossyFailover(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewPair(t, false)
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.MultiHostURL(primary, standby), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_NODE_CACHE": "1000"}
	pb := startProcess(t, env, "serve")
	a, b := startProcess(t, env, "serve").serving(t), pb.serving(t)
	admin := adminToken(t, env)
	ctx := context.Background()
	newClient := func(base string) *client.Client {
		c, err := client.New(base, client.WithToken(admin),
			client.WithRetry(client.Retry{MinDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	strong := newClient(a)
	kept := createNode(t, a, admin, "10.22.5.1", 0)

	var lists atomic.Int64
	in := client.NewInformer(newClient(b), client.InformerOptions{Handler: func(u client.InformerUpdate) {
		if u.Listed {
			lists.Add(1)
		}
	}})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("the informer ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the informer did not stop within 10s of its context")
		}
	})
	select {
	case <-in.Synced():
	case <-time.After(20 * time.Second):
		t.Fatal("the informer did not sync within 20s")
	}
	converges := func(what string, within time.Duration) {
		t.Helper()
		var diff string
		apitest.Eventually(t, within, "the informer's view is a strong list "+what, func() bool {
			want, err := strong.ListNodes(ctx, client.NodeFilter{}, client.NoCache())
			if err != nil {
				diff = err.Error()
				return false
			}
			view, _ := in.Nodes()
			diff = cmp.Diff(want, view)
			return diff == ""
		})
		if diff != "" {
			t.Fatalf("%s (-strong list +view):\n%s", what, diff)
		}
	}

	for v := range int64(5) {
		setCPUMem(t, a, admin, kept, 1000+v)
	}
	converges("before b restarts", 10*time.Second)

	// b stops; writes go on; b comes back on the same address, and the
	// informer resumes from its position.
	if err := pb.stop(t); err != nil {
		t.Fatalf("stopping b: %v", err)
	}
	for v := range int64(3) {
		setCPUMem(t, a, admin, kept, 1100+v)
	}
	gone := createNode(t, a, admin, "10.22.5.4", 0)
	if code, body := call(t, "DELETE", fmt.Sprintf("%s/v1/nodes/%d", a, gone), "", admin); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	createNode(t, a, admin, "10.22.5.5", 0)
	restarted := maps.Clone(env)
	restarted["REGISTRY_LISTEN"] = strings.TrimPrefix(b, "http://")
	if got := startProcess(t, restarted, "serve").serving(t); got != b {
		t.Fatalf("b restarted at %s, not %s", got, b)
	}
	converges("after b restarts", 20*time.Second)
	awaitReplayed(t, primary.URL())
	standby.Stop("fast")

	// Writes the standby never gets, which the informer sees.
	setCPUMem(t, a, admin, kept, 9000)
	lost := createNode(t, a, admin, "10.22.5.2", 0)
	apitest.Eventually(t, 10*time.Second, "the informer sees the writes the standby misses", func() bool {
		n, ok := in.Get(lost)
		k, _ := in.Get(kept)
		return ok && n.PK == lost && k.CPUMem == 9000
	})
	listsBefore := lists.Load()
	primary.Stop("immediate")
	standby.Start()
	standby.Promote()

	converges("after the failover", 60*time.Second)
	if _, ok := in.Get(lost); ok {
		t.Fatalf("the view keeps node %d, which the new primary lost", lost)
	}
	if lists.Load() == listsBefore {
		t.Errorf("the informer converged without listing again (%d lists)", listsBefore)
	}
	for i := range 5 {
		pk := createNode(t, a, admin, "10.22.5.3", i)
		setCPUMem(t, a, admin, pk, int64(2000+i))
	}
	setCPUMem(t, a, admin, kept, 5000)
	converges("with writes after the failover", 10*time.Second)
}
