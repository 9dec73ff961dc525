package store_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A lease is taken by one holder at a time; renewals keep it past its
// TTL; released, it is free at once, with a greater token for the next.
func TestLeaseTakeRenewRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, a := leading(t)
	t.Cleanup(func() { a.Release(ctx) })
	if _, ok, err := st.TryLead(ctx, "work", "b", time.Second); err != nil || ok {
		t.Fatalf("TryLead on a held lease: %v %v; want not ok", ok, err)
	}
	other, ok, err := st.TryLead(ctx, "other", "b", time.Second)
	if err != nil || !ok {
		t.Fatalf("TryLead on another name: %v %v", ok, err)
	}
	other.Release(ctx)
	// Renewed in the background, the lease outlives three TTLs.
	time.Sleep(3 * time.Second)
	if _, ok, err := st.TryLead(ctx, "work", "b", time.Second); err != nil || ok {
		t.Fatalf("TryLead 3 TTLs later while a renews: %v %v; want not ok", ok, err)
	}
	select {
	case <-a.Done():
		t.Fatal("a's lease ended while it renewed")
	default:
	}
	if err := a.Store().WithTx(ctx, func(*store.Store) error { return nil }); err != nil {
		t.Fatalf("a transaction of the leader: %v", err)
	}
	a.Release(ctx)
	b, ok, err := st.TryLead(ctx, "work", "b", time.Second)
	if err != nil || !ok {
		t.Fatalf("TryLead after the release: %v %v", ok, err)
	}
	defer b.Release(ctx)
	if b.Token() <= a.Token() {
		t.Errorf("token %d after %d; want it to grow", b.Token(), a.Token())
	}
	if a.Lost() {
		t.Error("a released lease reads as lost")
	}
}

// A leader that stops renewing (frozen) loses its lease once the TTL has
// passed: another holder takes it over, and the frozen leader's
// transactions then fail with ErrLeaseLost, changing nothing, as do its
// renewals.
func TestLeaseExpiresAndFences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, a := leading(t)
	store.FreezeLease(a) // renewals stop, as in a frozen process
	// Not yet expired: still a's.
	if _, ok, err := st.TryLead(ctx, "work", "b", time.Second); err != nil || ok {
		t.Fatalf("TryLead within a's TTL: %v %v; want not ok", ok, err)
	}
	// a's transaction begun while it led, and still open as its lease
	// runs out, must not commit.
	ip := 0
	write := func(tx *store.Store) error {
		ip++
		_, _, err := tx.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.0.0." + strconv.Itoa(ip), CPUMem: 1, DriverVersion: "d"})
		return err
	}
	err := a.Store().WithTx(ctx, func(tx *store.Store) error {
		if err := write(tx); err != nil {
			return err
		}
		time.Sleep(1200 * time.Millisecond)
		return nil
	})
	if !errors.Is(err, registry.ErrLeaseLost) {
		t.Fatalf("a transaction that outlived the lease: %v; want ErrLeaseLost", err)
	}
	var written int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM nodes`).Scan(&written); err != nil || written != 0 {
		t.Fatalf("the fenced transaction's write: %d rows, %v; want none", written, err)
	}
	// Expired: b takes over.
	deadline := time.Now().Add(5 * time.Second)
	var b *store.Lease
	for b == nil {
		if b, _, err = st.TryLead(ctx, "work", "b", time.Second); err != nil {
			t.Fatal(err)
		}
		if b == nil && time.Now().After(deadline) {
			t.Fatal("b could not take a lease a stopped renewing 5 s before")
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer b.Release(ctx)
	// Even quickly, inside its TTL again, a's writes and renewals are refused.
	if err := a.Store().WithTx(ctx, write); !errors.Is(err, registry.ErrLeaseLost) {
		t.Fatalf("a's transaction after b took over: %v; want ErrLeaseLost", err)
	}
	if err := a.Renew(ctx); !errors.Is(err, registry.ErrLeaseLost) {
		t.Fatalf("a's renewal after b took over: %v; want ErrLeaseLost", err)
	}
	if err := b.Store().WithTx(ctx, write); err != nil {
		t.Fatalf("b's transaction: %v", err)
	}
	// a's release leaves b's lease alone.
	a.Release(ctx)
	if _, ok, err := st.TryLead(ctx, "work", "c", time.Second); err != nil || ok {
		t.Fatalf("TryLead after the old leader's release: %v %v; want b's lease held", ok, err)
	}
}

// A leader whose renewals find the lease gone is told through Done.
func TestLeaseLostIsTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, a := leading(t)
	defer a.Release(ctx)
	// An operator (or a takeover) moves the lease on.
	if _, err := st.Pool().Exec(ctx, `UPDATE leader_leases SET token = token + 1`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a lease taken away was not told lost within 5 s")
	}
	if !a.Lost() {
		t.Error("Lost is false after Done closed on a lease taken away")
	}
}

// leading opens a store on a fresh database and takes the lease "work"
// through it for holder a, with a TTL of 1s.
func leading(t *testing.T) (*store.Store, *store.Lease) {
	t.Helper()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	a, ok, err := st.TryLead(context.Background(), "work", "a", time.Second)
	if err != nil || !ok {
		t.Fatalf("TryLead on a free lease: %v %v", ok, err)
	}
	return st, a
}
