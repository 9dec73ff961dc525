package registry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

func TestNodeFilterNormalize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filter NodeFilter
		fields []string // refused fields, in order; nil: valid
	}{
		{"empty", NodeFilter{}, nil},
		{"every filter valid", NodeFilter{
			Free: ptr(true), CurrentJob: ptr[int64](1), HardwareGeneration: ptr[int64](1), MinGPUMem: ptr[int64](0),
			MinCPUMem: ptr[int64](0), IP: ptr("10.0.0.1"), Index: ptr(MaxIndex), SeenWithin: ptr(MaxSeenWithin),
			Source: ptr("e2e"), PK: ptr[int64](1), After: 0, Limit: MaxListLimit,
		}, nil},
		{"current_job 0", NodeFilter{CurrentJob: ptr[int64](0)}, []string{"current_job"}},
		{"current_job negative", NodeFilter{CurrentJob: ptr[int64](-1)}, []string{"current_job"}},
		{"hardware_generation 0", NodeFilter{HardwareGeneration: ptr[int64](0)}, []string{"hardware_generation"}},
		{"hardware_generation negative", NodeFilter{HardwareGeneration: ptr[int64](-7)}, []string{"hardware_generation"}},
		{"ip", NodeFilter{IP: ptr("10.0.0.1/8")}, []string{"ip"}},
		{"index negative", NodeFilter{Index: ptr(-1)}, []string{"index"}},
		{"index too large", NodeFilter{Index: ptr(MaxIndex + 1)}, []string{"index"}},
		{"min_gpu_mem", NodeFilter{MinGPUMem: ptr[int64](-1)}, []string{"min_gpu_mem"}},
		{"min_cpu_mem", NodeFilter{MinCPUMem: ptr[int64](-1)}, []string{"min_cpu_mem"}},
		{"seen_within 0", NodeFilter{SeenWithin: ptr(time.Duration(0))}, []string{"seen_within"}},
		{"seen_within under a second", NodeFilter{SeenWithin: ptr(time.Millisecond)}, []string{"seen_within"}},
		{"seen_within too long", NodeFilter{SeenWithin: ptr(MaxSeenWithin + time.Second)}, []string{"seen_within"}},
		{"source", NodeFilter{Source: ptr("aws")}, []string{"source"}},
		{"source case", NodeFilter{Source: ptr("API")}, []string{"source"}},
		{"pk 0", NodeFilter{PK: ptr[int64](0)}, []string{"node"}},
		{"pk negative", NodeFilter{PK: ptr[int64](-1)}, []string{"node"}},
		{"after", NodeFilter{After: -1}, []string{"after"}},
		{"limit negative", NodeFilter{Limit: -1}, []string{"limit"}},
		{"limit too large", NodeFilter{Limit: MaxListLimit + 1}, []string{"limit"}},
		{"several", NodeFilter{CurrentJob: ptr[int64](-1), Source: ptr("x"), After: -1},
			[]string{"current_job", "source", "after"}},
	} {
		f := tc.filter
		var got []string
		for _, fe := range FieldsOf(f.Normalize()) {
			got = append(got, fe.Field)
		}
		if !slices.Equal(got, tc.fields) {
			t.Errorf("%s: refused %v, want %v", tc.name, got, tc.fields)
		}
	}
	f := NodeFilter{IP: ptr("2001:DB8::0:1")}
	if err := f.Normalize(); err != nil || *f.IP != "2001:db8::1" {
		t.Errorf("ip not canonical: %v %q", err, *f.IP)
	}
}

func TestClaimNormalizeNamesEachFieldOnce(t *testing.T) {
	c := Claim{Job: 1, Count: 1, Filter: NodeFilter{CurrentJob: ptr[int64](-1), Limit: -1, HardwareGeneration: ptr[int64](0)}}
	var got []string
	for _, fe := range FieldsOf(c.Normalize()) {
		got = append(got, fe.Field)
	}
	if want := []string{"current_job", "limit", "hardware_generation"}; !slices.Equal(got, want) {
		t.Errorf("fields %v, want %v", got, want)
	}
}

func TestAuditFilterNormalize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filter AuditFilter
		fields []string
	}{
		{"empty", AuditFilter{}, nil},
		{"valid", AuditFilter{TargetType: ptr("hardware"), TargetPK: ptr[int64](3), Principal: ptr("agent-1"),
			Since: ptr(time.Now()), After: 9, Limit: MaxListLimit}, nil},
		{"target_type", AuditFilter{TargetType: ptr("job")}, []string{"target_type"}},
		{"target_pk 0", AuditFilter{TargetPK: ptr[int64](0)}, []string{"target_pk"}},
		{"target_pk negative", AuditFilter{TargetPK: ptr[int64](-2)}, []string{"target_pk"}},
		{"principal control", AuditFilter{Principal: ptr("a\nb")}, []string{"principal"}},
		{"principal long", AuditFilter{Principal: ptr(strings.Repeat("p", MaxPrincipalLen+1))}, []string{"principal"}},
		{"principal not UTF-8", AuditFilter{Principal: ptr("a\xff")}, []string{"principal"}},
		{"after", AuditFilter{After: -1}, []string{"after"}},
		{"limit", AuditFilter{Limit: MaxListLimit + 1}, []string{"limit"}},
	} {
		f := tc.filter
		var got []string
		for _, fe := range FieldsOf(f.Normalize()) {
			got = append(got, fe.Field)
		}
		if !slices.Equal(got, tc.fields) {
			t.Errorf("%s: refused %v, want %v", tc.name, got, tc.fields)
		}
	}
}

