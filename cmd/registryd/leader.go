package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/registryd/registryd/internal/store"
)

// Leases of the background work one replica does at a time.
const (
	sweeperLease = "sweeper"
	syncLease    = "sync"
)

// defaultLeaderTTL is REGISTRY_LEADER_TTL's default, for configs built
// without loading (tests).
const defaultLeaderTTL = 5 * time.Second

// leaseRetry is how often a replica waiting for a lease (`sync --once`)
// tries to take it.
const leaseRetry = 250 * time.Millisecond

// leaseHolder names this process in the lease table, for people.
func leaseHolder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// takeLease takes the lease name through st, waiting at most wait for
// the holder to let go or lose it (0: not at all). ok is false when it is
// still held. While held, the work writes through the returned Store,
// whose transactions commit only while the lease is valid; release ends
// the lease.
func takeLease(ctx context.Context, st *store.Store, name string, ttl, wait time.Duration) (leader *store.Store, release func(), ok bool, err error) {
	deadline := time.Now().Add(wait)
	for {
		l, ok, err := st.TryLead(ctx, name, leaseHolder(), cmp.Or(ttl, defaultLeaderTTL))
		switch {
		case err != nil:
			return nil, nil, false, err
		case ok:
			return l.Store(), func() { l.Release(context.WithoutCancel(ctx)) }, true, nil
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return nil, nil, false, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, false, ctx.Err()
		case <-time.After(min(leaseRetry, remaining)):
		}
	}
}
