package store

import (
	"context"
	"sync"
)

// jobClaims counts the claims of each job under way on this replica, so
// that a release of the job can wait for them: a scheduler whose claim
// timed out often releases its job at once, while the claim may still be
// committing (a COMMIT on its way cannot be called back), and a release
// that read the nodes before that commit would leave them held. Across
// replicas the window is the COMMIT's round trip, as for any transaction.
type jobClaims struct {
	mu      sync.Mutex
	n       map[int64]int
	settled chan struct{} // closed, and replaced, whenever a claim ends
}

func newJobClaims() *jobClaims {
	return &jobClaims{n: map[int64]int{}, settled: make(chan struct{})}
}

// start notes a claim of job under way; end notes its end. A nil
// jobClaims tracks nothing.
func (j *jobClaims) start(job int64) *jobClaims {
	if j != nil {
		j.mu.Lock()
		j.n[job]++
		j.mu.Unlock()
	}
	return j
}

func (j *jobClaims) end(job int64) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.n[job]--; j.n[job] <= 0 {
		delete(j.n, job)
	}
	close(j.settled)
	j.settled = make(chan struct{})
}

// wait waits until no claim of job is under way (or ctx ends, with its
// error); on a nil jobClaims it returns at once.
func (j *jobClaims) wait(ctx context.Context, job int64) error {
	for j != nil {
		j.mu.Lock()
		n, settled := j.n[job], j.settled
		j.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-settled:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
