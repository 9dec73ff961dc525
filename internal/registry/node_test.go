package registry

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func stamp(t time.Time, p time.Duration) Optional[Stamp] {
	return Optional[Stamp]{Set: true, Value: Stamp{Time: t, Precision: p}}
}

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
	for _, bad := range []string{"", "10.0.0", "10.0.0.1/32", "fe80::1%eth0", "host", " 10.0.0.1", "010.0.0.1",
		// No host has these.
		"0.0.0.0", "::", "::ffff:0.0.0.0", "255.255.255.255", "224.0.0.1", "239.1.2.3", "ff02::1"} {
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
		{CreatedAt: stamp(seen.In(time.FixedZone("x", 3600)), time.Nanosecond)},
		{CreatedAt: stamp(seen, time.Microsecond), UpdatedAt: stamp(seen, time.Microsecond)},
		// Clients that write whole seconds (or milliseconds) echo the
		// stored instant cut to what they write.
		{CreatedAt: stamp(seen.Truncate(time.Second), time.Second), UpdatedAt: stamp(seen.Truncate(time.Second), time.Second)},
		{UpdatedAt: stamp(seen.Truncate(time.Millisecond), time.Millisecond)},
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
		"created_at":  {CreatedAt: stamp(seen.Add(time.Microsecond), time.Microsecond)},
		"updated_at":  {UpdatedAt: Optional[Stamp]{Set: true, Null: true}},
		// At second precision the second itself must match...
		"created_at ": {CreatedAt: stamp(seen.Truncate(time.Second).Add(time.Second), time.Second)},
		// Full precision sent, so the full value counts.
		"updated_at  ": {UpdatedAt: stamp(seen.Truncate(time.Second), time.Nanosecond)},
	}
	for field, e := range bad {
		field = strings.TrimSpace(field)
		f := FieldsOf(e.Check(cur))
		if len(f) != 1 || f[0].Field != field {
			t.Errorf("echo changing %s: fields %v", field, f)
		}
	}
	// Clients cut digits; a value rounded up is another instant.
	late := time.Date(2026, 1, 2, 3, 4, 5, 999_000_000, time.UTC)
	if err := (NodeEcho{UpdatedAt: stamp(late.Round(time.Second), time.Second)}).Check(Node{UpdatedAt: late}); err == nil {
		t.Error("updated_at rounded up to the next second was accepted")
	}
	// A node never seen cannot have been seen at some time.
	if err := (NodeEcho{LastSeen: Optional[time.Time]{Set: true, Value: seen}}).Check(Node{}); err == nil {
		t.Error("last_seen echoed for a node never seen")
	}
}

func TestNodePatchApply(t *testing.T) {
	hw, mem := int64(3), int64(80)
	base := NodeSpec{IP: "10.0.0.1", Index: 1, CPUMem: 2, DriverVersion: "d", HardwareGeneration: &hw, GPUMem: &mem}
	got, err := NodePatch{}.Apply(base)
	if err != nil || got != base {
		t.Errorf("empty patch changed the spec: %+v, %v", got, err)
	}
	got, err = NodePatch{GPUMem: Optional[int64]{Set: true, Null: true}, CPUMem: Optional[int64]{Set: true, Value: 9},
		Fabric: Optional[string]{Set: true, Value: "ib-1"}}.Apply(base)
	if err != nil || got.GPUMem != nil || got.CPUMem != 9 || got.HardwareGeneration != &hw || *got.Fabric != "ib-1" {
		t.Errorf("patched: %+v, %v", got, err)
	}
	v := "x"
	_, err = NodePatch{Labels: LabelPatch{Set: true, Values: map[string]*string{"scp.registryd.io/a": &v}}}.Apply(base)
	if fe := FieldsOf(err); len(fe) != 1 || fe[0].Field != "labels" {
		t.Errorf("a reserved label set by a patch: %v; want a labels field error", err)
	}
}

func TestNodeSpecTopologyFields(t *testing.T) {
	empty, blank, long := "", " ib-1", strings.Repeat("x", MaxFabric+1)
	for _, c := range []struct {
		spec  NodeSpec
		field string
	}{
		{NodeSpec{Fabric: &empty}, "fabric"},
		{NodeSpec{Fabric: &blank}, "fabric"},
		{NodeSpec{Fabric: &long}, "fabric"},
		{NodeSpec{GPUModel: &empty}, "gpu_model"},
		{NodeSpec{GPUUUID: &long}, "gpu_uuid"},
	} {
		c.spec.IP, c.spec.DriverVersion = "10.0.0.1", "d"
		if fe := FieldsOf(c.spec.Normalize()); len(fe) != 1 || fe[0].Field != c.field {
			t.Errorf("%+v: %v; want one error on %s", c.spec, fe, c.field)
		}
	}
	a := NodeSpec{IP: "10.0.0.1", Fabric: new("f"), Labels: mustLabels(t, map[string]string{"k": "v"})}
	b := a
	b.Fabric = new("f")
	if !a.Same(b) {
		t.Error("equal specs differ")
	}
	b.Labels = Labels{}
	if a.Same(b) {
		t.Error("specs of different labels are the same")
	}
}

