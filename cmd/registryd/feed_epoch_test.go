package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// replicas starts n `registryd serve` processes on the database at dbURL,
// each with its node cache, and returns their URLs and an admin token.
func replicas(t *testing.T, dbURL string, n int) ([]string, string) {
	t.Helper()
	env := map[string]string{"REGISTRY_DATABASE_URL": dbURL, "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_NODE_CACHE": "1000"}
	procs := make([]*process, n)
	for i := range procs {
		procs[i] = startProcess(t, env, "serve")
	}
	urls := make([]string, n)
	for i, p := range procs {
		urls[i] = p.serving(t)
	}
	return urls, adminToken(t, env)
}

// cpuMem is node pk's cpu_mem as a GET on base answers it; -1 for 404.
func cpuMem(t *testing.T, base, token string, pk int64) int64 {
	t.Helper()
	code, body := call(t, "GET", fmt.Sprintf("%s/v1/nodes/%d", base, pk), "", token)
	if code == 404 {
		return -1
	}
	var n struct {
		CPUMem int64 `json:"cpu_mem"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &n) != nil {
		t.Fatalf("get node %d: %d %s", pk, code, body)
	}
	return n.CPUMem
}

func setCPUMem(t *testing.T, base, token string, pk, v int64) {
	t.Helper()
	if code, body := call(t, "PATCH", fmt.Sprintf("%s/v1/nodes/%d", base, pk), fmt.Sprintf(`{"cpu_mem":%d}`, v), token); code != 200 {
		t.Fatalf("patch node %d: %d %s", pk, code, body)
	}
}

// staleBound is how long a write on one replica may take to show on
// another (the node cache's documented bound, 2 s, and some slack).
const staleBound = 3 * time.Second

// writesShow checks that writes on a show in reads on b within staleBound,
// one after another.
func writesShow(t *testing.T, a, b, token string, pk, from int64, n int) {
	t.Helper()
	for v := from; v < from+int64(n); v++ {
		setCPUMem(t, a, token, pk, v)
		apitest.Eventually(t, staleBound, fmt.Sprintf("cpu_mem %d written on one replica read on the other", v), func() bool {
			return cpuMem(t, b, token, pk) == v
		})
	}
}

// Two `registryd serve` replicas on one database; the event sequence is
// set back below ids already sent (as a restore or a careless setval
// would). Every open watch on either replica gets a reset within seconds,
// a resume from an old id gets a reset, and writes on one replica keep
// showing on the other within the cache's bound (before epochs, the other
// replica's feed stopped at the old ids and its cache served the past for
// as long as the sequence took to pass them). Faults caught (each tried
// once): the sequencer without the sequence check (no reset within 10 s).
func TestServeFeedEpochAfterSetval(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	urls, admin := replicas(t, db, 2)
	a, b := urls[0], urls[1]
	pk := createNode(t, a, admin, "10.22.3.1", 0)
	wa, wb := openWatch(t, a, admin, 0), openWatch(t, b, admin, 0)
	writesShow(t, a, b, admin, pk, 1000, 5)
	last, _ := wb.await(t, 10*time.Second, "updated", pk)
	for range 4 {
		last, _ = wb.await(t, 10*time.Second, "updated", pk)
	}
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `SELECT setval('node_event_seq', 1)`); err != nil {
		t.Fatal(err)
	}
	setCPUMem(t, a, admin, pk, 2000)
	for _, w := range []*sse{wa, wb} {
		if e, _ := w.await(t, 10*time.Second, "reset", 0); e.id <= last.id {
			t.Errorf("reset to %d, not above the last event %d", e.id, last.id)
		}
	}
	writesShow(t, a, b, admin, pk, 3000, 10)
	r := openWatch(t, b, admin, last.id)
	r.await(t, 10*time.Second, "reset", 0)
}

// A lossy failover: a primary with an asynchronous standby, two `registryd
// serve` replicas on a URL naming both (they follow whichever takes
// writes). The standby stops (lagging for good), the primary takes more
// writes that watchers and caches see, then dies; the standby is promoted
// without them. Every open watch gets a reset within seconds of the
// replicas finding the new primary, and no read shows a write the new
// primary does not have, nor misses a write made after. Fault caught
// (tried once): the sequencer without the timeline check and without the
// check of the ids the replicas have seen (no reset within 60 s: the new
// primary hands out the lost ids again). Either check alone suffices here.
func TestServeFeedEpochAfterLossyFailover(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewPair(t, false)
	urls, admin := replicas(t, pgtest.MultiHostURL(primary, standby), 2)
	a, b := urls[0], urls[1]
	kept := createNode(t, a, admin, "10.22.4.1", 0)
	writesShow(t, a, b, admin, kept, 1000, 3)
	awaitReplayed(t, primary.URL())
	standby.Stop("fast")

	// Writes the standby never gets: seen by watchers and caches.
	wa, wb := openWatch(t, a, admin, 0), openWatch(t, b, admin, 0)
	writesShow(t, a, b, admin, kept, 9000, 3)
	lost := createNode(t, a, admin, "10.22.4.2", 0)
	apitest.Eventually(t, staleBound, "the lost node read on the other replica", func() bool {
		return cpuMem(t, b, admin, lost) == 1024
	})
	e, _ := wb.await(t, 10*time.Second, "created", lost)
	primary.Stop("immediate")
	standby.Start()
	standby.Promote()

	for _, w := range []*sse{wa, wb} {
		if r, _ := w.await(t, 60*time.Second, "reset", 0); r.id <= e.id {
			t.Errorf("reset to %d, not above the last event %d", r.id, e.id)
		}
	}
	// After its reset, b reads what the new primary has: not the lost
	// writes.
	for range 20 {
		if v := cpuMem(t, b, admin, kept); v != 1002 {
			t.Fatalf("after the reset, node %d reads cpu_mem %d; the new primary has 1002", kept, v)
		}
		if v := cpuMem(t, b, admin, lost); v != -1 {
			t.Fatalf("after the reset, the lost node %d reads %d, want 404", lost, v)
		}
	}
	writesShow(t, a, b, admin, kept, 5000, 5)
	r := openWatch(t, b, admin, e.id)
	if ev, _ := r.await(t, 10*time.Second, "reset", 0); ev.id <= e.id {
		t.Errorf("a resume from the lost id %d: reset to %d", e.id, ev.id)
	}
}

// awaitReplayed waits until every standby of the primary at url has
// replayed all the primary wrote.
func awaitReplayed(t *testing.T, url string) {
	t.Helper()
	apitest.Eventually(t, 30*time.Second, "the standby replays everything", func() bool {
		var ok bool
		err := queryOne(context.Background(), url, `SELECT coalesce(bool_and(replay_lsn >= pg_current_wal_lsn()), false) FROM pg_stat_replication`, &ok)
		return err == nil && ok
	})
}

// queryOne reads one value over a connection of its own.
func queryOne(ctx context.Context, url, sql string, dst any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst)
}
