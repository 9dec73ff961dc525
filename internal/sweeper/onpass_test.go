package sweeper_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/sweeper"
)

// Every pass reaches OnPass (serve's metrics) with its duration and what
// it changed: here, a node silent for an hour is lost in one of them.
func TestOnPassReportsTransitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n, _, err := st.CreateNode(ctx, registry.Actor{Principal: registry.Principal{Sub: "t", Role: registry.RoleAdmin}},
		registry.NodeSpec{IP: "10.2.0.9", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, now() - interval '1 hour')`, n.PK); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var passes int
	var lost []int64
	s, err := sweeper.New(sweeper.Config{Locker: locker(st), TTL: time.Minute, Interval: 20 * time.Millisecond,
		OnPass: func(d time.Duration, done registry.Sweep, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil && d > 0 {
				passes++
				lost = append(lost, done.Lost...)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lifecycle.Go(ctx, s.Run))
	apitest.Eventually(t, 10*time.Second, "three passes, the node lost in one", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return passes >= 3 && slices.Equal(lost, []int64{n.PK})
	})
}
