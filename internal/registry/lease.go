package registry

import "time"

// MaxLease is the longest lease a claim or a renewal may ask for: a day.
// A job that needs its nodes longer renews, or claims without a lease.
const MaxLease = 24 * time.Hour

// checkLease records why d is not a lease a client may ask for: whole
// seconds from 1 to MaxLease, named lease_seconds as on the wire.
func checkLease(fe *FieldErrors, d time.Duration) {
	if d < time.Second || d > MaxLease || d%time.Second != 0 {
		fe.Add("lease_seconds", "must be a whole number of seconds between 1 and %d", int64(MaxLease/time.Second))
	}
}

// Renewal extends the leases of every node Job holds to Lease from now.
// Nodes the job holds without a lease stay held without one: a renewal
// never turns a claim held until released into one that can run out. A
// lease that has already run out is not renewed; the job no longer holds
// that node, whether or not the sweeper has released it yet.
type Renewal struct {
	Job   int64
	Lease time.Duration
}

// Normalize validates the renewal.
func (r *Renewal) Normalize() error {
	var fe FieldErrors
	if r.Job <= 0 {
		fe.Add("job", "must be a positive integer (the job's pk)")
	}
	checkLease(&fe, r.Lease)
	return fe.Err()
}
