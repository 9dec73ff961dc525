package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The abandon workload: abandonHonest schedulers claim one node and
// release it, first alone, then while abandonClients others claim and
// give up on each claim after 1 to 3 ms (their connection closed), then
// release the job they gave up on. The Result is the honest schedulers'
// second phase; AbandonStats compares it with the first.
const (
	abandonHonest  = 16
	abandonClients = 8
)

// AbandonStats is the abandon workload's own figures.
type AbandonStats struct {
	// UndisturbedRate is the honest schedulers' rate (claim + release a
	// second) alone; Rate theirs beside the abandoning clients; Ratio
	// Rate / UndisturbedRate.
	UndisturbedRate float64 `json:"undisturbed_rate"`
	Rate            float64 `json:"rate"`
	Ratio           float64 `json:"ratio"`
	// Abandoned counts the claims given up on before their answer, of
	// Sent; HeldAfter the nodes the abandoning clients' jobs still held
	// after the run (every one of them was released).
	Sent      int64 `json:"sent"`
	Abandoned int64 `json:"abandoned"`
	HeldAfter int64 `json:"held_after"`
}

// runAbandon runs both phases and fills res.Abandon; the Load returned is
// the disturbed phase's.
func runAbandon(ctx context.Context, t *target, pool *pgxpool.Pool, d time.Duration, res *Result) Load {
	honest := func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
		return t.claimRelease(ctx, c, 1, false)
	}
	alone := generate(ctx, abandonHonest, warmup(d), d, honest)

	// The abandoning clients' jobs: (first, first+1,000,000), a range the
	// honest schedulers' jobs (t.jobs) go on after.
	first := t.jobs.Add(1_000_000) - 1_000_000
	var next, sent, abandoned atomic.Int64
	next.Store(first)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range abandonClients {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				default:
				}
				job := next.Add(1)
				if job >= first+1_000_000 {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, time.Millisecond+rand.N(2*time.Millisecond))
				_, err := call(cctx, c, "POST", t.url+"/v1/nodes/claim", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d,"count":1}`, job))
				cancel()
				sent.Add(1)
				if err != nil && cctx.Err() != nil {
					abandoned.Add(1)
				}
				rctx, cancel := context.WithTimeout(ctx, requestTimeout)
				_, _ = call(rctx, c, "POST", t.url+"/v1/nodes/release", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d}`, job))
				cancel()
			}
		})
	}
	disturbed := generate(ctx, abandonHonest, warmup(d), d, honest)
	close(stop)
	wg.Wait()
	st := &AbandonStats{UndisturbedRate: alone.Rate, Rate: disturbed.Rate, Sent: sent.Load(), Abandoned: abandoned.Load()}
	if alone.Rate > 0 {
		st.Ratio = disturbed.Rate / alone.Rate
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE current_job BETWEEN $1 AND $2`, first, next.Load()).Scan(&st.HeldAfter); err != nil {
		disturbed.ErrorKinds["count of held nodes failed"]++
		disturbed.ErrorSamples["count of held nodes failed"] = err.Error()
		disturbed.Errors++
	}
	if st.HeldAfter > 0 {
		k := "nodes held by released jobs"
		disturbed.ErrorKinds[k] += st.HeldAfter
		disturbed.ErrorSamples[k] = fmt.Sprintf("%d nodes of abandoned claims still held after their release", st.HeldAfter)
		disturbed.Errors += st.HeldAfter
	}
	res.Abandon = st
	return disturbed
}
