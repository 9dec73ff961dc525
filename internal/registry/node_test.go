package registry

import (
	"errors"
	"testing"
	"time"
)

func TestCanonicalIP(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.1", "10.0.0.1"},
		{"2001:DB8:0:0::7", "2001:db8::7"},
		{"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},
		{"::ffff:10.1.2.3", "10.1.2.3"},
		{"fe80::1", "fe80::1"},
	} {
		got, err := CanonicalIP(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("CanonicalIP(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "10.0.0", "10.0.0.1/32", "fe80::1%eth0", "host", " 10.0.0.1", "010.0.0.1"} {
		if _, err := CanonicalIP(bad); err == nil {
			t.Errorf("CanonicalIP(%q) accepted", bad)
		}
	}
}

func TestNodeSpecNormalize(t *testing.T) {
	neg := int64(-1)
	zero := int64(0)
	s := NodeSpec{IP: "x", Index: -1, CPUMem: -1, DriverVersion: "a\x00b", HardwareGeneration: &zero, GPUMem: &neg}
	err := s.Normalize()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	want := []string{"ip", "index", "cpu_mem", "driver_version", "hardware_generation", "gpu_mem"}
	got := FieldsOf(err)
	if len(got) != len(want) {
		t.Fatalf("fields %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Field != want[i] {
			t.Errorf("field %d = %s, want %s", i, got[i].Field, want[i])
		}
	}
}

func TestNodeEchoCheck(t *testing.T) {
	seen := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	job := int64(9)
	cur := Node{PK: 5, LastSeen: &seen, CurrentJob: &job, CreatedAt: seen, UpdatedAt: seen}
	ok := []NodeEcho{
		{},
		{PK: Optional[int64]{Set: true, Value: 5}},
		{LastSeen: Optional[time.Time]{Set: true, Value: seen}},
		{LastSeen: Optional[time.Time]{Set: true, Value: seen.Add(-time.Minute)}}, // read before a heartbeat
		{LastSeen: Optional[time.Time]{Set: true, Null: true}},                    // read before the first one
		{CurrentJob: Optional[int64]{Set: true, Value: 9}},
		{CreatedAt: Optional[time.Time]{Set: true, Value: seen.In(time.FixedZone("x", 3600))}},
	}
	for i, e := range ok {
		if err := e.Check(cur); err != nil {
			t.Errorf("echo %d refused: %v", i, err)
		}
	}
	bad := map[string]NodeEcho{
		"pk":          {PK: Optional[int64]{Set: true, Value: 6}},
		"last_seen":   {LastSeen: Optional[time.Time]{Set: true, Value: seen.Add(time.Second)}},
		"current_job": {CurrentJob: Optional[int64]{Set: true, Null: true}},
		"created_at":  {CreatedAt: Optional[time.Time]{Set: true, Value: seen.Add(time.Microsecond)}},
		"updated_at":  {UpdatedAt: Optional[time.Time]{Set: true, Null: true}},
	}
	for field, e := range bad {
		f := FieldsOf(e.Check(cur))
		if len(f) != 1 || f[0].Field != field {
			t.Errorf("echo changing %s: fields %v", field, f)
		}
	}
	// A node never seen cannot have been seen at some time.
	if err := (NodeEcho{LastSeen: Optional[time.Time]{Set: true, Value: seen}}).Check(Node{}); err == nil {
		t.Error("last_seen echoed for a node never seen")
	}
}

func TestNodePatchApply(t *testing.T) {
	hw, mem := int64(3), int64(80)
	base := NodeSpec{IP: "10.0.0.1", Index: 1, CPUMem: 2, DriverVersion: "d", HardwareGeneration: &hw, GPUMem: &mem}
	got := NodePatch{}.Apply(base)
	if got != base {
		t.Errorf("empty patch changed the spec: %+v", got)
	}
	got = NodePatch{GPUMem: Optional[int64]{Set: true, Null: true}, CPUMem: Optional[int64]{Set: true, Value: 9}}.Apply(base)
	if got.GPUMem != nil || got.CPUMem != 9 || got.HardwareGeneration != &hw {
		t.Errorf("patched: %+v", got)
	}
}
