package api

import (
	"testing"

	"github.com/registryd/registryd/internal/registry"
)

// FuzzDecodeNode feeds arbitrary bodies through the create decoder. It must
// never panic, and whatever it accepts must be a valid node.
func FuzzDecodeNode(f *testing.F) {
	for _, seed := range []string{
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`,
		`{"ip":"2001:DB8::1","index":7,"cpu_mem":9223372036854775807,"driver_version":"","hardware_generation":3,"gpu_mem":0}`,
		`{"ip":1,"index":1.0,"cpu_mem":1e3,"driver_version":null}`,
		`{"a":1,"a":2}`, `[]`, `{`, `null`, `{"index":-0}`, `{"cpu_mem":-9223372036854775809}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		obj, err := parseObject(body)
		if err != nil {
			return
		}
		fl := newFields(obj)
		p := readNodePatch(fl)
		fl.require(nodeWritable...)
		spec := p.Apply(registry.NodeSpec{})
		fl.check(spec.Normalize())
		if fl.err() != nil {
			return
		}
		if spec.Index < 0 || spec.CPUMem < 0 || (spec.GPUMem != nil && *spec.GPUMem < 0) {
			t.Fatalf("accepted an invalid node: %+v", spec)
		}
		if ip, err := registry.CanonicalIP(spec.IP); err != nil || ip != spec.IP {
			t.Fatalf("accepted a non-canonical ip %q", spec.IP)
		}
	})
}
