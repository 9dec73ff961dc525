package registry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCordonedAndUncordoned(t *testing.T) {
	job, lease := ptr[int64](9), ptr(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	free := Node{PK: 1, Schedulable: true}
	busy := Node{PK: 2, Schedulable: true, CurrentJob: job, LeaseExpiresAt: lease}
	cordoned := Node{PK: 3, Schedulable: true, CordonReason: ptr("fan")}
	for _, tc := range []struct {
		name    string
		n       Node
		reason  string
		changed bool
		state   State
	}{
		{"free node", free, "psu", true, StateCordoned},
		// The drain rule: the job keeps the node, lease and all.
		{"busy node drains", busy, "psu", true, StateDraining},
		{"same reason changes nothing", cordoned, "fan", false, StateCordoned},
		{"another reason replaces it", cordoned, "psu", true, StateCordoned},
	} {
		tc.n.State = tc.n.DeriveState()
		got, changed := tc.n.Cordoned(tc.reason)
		if changed != tc.changed || got.State != tc.state {
			t.Errorf("%s: Cordoned = %s, %v; want %s, %v", tc.name, got.State, changed, tc.state, tc.changed)
		}
		if got.CordonReason == nil || (tc.changed && *got.CordonReason != tc.reason) {
			t.Errorf("%s: reason %v", tc.name, got.CordonReason)
		}
		if got.CurrentJob != tc.n.CurrentJob || got.LeaseExpiresAt != tc.n.LeaseExpiresAt {
			t.Errorf("%s: the job or lease changed: %v %v", tc.name, got.CurrentJob, got.LeaseExpiresAt)
		}
		// Released, a drained node is cordoned, never free.
		got.CurrentJob, got.LeaseExpiresAt = nil, nil
		if s := got.DeriveState(); s != StateCordoned {
			t.Errorf("%s: released, it is %s", tc.name, s)
		}
		back, changed := got.Uncordoned()
		if !changed || back.CordonReason != nil || back.State != StateFree {
			t.Errorf("%s: Uncordoned = %s (%v), %v", tc.name, back.State, back.CordonReason, changed)
		}
	}
	drained, _ := busy.Cordoned("psu")
	if back, _ := drained.Uncordoned(); back.State != StateBusy || back.CurrentJob != job {
		t.Errorf("uncordoning a draining node: %s, job %v", back.State, back.CurrentJob)
	}
	if _, changed := free.Uncordoned(); changed {
		t.Error("uncordoning a node that is not cordoned changed it")
	}
}

func TestCordonNormalize(t *testing.T) {
	f := func(nf NodeFilter) *NodeFilter { return &nf }
	for _, tc := range []struct {
		name   string
		c      Cordon
		fields []string
	}{
		{"by pks", Cordon{Nodes: []int64{1, 2, 2}, Reason: "fan"}, nil},
		{"by filter", Cordon{Filter: f(NodeFilter{IP: ptr("10.0.0.7")}), Reason: "fan"}, nil},
		{"by state", Cordon{Filter: f(NodeFilter{State: []State{StateFree}}), Reason: "fan"}, nil},
		{"reason of 200", Cordon{Nodes: []int64{1}, Reason: strings.Repeat("é", 200)}, nil},
		{"no reason", Cordon{Nodes: []int64{1}}, []string{"reason"}},
		{"reason of 201", Cordon{Nodes: []int64{1}, Reason: strings.Repeat("é", 201)}, []string{"reason"}},
		{"reason with a newline", Cordon{Nodes: []int64{1}, Reason: "fan\nbroken"}, []string{"reason"}},
		{"reason in blanks", Cordon{Nodes: []int64{1}, Reason: " fan"}, []string{"reason"}},
		{"reason turned around", Cordon{Nodes: []int64{1}, Reason: "fan \u202Edekorb"}, []string{"reason"}},
		{"reason with a zero-width space", Cordon{Nodes: []int64{1}, Reason: "fan\u200Bbroken"}, []string{"reason"}},
		{"reason with a byte order mark", Cordon{Nodes: []int64{1}, Reason: "\uFEFFfan"}, []string{"reason"}},
		{"reason with a joiner", Cordon{Nodes: []int64{1}, Reason: "fan \U0001F469\u200D\U0001F527 on it"}, nil},
		{"neither", Cordon{Reason: "fan"}, []string{"nodes"}},
		{"an empty filter", Cordon{Filter: f(NodeFilter{}), Reason: "fan"}, []string{"nodes"}},
		{"both", Cordon{Nodes: []int64{1}, Filter: f(NodeFilter{IP: ptr("10.0.0.7")}), Reason: "fan"}, []string{"nodes"}},
		{"no pks", Cordon{Nodes: []int64{}, Reason: "fan"}, []string{"nodes"}},
		{"a zero pk", Cordon{Nodes: []int64{3, 0}, Reason: "fan"}, []string{"nodes"}},
		{"too many pks", Cordon{Nodes: make([]int64, MaxCordon+1), Reason: "fan"}, []string{"nodes"}},
		{"paging", Cordon{Filter: f(NodeFilter{Source: ptr("scp"), After: 3, Limit: 5}), Reason: "fan"}, []string{"after", "limit"}},
		{"a bad filter", Cordon{Filter: f(NodeFilter{Source: ptr("aws")}), Reason: ""}, []string{"reason", "source"}},
	} {
		var got []string
		for _, fe := range FieldsOf(tc.c.Normalize()) {
			got = append(got, fe.Field)
		}
		if !slices.Equal(got, tc.fields) {
			t.Errorf("%s: fields %v, want %v", tc.name, got, tc.fields)
		}
	}
	for _, tc := range []struct {
		u    Uncordon
		want bool
	}{{Uncordon{Nodes: []int64{4}}, true}, {Uncordon{}, false}, {Uncordon{Nodes: []int64{}}, false}, {Uncordon{Nodes: []int64{-1}}, false}} {
		if ok := tc.u.Normalize() == nil; ok != tc.want {
			t.Errorf("Uncordon%v: valid %v, want %v", tc.u.Nodes, ok, tc.want)
		}
	}
}

func TestLeaseBounds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want bool
	}{
		{time.Second, true}, {MaxLease, true}, {0, false}, {-time.Second, false},
		{MaxLease + time.Second, false}, {1500 * time.Millisecond, false},
	} {
		c := Claim{Job: 1, Count: 1, Lease: &tc.d}
		if ok := c.Normalize() == nil; ok != tc.want {
			t.Errorf("claim lease %v: valid %v, want %v (%v)", tc.d, ok, tc.want, c.Normalize())
		}
		r := Renewal{Job: 1, Lease: tc.d}
		if ok := r.Normalize() == nil; ok != tc.want {
			t.Errorf("renewal lease %v: valid %v, want %v", tc.d, ok, tc.want)
		}
		if !tc.want && !slices.ContainsFunc(FieldsOf(r.Normalize()), func(fe FieldError) bool { return fe.Field == "lease_seconds" }) {
			t.Errorf("renewal lease %v: lease_seconds not named", tc.d)
		}
	}
	if (&Claim{Job: 1, Count: 1}).Normalize() != nil {
		t.Error("a claim without a lease is refused")
	}
	if (&Renewal{Lease: time.Minute}).Normalize() == nil {
		t.Error("a renewal without a job is accepted")
	}
}

