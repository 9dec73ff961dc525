package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The replica workload: a second `registryd serve` (replica B) on the same
// database as the first (A). replicaWriters change nodes on A without
// pause (PATCH of driver_version, each answer's version remembered) while
// the clients read those nodes on B: first as plain reads, which must
// reflect every write acknowledged before they were sent, then with
// Cache-Control: max-stale, which may lag. A read that returns a version
// older than one acknowledged before it was sent is stale; the two phases'
// latencies differ by what a consistent read adds.
const (
	replicaWriters = 4
	// replicaNodes is how many nodes the writers change (the first ones
	// of the fleet): reads aim at them, so most reads follow a write.
	replicaNodes = 1024
)

// ReplicaStats is the replica workload's own figures: the writes on A and,
// for each kind of read on B, how many saw the past. The Result's rate and
// latencies are the consistent reads'.
type ReplicaStats struct {
	Writes          int64   `json:"writes"`
	WriteRate       float64 `json:"write_rate"`
	WriteErrors     int64   `json:"write_errors"`
	StaleConsistent int64   `json:"stale_consistent"`
	// MaxStale is the phase with Cache-Control: max-stale.
	MaxStaleRate  float64 `json:"max_stale_rate"`
	MaxStaleP50MS float64 `json:"max_stale_p50_ms"`
	MaxStaleP99MS float64 `json:"max_stale_p99_ms"`
	MaxStaleStale int64   `json:"max_stale_stale"`
	// AddedP50MS and AddedP99MS: consistent minus max-stale latency.
	AddedP50MS float64 `json:"added_p50_ms"`
	AddedP99MS float64 `json:"added_p99_ms"`
}

// acked holds, per node the writers change, the highest version a write
// on A was acknowledged with.
type acked struct {
	pks  []int64
	vers []atomic.Int64
}

func newAcked(f *fleet) *acked {
	n := min(replicaNodes, f.nodes)
	a := &acked{pks: make([]int64, n), vers: make([]atomic.Int64, n)}
	for i := range a.pks {
		a.pks[i] = f.minPK + int64(i)
	}
	return a
}

// note records an acknowledged version of node i.
func (a *acked) note(i int, v int64) {
	for {
		cur := a.vers[i].Load()
		if v <= cur || a.vers[i].CompareAndSwap(cur, v) {
			return
		}
	}
}

// versionOf reads the version from an answer's ETag ("N").
func versionOf(resp *http.Response) (int64, error) {
	tag := strings.Trim(resp.Header.Get("ETag"), `"`)
	v, err := strconv.ParseInt(tag, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %s: no version in ETag %q", resp.Request.Method, resp.Request.URL.Path, resp.Header.Get("ETag"))
	}
	return v, nil
}

// writeLoop changes nodes on url until ctx ends or stop closes, counting
// writes and failures.
func (a *acked) writeLoop(ctx context.Context, stop <-chan struct{}, url, token string, seed uint64, writes, failures *atomic.Int64) {
	tr := &connTransport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		default:
		}
		i := rng.IntN(len(a.pks))
		body := fmt.Appendf(nil, `{"driver_version":"550.%d.%d"}`, seed, n)
		resp, err := send(ctx, c, "PATCH", url+"/v1/nodes/"+strconv.FormatInt(a.pks[i], 10), token, body, "Content-Type", "application/merge-patch+json")
		if err != nil {
			failures.Add(1)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		v, err := versionOf(resp)
		if err != nil {
			failures.Add(1)
			continue
		}
		a.note(i, v)
		writes.Add(1)
	}
}

// readOp reads a node the writers change on url (replica B), with
// Cache-Control cc when not empty, and counts the answer as stale when its
// version is below one acknowledged before the read was sent.
func (a *acked) readOp(url, token, cc string, stale *atomic.Int64) op {
	return func(ctx context.Context, c *http.Client, rng *rand.Rand) error {
		i := rng.IntN(len(a.pks))
		before := a.vers[i].Load()
		var headers []string
		if cc != "" {
			headers = []string{"Cache-Control", cc}
		}
		resp, err := send(ctx, c, "GET", url+"/v1/nodes/"+strconv.FormatInt(a.pks[i], 10), token, nil, headers...)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		v, err := versionOf(resp)
		if err != nil {
			return err
		}
		if v < before {
			stale.Add(1)
		}
		return nil
	}
}

// runReplica runs the two phases on replica b while the writers change
// nodes on a, and fills res (the consistent phase) and res.Replica.
func runReplica(ctx context.Context, t *target, b string, clients int, d time.Duration, res *Result) Load {
	f := t.fleet
	a := newAcked(f)
	stop := make(chan struct{})
	var writes, failures atomic.Int64
	var wg sync.WaitGroup
	for w := range replicaWriters {
		wg.Go(func() { a.writeLoop(ctx, stop, t.url, f.admin, uint64(w), &writes, &failures) })
	}
	t0 := time.Now()
	var staleC, staleM atomic.Int64
	consistent := generate(ctx, clients, warmup(d), d, a.readOp(b, f.scheduler, "", &staleC))
	maxStale := generate(ctx, clients, warmup(d), d, a.readOp(b, f.scheduler, "max-stale", &staleM))
	close(stop)
	wg.Wait()
	elapsed := time.Since(t0)
	rs := &ReplicaStats{
		Writes: writes.Load(), WriteErrors: failures.Load(), StaleConsistent: staleC.Load(),
		MaxStaleRate: maxStale.Rate, MaxStaleP50MS: ms(maxStale.P50), MaxStaleP99MS: ms(maxStale.P99), MaxStaleStale: staleM.Load(),
		AddedP50MS: ms(consistent.P50 - maxStale.P50), AddedP99MS: ms(consistent.P99 - maxStale.P99),
	}
	if elapsed > 0 {
		rs.WriteRate = float64(rs.Writes) / elapsed.Seconds()
	}
	res.Replica = rs
	// Failed writes and stale consistent reads are errors of the run:
	// reported, never averaged away.
	for k, n := range map[string]int64{"write on A failed": rs.WriteErrors, "stale consistent read on B": rs.StaleConsistent} {
		if n == 0 {
			continue
		}
		consistent.ErrorKinds[k] += n
		consistent.ErrorSamples[k] = fmt.Sprintf("%d of the workload's operations", n)
		consistent.Errors += n
	}
	for k, n := range maxStale.ErrorKinds {
		consistent.ErrorKinds["max-stale: "+k] += n
		consistent.ErrorSamples["max-stale: "+k] = maxStale.ErrorSamples[k]
		consistent.Errors += n
	}
	return consistent
}