func TestNodeFilterMatch(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	seen := now.Add(-30 * time.Second)
	n := Node{PK: 7, IP: "10.0.0.1", Index: 2, CPUMem: 100, HardwareGeneration: ptr[int64](3), GPUMem: ptr[int64](80),
		LastSeen: &seen, Source: "scp", Schedulable: true}
	busy := n
	busy.CurrentJob = ptr[int64](9)
	stopped := n
	stopped.Schedulable = false
	bare := Node{PK: 8, IP: "10.0.0.2", Source: "api", Schedulable: true} // no GPU, generation, heartbeat
	lost := n
	lost.Lost = true
	cordoned := n
	cordoned.CordonReason = ptr("disk")
	for _, tc := range []struct {
		name   string
		filter NodeFilter
		node   Node
		want   bool
	}{
		{"empty", NodeFilter{}, n, true},
		{"free", NodeFilter{Free: ptr(true)}, n, true},
		{"free: busy", NodeFilter{Free: ptr(true)}, busy, false},
		{"free: stopped", NodeFilter{Free: ptr(true)}, stopped, false},
		{"not free: busy", NodeFilter{Free: ptr(false)}, busy, true},
		{"not free: stopped", NodeFilter{Free: ptr(false)}, stopped, true},
		{"not free: free", NodeFilter{Free: ptr(false)}, n, false},
		{"free: lost", NodeFilter{Free: ptr(true)}, lost, false},
		{"free: cordoned", NodeFilter{Free: ptr(true)}, cordoned, false},
		{"not free: lost", NodeFilter{Free: ptr(false)}, lost, true},
		{"current_job", NodeFilter{CurrentJob: ptr[int64](9)}, busy, true},
		{"current_job other", NodeFilter{CurrentJob: ptr[int64](8)}, busy, false},
		{"current_job of a free node", NodeFilter{CurrentJob: ptr[int64](9)}, n, false},
		{"hardware_generation", NodeFilter{HardwareGeneration: ptr[int64](3)}, n, true},
		{"hardware_generation other", NodeFilter{HardwareGeneration: ptr[int64](4)}, n, false},
		{"hardware_generation of none", NodeFilter{HardwareGeneration: ptr[int64](3)}, bare, false},
		{"min_gpu_mem equal", NodeFilter{MinGPUMem: ptr[int64](80)}, n, true},
		{"min_gpu_mem above", NodeFilter{MinGPUMem: ptr[int64](81)}, n, false},
		{"min_gpu_mem 0 without a GPU", NodeFilter{MinGPUMem: ptr[int64](0)}, bare, false},
		{"min_cpu_mem", NodeFilter{MinCPUMem: ptr[int64](100)}, n, true},
		{"min_cpu_mem above", NodeFilter{MinCPUMem: ptr[int64](101)}, n, false},
		{"ip", NodeFilter{IP: ptr("10.0.0.1")}, n, true},
		{"ip other", NodeFilter{IP: ptr("10.0.0.2")}, n, false},
		{"index", NodeFilter{Index: ptr(2)}, n, true},
		{"index other", NodeFilter{Index: ptr(0)}, n, false},
		{"seen_within", NodeFilter{SeenWithin: ptr(30 * time.Second)}, n, true},
		{"seen_within too short", NodeFilter{SeenWithin: ptr(29 * time.Second)}, n, false},
		{"seen_within never seen", NodeFilter{SeenWithin: ptr(MaxSeenWithin)}, bare, false},
		{"source", NodeFilter{Source: ptr("scp")}, n, true},
		{"source other", NodeFilter{Source: ptr("api")}, n, false},
		{"pk", NodeFilter{PK: ptr[int64](7)}, n, true},
		{"pk other", NodeFilter{PK: ptr[int64](8)}, n, false},
		{"paging is not matching", NodeFilter{After: 100, Limit: 1}, n, true},
		{"all at once", NodeFilter{Free: ptr(true), HardwareGeneration: ptr[int64](3), Source: ptr("scp"), Index: ptr(2)}, n, true},
		{"all but one", NodeFilter{Free: ptr(true), HardwareGeneration: ptr[int64](3), Source: ptr("scp"), Index: ptr(1)}, n, false},
	} {
		tc.node.State = tc.node.DeriveState() // as the store and the change log hand nodes out
		if got := tc.filter.Match(tc.node, now); got != tc.want {
			t.Errorf("%s: Match = %v, want %v", tc.name, got, tc.want)
		}
	}
}