// The node's document is pinned byte for byte: API responses, the watch
// stream and the logs all carry it, and clients parse it.
func TestNodeDocument(t *testing.T) {
	at := time.Date(2026, 11, 29, 16, 4, 8, 228713000, time.UTC)
	hw, gpu, job := int64(1), int64(85899345920), int64(7)
	owner, ext, state := "agent-gpu-1", "host-1", "RUNNING"
	n := Node{PK: 1, IP: "2001:db8::7", Index: 0, CPUMem: 2199023255552, DriverVersion: "550.54.15",
		HardwareGeneration: &hw, GPUMem: &gpu, LastSeen: &at, CurrentJob: &job, Owner: &owner, Source: "scp",
		Schedulable: true, ExternalID: &ext, ProviderState: &state, CreatedAt: at, UpdatedAt: at, Version: 3,
		GPUModel: new("NVIDIA H100 80GB HBM3"), GPUUUID: new("GPU-5f1c"), Fabric: new("fab-7"),
		Labels: mustLabels(t, map[string]string{"team": "ml", "scp.registryd.io/region": "kr-west1"})}
	lease, reason := at.Add(time.Hour), "fan"
	n.LeaseExpiresAt, n.CordonReason = &lease, &reason
	n.State = n.DeriveState()
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"pk":1,"ip":"2001:db8::7","index":0,"cpu_mem":2199023255552,"driver_version":"550.54.15",` +
		`"hardware_generation":1,"gpu_mem":85899345920,"gpu_model":"NVIDIA H100 80GB HBM3","gpu_uuid":"GPU-5f1c",` +
		`"fabric":"fab-7","labels":{"scp.registryd.io/region":"kr-west1","team":"ml"},"last_seen":"2026-11-29T16:04:08.228713Z","current_job":7,` +
		`"lease_expires_at":"2026-11-29T17:04:08.228713Z","owner":"agent-gpu-1","source":"scp","schedulable":true,` +
		`"state":"draining","cordon_reason":"fan","external_id":"host-1","provider_state":"RUNNING",` +
		`"created_at":"2026-11-29T16:04:08.228713Z","updated_at":"2026-11-29T16:04:08.228713Z","version":3}`
	if string(b) != want {
		t.Errorf("document\n got %s\nwant %s", b, want)
	}
	b, _ = json.Marshal(Node{})
	if want := `{"pk":0,"ip":"","index":0,"cpu_mem":0,"driver_version":"","hardware_generation":null,"gpu_mem":null,` +
		`"gpu_model":null,"gpu_uuid":null,"fabric":null,"labels":{},"last_seen":null,"current_job":null,"lease_expires_at":null,"owner":null,"source":"","schedulable":false,` +
		`"state":"","cordon_reason":null,"external_id":null,` +
		`"provider_state":null,"created_at":"0001-01-01T00:00:00Z","updated_at":"0001-01-01T00:00:00Z","version":0}`; string(b) != want {
		t.Errorf("empty document\n got %s\nwant %s", b, want)
	}
}

// UTC converts every time of a node, including a field added later: the
// test walks the struct, so a new time field UTC forgets fails here.
func TestNodeUTC(t *testing.T) {
	zone := time.FixedZone("x", 5*3600)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, zone)
	var n Node
	v := reflect.ValueOf(&n).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Interface().(type) {
		case time.Time:
			f.Set(reflect.ValueOf(at))
		case *time.Time:
			f.Set(reflect.ValueOf(&at))
		}
	}
	u := reflect.ValueOf(n.UTC())
	for i := range u.NumField() {
		name := u.Type().Field(i).Name
		switch f := u.Field(i).Interface().(type) {
		case time.Time:
			if f.Location() != time.UTC || !f.Equal(at) {
				t.Errorf("%s = %v, want %v in UTC", name, f, at)
			}
		case *time.Time:
			if f == &at || f.Location() != time.UTC || !f.Equal(at) {
				t.Errorf("%s = %v, want a new %v in UTC", name, f, at)
			}
		}
	}
	if at.Location() != zone {
		t.Error("UTC changed the caller's time")
	}
}

func TestDeriveState(t *testing.T) {
	job, reason := ptr[int64](5), ptr("bad fan")
	for _, tc := range []struct {
		name string
		n    Node
		want State
	}{
		{"free", Node{Schedulable: true}, StateFree},
		{"busy", Node{Schedulable: true, CurrentJob: job}, StateBusy},
		{"cordoned", Node{Schedulable: true, CordonReason: reason}, StateCordoned},
		{"draining", Node{Schedulable: true, CordonReason: reason, CurrentJob: job}, StateDraining},
		{"lost", Node{Schedulable: true, Lost: true}, StateLost},
		{"lost beats draining", Node{Schedulable: true, Lost: true, CordonReason: reason, CurrentJob: job}, StateLost},
		{"gone", Node{}, StateGone},
		{"gone beats everything", Node{Lost: true, CordonReason: reason, CurrentJob: job}, StateGone},
	} {
		if got := tc.n.DeriveState(); got != tc.want {
			t.Errorf("%s: DeriveState = %s, want %s", tc.name, got, tc.want)
		}
		if !tc.want.Valid() {
			t.Errorf("%s: %s is not Valid", tc.name, tc.want)
		}
	}
	if State("asleep").Valid() {
		t.Error(`"asleep" is Valid`)
	}
}
