package registry

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

// awkward strings: everything encoding/json escapes or replaces.
var awkward = []string{
	"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "tab\tnew\nline\rcr\b\f",
	"\x00\x01\x1f\x7f", "é ü 日本 🚀", "\u2028\u2029", "bad \xff\xfe utf8", "\xe2\x80", "a\u00a0b",
}

func randomNode(r *rand.Rand) Node {
	str := func() string { return awkward[r.IntN(len(awkward))] }
	strp := func() *string {
		if r.IntN(3) == 0 {
			return nil
		}
		s := str()
		return &s
	}
	intp := func() *int64 {
		if r.IntN(3) == 0 {
			return nil
		}
		v := r.Int64() - r.Int64()
		return &v
	}
	tm := func() time.Time {
		t := time.Unix(r.Int64N(4e9), r.Int64N(1e9)*int64(r.IntN(2))).UTC()
		if r.IntN(4) == 0 {
			t = t.In(time.FixedZone("x", 3600*r.IntN(12)))
		}
		return t
	}
	timep := func() *time.Time {
		if r.IntN(3) == 0 {
			return nil
		}
		t := tm()
		return &t
	}
	return Node{
		PK: r.Int64(), IP: str(), Index: r.IntN(1 << 20), CPUMem: r.Int64(), DriverVersion: str(),
		HardwareGeneration: intp(), GPUMem: intp(), LastSeen: timep(), CurrentJob: intp(),
		LeaseExpiresAt: timep(), Owner: strp(), Source: str(), Schedulable: r.IntN(2) == 0,
		State: State(str()), CordonReason: strp(), Lost: r.IntN(2) == 0, ExternalID: strp(),
		ProviderState: strp(), CreatedAt: tm(), UpdatedAt: tm(), Version: r.Int64(),
		GPUModel: strp(), GPUUUID: strp(), Fabric: strp(), Labels: labelSets[r.IntN(len(labelSets))],
	}
}

var labelSets = func() []Labels {
	var sets []Labels
	for _, m := range []map[string]string{nil, {"a": ""}, {"team": "ml", "scp.registryd.io/region": "kr-west1", "z.y/x": "A-1_b.2"}} {
		l, err := MakeLabels(m)
		if err != nil {
			panic(err)
		}
		sets = append(sets, l)
	}
	return sets
}()

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		n := randomNode(r)
		want, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("node %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func FuzzAppendJSON(f *testing.F) {
	for _, s := range awkward {
		f.Add(s, int64(7))
	}
	f.Fuzz(func(t *testing.T, s string, v int64) {
		n := Node{PK: v, IP: s, DriverVersion: s, Owner: &s, CordonReason: &s, Source: s, State: State(s), GPUMem: &v}
		want, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkNodeJSON(b *testing.B) {
	n := randomNode(rand.New(rand.NewPCG(3, 4)))
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf = n.AppendJSON(buf[:0])
		}
	})
}
