package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The renew workload: renewJobs jobs of renewJobNodes nodes each are
// claimed with a lease, then the clients renew random ones of them as
// fast as they can while an unfiltered watch counts what the stream
// sends. RenewStats says how many events a renewal cost.
const (
	renewJobs     = 32
	renewJobNodes = 8
	renewLease    = 600 // seconds
)

// RenewStats is the renew workload's count of watch events.
type RenewStats struct {
	// Renewals is every renewal answered 200, warm-up included, of Jobs
	// jobs holding NodesPerJob nodes each.
	Renewals    int64 `json:"renewals"`
	Jobs        int   `json:"jobs"`
	NodesPerJob int   `json:"nodes_per_job"`
	// Events is what the watch received from the first renewal to the
	// last (bookmarks aside): Renewed of kind renewed, listing
	// NodesListed nodes in all; Other of any other kind (OtherKinds:
	// how many of each), which the fleet's own life makes meanwhile (the
	// sweeper finds nodes lost whose agents the run does not run).
	Events      int64            `json:"events"`
	Renewed     int64            `json:"renewed"`
	NodesListed int64            `json:"nodes_listed"`
	Other       int64            `json:"other"`
	OtherKinds  map[string]int64 `json:"other_kinds,omitempty"`
	// Bytes is the size of the renewed events on the stream;
	// BytesPerRenewal and EventsPerRenewal (renewed events) are per
	// renewal answered.
	Bytes            int64   `json:"bytes"`
	BytesPerRenewal  float64 `json:"bytes_per_renewal"`
	EventsPerRenewal float64 `json:"events_per_renewal"`
}

// eventCounter reads a watch stream and counts its events.
type eventCounter struct {
	mu                                   sync.Mutex
	events, renewed, nodes, other, bytes int64
	otherKinds                           map[string]int64
	err                                  error
}

// read counts the events sc reads until the stream ends.
func (ec *eventCounter) read(sc *bufio.Scanner) {
	var typ string
	var size int64
	for sc.Scan() {
		line := sc.Bytes()
		size += int64(len(line)) + 1
		switch {
		case len(line) == 0:
			ec.mu.Lock()
			if typ != "" && typ != "bookmark" {
				ec.events++
				if typ == "renewed" {
					ec.renewed++
					ec.bytes += size
				} else {
					ec.other++
					ec.otherKinds[typ]++
				}
			}
			ec.mu.Unlock()
			typ, size = "", 0
		case bytes.HasPrefix(line, []byte("event: ")):
			typ = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")) && typ == "renewed":
			var d struct {
				Nodes []json.RawMessage `json:"nodes"`
			}
			err := json.Unmarshal(line[6:], &d)
			ec.mu.Lock()
			if err != nil {
				ec.err = fmt.Errorf("a renewed event is not its JSON: %v", err)
			}
			ec.nodes += int64(len(d.Nodes))
			ec.mu.Unlock()
		}
	}
}

// runRenew claims the jobs, renews them for d (after a warm-up) with
// clients, counts the watch's events and releases the jobs.
func runRenew(ctx context.Context, t *target, clients int, d time.Duration, res *Result) Load {
	fail := func(what string, err error) Load {
		return Load{Errors: 1, ErrorKinds: map[string]int64{what: 1}, ErrorSamples: map[string]string{what: err.Error()}}
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	jobs := make([]int64, renewJobs)
	for i := range jobs {
		jobs[i] = t.jobs.Add(1)
		body := fmt.Appendf(nil, `{"job":%d,"count":%d,"lease_seconds":%d}`, jobs[i], renewJobNodes, renewLease)
		if _, err := call(ctx, c, "POST", t.url+"/v1/nodes/claim", t.fleet.scheduler, body); err != nil {
			return fail("claim before renewing", err)
		}
	}
	defer func() {
		for _, job := range jobs {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
			_, _ = call(rctx, c, "POST", t.url+"/v1/nodes/release", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d}`, job))
			cancel()
		}
	}()

	// The watch opens after the claims: its opening bookmark is where
	// counting starts.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	resp, err := send(wctx, &http.Client{}, "GET", t.url+"/v1/nodes/watch", t.fleet.scheduler, nil)
	if err != nil {
		return fail("watch", err)
	}
	ec := &eventCounter{otherKinds: map[string]int64{}}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		ec.read(sc)
	}()

	var renewals atomic.Int64
	l := generate(ctx, clients, warmup(d), d, func(ctx context.Context, c *http.Client, rng *rand.Rand) error {
		job := jobs[rng.IntN(len(jobs))]
		b, err := call(ctx, c, "POST", t.url+"/v1/nodes/renew", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d,"lease_seconds":%d}`, job, renewLease))
		if err != nil {
			return err
		}
		renewals.Add(1)
		if !bytes.Contains(b, []byte(`"nodes":[`)) {
			return fmt.Errorf("POST /v1/nodes/renew: no nodes in %.80s", b)
		}
		return nil
	})

	// Every renewal's event reaches the stream within moments: wait until
	// the count stops growing (or 10 s), then stop the watch.
	deadline := time.Now().Add(10 * time.Second)
	for prev := int64(-1); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		ec.mu.Lock()
		n := ec.renewed
		ec.mu.Unlock()
		if n >= renewals.Load() && n == prev {
			break
		}
		prev = n
	}
	stopWatch()
	<-watched

	ec.mu.Lock()
	defer ec.mu.Unlock()
	st := &RenewStats{Renewals: renewals.Load(), Jobs: renewJobs, NodesPerJob: renewJobNodes,
		Events: ec.events, Renewed: ec.renewed, NodesListed: ec.nodes, Other: ec.other, OtherKinds: ec.otherKinds, Bytes: ec.bytes}
	if st.Renewals > 0 {
		st.EventsPerRenewal = float64(st.Renewed) / float64(st.Renewals)
		st.BytesPerRenewal = float64(st.Bytes) / float64(st.Renewals)
	}
	res.Renew = st
	addErr := func(kind, sample string, n int64) {
		if l.ErrorKinds == nil {
			l.ErrorKinds, l.ErrorSamples = map[string]int64{}, map[string]string{}
		}
		l.ErrorKinds[kind] += n
		l.ErrorSamples[kind] = sample
		l.Errors += n
	}
	if ec.err != nil {
		addErr("bad renewed event", ec.err.Error(), 1)
	}
	if st.Renewed > st.Renewals {
		addErr("more renewed events than renewals", fmt.Sprintf("%d renewed events for %d renewals", st.Renewed, st.Renewals), st.Renewed-st.Renewals)
	}
	if st.Renewed < st.Renewals {
		addErr("renewals without their event", fmt.Sprintf("%d renewed events for %d renewals", st.Renewed, st.Renewals), st.Renewals-st.Renewed)
	}
	if st.NodesListed != st.Renewed*renewJobNodes {
		addErr("renewed events missing nodes", fmt.Sprintf("%d nodes listed in %d renewed events of %d-node jobs", st.NodesListed, st.Renewed, renewJobNodes), 1)
	}
	return l
}
