package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// kept are the jobs whose claims a keep workload holds until it ends, when
// they are all released (releaseAll).
type kept struct {
	mu   sync.Mutex
	jobs []int64
}

func (k *kept) add(job int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.jobs = append(k.jobs, job)
}

// forget drops job, whose claim was refused: it holds nothing.
func (k *kept) forget(job int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if i := slices.Index(k.jobs, job); i >= 0 {
		k.jobs = slices.Delete(k.jobs, i, i+1)
	}
}

// take returns the jobs kept so far and forgets them.
func (k *kept) take() []int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	jobs := k.jobs
	k.jobs = nil
	return jobs
}

// claimKeep is an op that claims count nodes (on one host when sameHost)
// for a new job and keeps them: the fleet fills as schedulers that place
// jobs fill it, rather than getting back what each claim took. The claim
// is checked as claimRelease checks it; its job is released at the end of
// the workload, whatever the checks said.
func (t *target) claimKeep(count int, sameHost bool) op {
	return func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
		job := t.jobs.Add(1)
		// Released at the end whatever the answer: a claim whose answer
		// was lost (the run's end, a timeout) may still have taken nodes.
		t.kept.add(job)
		body := fmt.Appendf(nil, `{"job":%d,"count":%d,"same_host":%t}`, job, count, sameHost)
		b, err := call(ctx, c, "POST", t.url+"/v1/nodes/claim", t.fleet.scheduler, body)
		if se, ok := errors.AsType[*statusError](err); ok && se.code == http.StatusConflict &&
			(strings.Contains(se.body, `"no_single_host"`) || strings.Contains(se.body, `"insufficient_capacity"`)) {
			t.kept.forget(job)
			return errStop // the fleet is full for this shape: this scheduler is done
		}
		if err != nil {
			return err
		}
		var got struct {
			Nodes []claimedNode `json:"nodes"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			return fmt.Errorf("POST /v1/nodes/claim: %w", err)
		}
		pks := pksOf(got.Nodes)
		if err := t.holds.take(job, pks); err != nil {
			return err
		}
		return checkClaim(job, count, sameHost, got.Nodes)
	}
}
