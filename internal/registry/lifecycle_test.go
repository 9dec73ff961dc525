package registry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLifecycleRules(t *testing.T) {
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	ttl := 60 * time.Second
	at := func(ago time.Duration) *time.Time { v := now.Add(-ago); return &v }
	owner, job, reason := ptr("agent-1"), ptr[int64](9), ptr("fan")
	old := now.Add(-time.Hour)
	for _, tc := range []struct {
		name                string
		n                   Node
		lost, found, expire bool
	}{
		// Lost: watched (an owner or a heartbeat), silent past the TTL, not lost yet.
		{"heartbeated, silent", Node{Schedulable: true, LastSeen: at(61 * time.Second), UpdatedAt: old}, true, false, false},
		{"heartbeated, exactly the TTL ago", Node{Schedulable: true, LastSeen: at(ttl), UpdatedAt: old}, false, false, false},
		{"heartbeated, recent", Node{Schedulable: true, LastSeen: at(time.Second), UpdatedAt: old}, false, false, false},
		{"owned, never seen, registered long ago", Node{Schedulable: true, Owner: owner, UpdatedAt: old}, true, false, false},
		{"owned, never seen, just registered", Node{Schedulable: true, Owner: owner, UpdatedAt: now.Add(-time.Second)}, false, false, false},
		{"owned, heartbeat recent though written long ago", Node{Schedulable: true, Owner: owner, LastSeen: at(time.Second), UpdatedAt: old}, false, false, false},
		{"imported, no agent, never seen", Node{Schedulable: true, Source: "scp", UpdatedAt: old}, false, false, false},
		{"created by an admin, never seen", Node{Schedulable: true, Source: "api", UpdatedAt: old}, false, false, false},
		{"already lost", Node{Schedulable: true, Lost: true, LastSeen: at(time.Hour), UpdatedAt: old}, false, false, false},
		{"gone and silent: marked, still shows gone", Node{LastSeen: at(time.Hour), UpdatedAt: old}, true, false, false},
		{"busy and silent", Node{Schedulable: true, CurrentJob: job, LastSeen: at(time.Hour), UpdatedAt: old}, true, false, false},
		{"cordoned and silent", Node{Schedulable: true, CordonReason: reason, LastSeen: at(time.Hour), UpdatedAt: old}, true, false, false},
		// Found: lost, and a heartbeat within the TTL.
		{"lost, heartbeat recent", Node{Schedulable: true, Lost: true, LastSeen: at(time.Second), UpdatedAt: old}, false, true, false},
		{"lost, heartbeat exactly the TTL ago", Node{Schedulable: true, Lost: true, LastSeen: at(ttl), UpdatedAt: old}, false, true, false},
		{"lost, owned, never seen, written just now", Node{Schedulable: true, Lost: true, Owner: owner, UpdatedAt: now}, false, false, false},
		{"lost and gone, heartbeat recent", Node{Lost: true, LastSeen: at(time.Second), UpdatedAt: old}, false, true, false},
		{"not lost, heartbeat recent", Node{Schedulable: true, LastSeen: at(time.Second), UpdatedAt: old}, false, false, false},
		// Expired: a lease at or before now.
		{"lease ran out a second ago", Node{Schedulable: true, CurrentJob: job, LeaseExpiresAt: at(time.Second)}, false, false, true},
		{"lease runs out now", Node{Schedulable: true, CurrentJob: job, LeaseExpiresAt: at(0)}, false, false, true},
		{"lease runs out in a second", Node{Schedulable: true, CurrentJob: job, LeaseExpiresAt: at(-time.Second)}, false, false, false},
		{"claim without a lease", Node{Schedulable: true, CurrentJob: job}, false, false, false},
		{"draining, lease ran out", Node{Schedulable: true, CurrentJob: job, CordonReason: reason, LeaseExpiresAt: at(time.Second)}, false, false, true},
		{"lost, lease ran out", Node{Schedulable: true, Lost: true, CurrentJob: job, LeaseExpiresAt: at(time.Second), LastSeen: at(time.Hour)}, false, false, true},
		{"silent, lease ran out: both", Node{Schedulable: true, CurrentJob: job, LeaseExpiresAt: at(time.Second), LastSeen: at(time.Hour)}, true, false, true},
	} {
		if got := tc.n.BecomesLost(now, ttl); got != tc.lost {
			t.Errorf("%s: BecomesLost = %v, want %v", tc.name, got, tc.lost)
		}
		if got := tc.n.BecomesFound(now, ttl); got != tc.found {
			t.Errorf("%s: BecomesFound = %v, want %v", tc.name, got, tc.found)
		}
		if got := tc.n.LeaseExpired(now); got != tc.expire {
			t.Errorf("%s: LeaseExpired = %v, want %v", tc.name, got, tc.expire)
		}
		if tc.lost && tc.found {
			t.Errorf("%s: a case cannot be both", tc.name)
		}
	}
}

