package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FillStats is the fill workload's account: fabric gangs claimed and kept
// until none fits, then all released.
type FillStats struct {
	// Capacity is how many gangs fitted before, by the database's count
	// (fillCapacitySQL); Placed how many the schedulers got; Left how many
	// still fitted once every scheduler had been refused (0 unless a
	// claim was refused while one fitted).
	Capacity int64 `json:"capacity"`
	Placed   int64 `json:"placed"`
	Left     int64 `json:"left"`
	// Refused counts the 409 no_fabric_fit answers (one per scheduler at
	// the end, more when the last gangs were raced for).
	Refused int64 `json:"refused"`
	// Quarters are the claims' times by how full the fleet was when each
	// was sent: the first quarter of the capacity, the second, …
	Quarters []FillQuarter `json:"quarters"`
	// The releases of every gang afterwards, by the same schedulers.
	ReleaseRate  float64 `json:"release_rate"`
	ReleaseP50MS float64 `json:"release_p50_ms"`
	ReleaseP99MS float64 `json:"release_p99_ms"`
}

// FillQuarter is the claims sent while the fleet was in one quarter of
// its capacity.
type FillQuarter struct {
	Claims int     `json:"claims"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
}

// fillCapacitySQL counts the fabric gangs (fabricHosts hosts with gangSize
// free nodes each, in one fabric) the fleet can still give.
var fillCapacitySQL = fmt.Sprintf(`
	SELECT coalesce(sum(hosts / %d), 0) FROM (
		SELECT fabric, count(*) AS hosts FROM (
			SELECT ip, fabric FROM nodes WHERE fabric IS NOT NULL GROUP BY ip, fabric
			HAVING count(*) FILTER (WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL) >= %d
		) h GROUP BY fabric
	) f`, fabricHosts, gangSize)

// runFill has gangClients schedulers claim fabric gangs and keep them
// until each is refused with no_fabric_fit, checks that they got every
// gang the fleet had (none split, none given twice), then releases them
// all. The Load is the claims'.
func runFill(ctx context.Context, t *target, pool *pgxpool.Pool, res *Result) Load {
	l := Load{ErrorKinds: map[string]int64{}, ErrorSamples: map[string]string{}}
	var mu sync.Mutex
	fail := func(kind string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if l.ErrorKinds[kind] == 0 {
			l.ErrorSamples[kind] = err.Error()
		}
		l.ErrorKinds[kind]++
		l.Errors++
	}
	st := &FillStats{Quarters: make([]FillQuarter, 4)}
	res.Fill = st
	if err := pool.QueryRow(ctx, fillCapacitySQL).Scan(&st.Capacity); err != nil {
		fail("capacity", err)
		return l
	}
	if st.Capacity == 0 {
		fail("capacity", errors.New("the fleet has no fabric gang to give"))
		return l
	}

	var placed, refused atomic.Int64
	var jobs []int64
	var claimTimes []time.Duration
	quarters := make([][]time.Duration, 4)
	l.Elapsed = schedulers(func(c *http.Client) {
		for ctx.Err() == nil {
			job := t.jobs.Add(1)
			q := min(3, int(placed.Load()*4/st.Capacity))
			body := fmt.Appendf(nil, `{"job":%d,"count":%d,"per_host":%d,"same_fabric":true}`, job, fabricHosts*gangSize, gangSize)
			t0 := time.Now()
			b, err := call(ctx, c, "POST", t.url+"/v1/nodes/claim", t.fleet.scheduler, body)
			took := time.Since(t0)
			if se, ok := errors.AsType[*statusError](err); ok && se.code == http.StatusConflict && strings.Contains(se.body, "no_fabric_fit") {
				refused.Add(1)
				return
			}
			if err != nil {
				fail(errorKind(err), err)
				return
			}
			var got struct {
				Nodes []claimedNode `json:"nodes"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				fail("bad claim answer", err)
				return
			}
			pks := pksOf(got.Nodes)
			mu.Lock()
			jobs = append(jobs, job) // released later, whatever the checks say
			mu.Unlock()
			if err := t.holds.take(job, pks); err != nil {
				fail("double assignment", err)
				return
			}
			if err := errors.Join(checkClaim(job, fabricHosts*gangSize, false, got.Nodes),
				checkWholeHosts(job, gangSize, true, got.Nodes)); err != nil {
				fail("bad gang", err)
				return
			}
			placed.Add(1)
			mu.Lock()
			claimTimes = append(claimTimes, took)
			quarters[q] = append(quarters[q], took)
			mu.Unlock()
		}
	})
	st.Placed, st.Refused = placed.Load(), refused.Load()
	l.Ops = st.Placed
	l.Rate = float64(l.Ops) / l.Elapsed.Seconds()
	if len(claimTimes) > 0 {
		slices.Sort(claimTimes)
		l.P50, l.P99, l.Max = percentile(claimTimes, 0.50), percentile(claimTimes, 0.99), claimTimes[len(claimTimes)-1]
	}
	for i, ts := range quarters {
		st.Quarters[i].Claims = len(ts)
		if len(ts) > 0 {
			slices.Sort(ts)
			st.Quarters[i].P50MS, st.Quarters[i].P99MS = ms(percentile(ts, 0.50)), ms(percentile(ts, 0.99))
		}
	}
	if ctx.Err() == nil {
		if err := pool.QueryRow(ctx, fillCapacitySQL).Scan(&st.Left); err != nil {
			fail("capacity", err)
		} else if st.Left > 0 || st.Placed != st.Capacity {
			fail("gangs left", fmt.Errorf("%d of %d gangs placed; %d still fit after every scheduler was refused", st.Placed, st.Capacity, st.Left))
		}
	}
	releaseAll(ctx, t, jobs, fabricHosts*gangSize, false, st, fail)
	return l
}