func TestStateFilter(t *testing.T) {
	reason, job := ptr("fan"), ptr[int64](4)
	nodes := map[State]Node{
		StateFree:     {Schedulable: true},
		StateBusy:     {Schedulable: true, CurrentJob: job},
		StateCordoned: {Schedulable: true, CordonReason: reason},
		StateDraining: {Schedulable: true, CordonReason: reason, CurrentJob: job},
		StateLost:     {Schedulable: true, Lost: true},
		StateGone:     {},
	}
	now := time.Now()
	for _, tc := range []struct {
		f    NodeFilter
		want []State
	}{
		{NodeFilter{State: []State{StateFree}}, []State{StateFree}},
		{NodeFilter{State: []State{StateCordoned, StateDraining}}, []State{StateDraining, StateCordoned}},
		{NodeFilter{Free: ptr(true)}, []State{StateFree}},
		{NodeFilter{Free: ptr(false)}, []State{StateGone, StateLost, StateDraining, StateCordoned, StateBusy}},
		{NodeFilter{Free: ptr(false), State: []State{StateFree, StateBusy}}, []State{StateBusy}},
		{NodeFilter{Free: ptr(true), State: []State{StateFree, StateBusy}}, []State{StateFree}},
		{NodeFilter{}, States},
	} {
		if err := tc.f.Normalize(); err != nil {
			t.Fatalf("%+v: %v", tc.f, err)
		}
		var got []State
		for _, st := range States {
			n := nodes[st]
			n.State = n.DeriveState()
			if n.State != st {
				t.Fatalf("fixture for %s is %s", st, n.State)
			}
			if tc.f.Match(n, now) {
				got = append(got, st)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%+v matches %v, want %v", tc.f, got, tc.want)
		}
	}
	for _, f := range []NodeFilter{
		{State: []State{"asleep"}},
		{State: []State{StateFree, ""}},
		{Free: ptr(true), State: []State{StateBusy}},
		{Free: ptr(false), State: []State{StateFree}},
	} {
		fe := FieldsOf(f.Normalize())
		if len(fe) != 1 || fe[0].Field != "state" {
			t.Errorf("%+v: %v, want one error naming state", f, fe)
		}
	}
}

func TestFilterOwner(t *testing.T) {
	a, b := "agent-a", "agent-b"
	f := NodeFilter{Owner: &a}
	if err := f.Normalize(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, tc := range []struct {
		owner *string
		want  bool
	}{{&a, true}, {&b, false}, {nil, false}} {
		if got := f.Match(Node{Owner: tc.owner}, now); got != tc.want {
			t.Errorf("owner %v: match %v, want %v", tc.owner, got, tc.want)
		}
	}
	if (&Cordon{Filter: &NodeFilter{Owner: &a}, Reason: "r"}).Normalize() != nil {
		t.Error("a cordon by owner alone is refused as an empty filter")
	}
	empty := ""
	if FieldsOf((&NodeFilter{Owner: &empty}).Normalize()) == nil {
		t.Error("an empty owner is accepted")
	}
}