// The state a node shows after each decision, by the precedence.
func TestLifecycleStates(t *testing.T) {
	job, reason := ptr[int64](9), ptr("fan")
	lease := time.Now()
	for _, tc := range []struct {
		name string
		n    Node
		want State
	}{
		{"a busy node released is free", Node{Schedulable: true, CurrentJob: job, LeaseExpiresAt: &lease}, StateFree},
		{"a draining node released is cordoned, never free", Node{Schedulable: true, CurrentJob: job, CordonReason: reason, LeaseExpiresAt: &lease}, StateCordoned},
		{"a lost busy node released stays lost", Node{Schedulable: true, Lost: true, CurrentJob: job}, StateLost},
		{"a gone busy node released stays gone", Node{CurrentJob: job}, StateGone},
	} {
		r := tc.n.Released()
		if r.CurrentJob != nil || r.LeaseExpiresAt != nil {
			t.Errorf("%s: Released kept job %v, lease %v", tc.name, r.CurrentJob, r.LeaseExpiresAt)
		}
		if r.State != tc.want || r.DeriveState() != tc.want {
			t.Errorf("%s: state %s, want %s", tc.name, r.State, tc.want)
		}
	}
	if (Node{Schedulable: true, CurrentJob: job, CordonReason: reason}).DeriveState() != StateDraining {
		t.Error("a cordoned node holding a job is not draining")
	}
}

func TestDecideSweep(t *testing.T) {
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	ttl := 5 * time.Second
	at := func(ago time.Duration) *time.Time { v := now.Add(-ago); return &v }
	job := ptr[int64](3)
	candidates := []Node{
		{PK: 1, Schedulable: true, LastSeen: at(time.Minute)},                                         // lost
		{PK: 2, Schedulable: true, Lost: true, LastSeen: at(time.Second)},                             // found
		{PK: 3, Schedulable: true, CurrentJob: job, LeaseExpiresAt: at(0)},                            // expired
		{PK: 4, Schedulable: true, LastSeen: at(time.Second)},                                         // nothing
		{PK: 5, Schedulable: true, LastSeen: at(time.Minute), CurrentJob: job, LeaseExpiresAt: at(1)}, // lost and expired
		{PK: 6, Schedulable: true, Source: "scp"},                                                     // never watched
	}
	got := DecideSweep(candidates, now, ttl)
	if !slices.Equal(got.Lost, []int64{1, 5}) || !slices.Equal(got.Found, []int64{2}) || !slices.Equal(got.Expired, []int64{3, 5}) {
		t.Errorf("DecideSweep = %+v", got)
	}
	if got.Empty() || !DecideSweep(candidates[3:4], now, ttl).Empty() {
		t.Error("Empty is wrong")
	}
	if !DecideSweep(nil, now, ttl).Empty() {
		t.Error("no candidates decide something")
	}
	if r := LeaseExpiredReason(42); !strings.Contains(r, "lease") || !strings.Contains(r, "42") || !strings.Contains(r, "expired") {
		t.Errorf("reason %q", r)
	}
}