// releaseAll releases jobs, each holding size nodes (or, with orNone, size
// or none: a claim whose answer was lost may have taken nothing), with
// gangClients schedulers, timing each release into st.
func releaseAll(ctx context.Context, t *target, jobs []int64, size int, orNone bool, st *FillStats, fail func(string, error)) {
	next := make(chan int64)
	var mu sync.Mutex
	var times []time.Duration
	done := make(chan time.Duration)
	go func() {
		done <- schedulers(func(c *http.Client) {
			for job := range next {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
				t0 := time.Now()
				b, err := call(rctx, c, "POST", t.url+"/v1/nodes/release", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d}`, job))
				took := time.Since(t0)
				cancel()
				if err != nil {
					fail(errorKind(err), err)
					continue
				}
				var rel struct {
					Released []claimedNode `json:"released"`
				}
				if err := json.Unmarshal(b, &rel); err != nil || len(rel.Released) != size && !(orNone && len(rel.Released) == 0) {
					fail("bad release", fmt.Errorf("job %d: released %d nodes (%v)", job, len(rel.Released), err))
				}
				pks := make([]int64, len(rel.Released))
				for i, n := range rel.Released {
					pks[i] = n.PK
				}
				t.holds.drop(pks)
				mu.Lock()
				times = append(times, took)
				mu.Unlock()
			}
		})
	}()
	for _, job := range jobs {
		next <- job
	}
	close(next)
	if elapsed := <-done; len(times) > 0 && elapsed > 0 {
		slices.Sort(times)
		st.ReleaseRate = float64(len(times)) / elapsed.Seconds()
		st.ReleaseP50MS, st.ReleaseP99MS = ms(percentile(times, 0.50)), ms(percentile(times, 0.99))
	}
}

// schedulers runs fn in gangClients goroutines, each with a client of its
// own (its own keep-alive connection), and returns how long they took.
func schedulers(fn func(c *http.Client)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for range gangClients {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			fn(c)
		})
	}
	wg.Wait()
	return time.Since(start)
}
