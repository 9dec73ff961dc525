package client_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/registry"
)

// Cordon, drain, leased claims and renewals through the client, with a
// watch on the cordoned and draining states.
func TestLifecycleFlow(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	sched := s.client(s.token("sched-1", registry.RoleScheduler))
	pks := createHost(t, admin, 3)

	events := make(chan client.Event, 10)
	watchCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.watcher(s.token("root", registry.RoleAdmin), nil).Watch(watchCtx,
			client.WatchOptions{State: []client.NodeState{client.StateCordoned, client.StateDraining}},
			func(ev client.Event) error {
				if ev.Bookmark == nil { // bookmarks say where the stream stands, no change
					events <- ev
				}
				return nil
			})
	}()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the watch did not stop within 10s")
		}
	}()
	// The filter is accepted: HEAD checks it as GET does.
	if err := admin.HeadWatch(ctx, client.WatchOptions{State: []client.NodeState{client.StateDraining}}); err != nil {
		t.Fatal(err)
	}

	claim, err := sched.ClaimNodes(ctx, client.NodeClaim{Job: 9, LeaseSeconds: client.Ptr(int64(600))})
	if err != nil {
		t.Fatal(err)
	}
	if n := claim.Nodes[0]; n.LeaseExpiresAt == nil || time.Until(*n.LeaseExpiresAt) < 590*time.Second || n.State != client.StateBusy {
		t.Fatalf("leased claim: %+v", n)
	}
	renewed, err := sched.RenewLeases(ctx, client.NodeRenew{Job: 9, LeaseSeconds: 3600})
	if err != nil || len(renewed.Nodes) != 1 || time.Until(*renewed.Nodes[0].LeaseExpiresAt) < 3590*time.Second {
		t.Fatalf("renew: %+v, %v", renewed, err)
	}
	_, err = sched.RenewLeases(ctx, client.NodeRenew{Job: 10, LeaseSeconds: 60})
	if asError(t, err, http.StatusNotFound); !errors.Is(err, client.ErrNotFound) {
		t.Error(err)
	}

	// The scheduler may not cordon; the admin cordons the whole host.
	_, err = sched.CordonNodes(ctx, client.NodeCordon{Nodes: &pks, Reason: "mine"})
	asError(t, err, http.StatusForbidden)
	c, err := admin.CordonNodes(ctx, client.NodeCordon{IP: client.Ptr("10.0.0.1"), Reason: "kernel upgrade"})
	if err != nil || len(c.Cordoned) != 3 || len(c.NotCordoned) != 0 {
		t.Fatalf("cordon: %+v, %v", c, err)
	}
	var got []client.NodeState
	for range 3 {
		select {
		case ev := <-events:
			if ev.Node == nil || ev.Node.Kind != client.EventCordoned {
				t.Fatalf("event %+v", ev)
			}
			got = append(got, ev.Node.Node.State)
		case <-time.After(10 * time.Second):
			t.Fatal("no cordoned event within 10s")
		}
	}
	if !slices.Equal(got, []client.NodeState{client.StateDraining, client.StateCordoned, client.StateCordoned}) {
		t.Errorf("cordoned events: %v", got)
	}
	listed, err := sched.ListNodes(ctx, client.NodeFilter{State: client.States(client.StateDraining)})
	if err != nil || len(listed) != 1 || listed[0].PK != claim.Nodes[0].PK || *listed[0].CordonReason != "kernel upgrade" {
		t.Fatalf("draining: %+v, %v", listed, err)
	}
	_, err = sched.ClaimNodes(ctx, client.NodeClaim{Job: 11})
	asError(t, err, http.StatusConflict)

	u, err := admin.UncordonNodes(ctx, client.NodeUncordon{Nodes: append(slices.Clone(pks), 987654)})
	if err != nil || len(u.Uncordoned) != 3 || len(u.NotUncordoned) != 1 || u.NotUncordoned[0].Reason != "no such node" {
		t.Fatalf("uncordon: %+v, %v", u, err)
	}
	audit, err := admin.ListAudit(ctx, client.AuditFilter{Action: client.Ptr(client.ActionNodeUncordon)})
	if err != nil || len(audit) != 3 {
		t.Errorf("uncordon audit: %d entries, %v", len(audit), err)
	}
}

// An informer on a real server applies a renewal (one renewed event) so
// that its view of the job's nodes is what a list answers after it.
func TestInformerFollowsRenewals(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := t.Context()
	admin := s.client(s.token("root", registry.RoleAdmin))
	sched := s.client(s.token("sched-1", registry.RoleScheduler))
	createHost(t, admin, 3)
	var mu sync.Mutex
	var kinds []string
	in := client.NewInformer(s.watcher(s.token("reader", registry.RoleReader), nil), client.InformerOptions{Handler: func(u client.InformerUpdate) {
		if u.Event != nil {
			mu.Lock()
			kinds = append(kinds, u.Event.Type)
			mu.Unlock()
		}
	}})
	runInformer(t, in)
	if _, err := sched.ClaimNodes(ctx, client.NodeClaim{Job: 4, Count: client.Ptr(2), LeaseSeconds: client.Ptr(int64(60))}); err != nil {
		t.Fatal(err)
	}
	if _, err := sched.RenewLeases(ctx, client.NodeRenew{Job: 4, LeaseSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	want, err := admin.ListNodes(ctx, client.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		view, _ := in.Nodes()
		diff := gocmp.Diff(want, view)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the informer's view is not the list's within 10s (-list +view):\n%s", diff)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(kinds, []string{string(client.EventClaimed), string(client.EventClaimed), client.EventRenewed}) {
		t.Errorf("events applied: %v; want two claims and one renewal", kinds)
	}
}

// createHost registers gpus nodes of host 10.0.0.1 and answers their pks.
func createHost(t *testing.T, admin *client.Client, gpus int32) []int64 {
	t.Helper()
	var pks []int64
	for i := range gpus {
		n, _, err := admin.CreateNode(t.Context(), client.NodeCreate{IP: "10.0.0.1", Index: i, CPUMem: gib, DriverVersion: "550"})
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	return pks
}
