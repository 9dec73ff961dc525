package api

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParseObject measures the body decoder on a typical body and on
// 1 MiB bodies built to be expensive. Run with
// go test -run='^$' -bench=ParseObject -benchmem ./internal/api/
func BenchmarkParseObject(b *testing.B) {
	var keys bytes.Buffer
	keys.WriteByte('{')
	for i := 0; keys.Len() < MaxBodyBytes-16; i++ {
		if i > 0 {
			keys.WriteByte(',')
		}
		fmt.Fprintf(&keys, `"k%07d":0`, i)
	}
	keys.WriteByte('}')
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"node", []byte(`{"ip":"10.0.0.7","index":0,"cpu_mem":2199023255552,"driver_version":"550.54.15","hardware_generation":1,"gpu_mem":85899345920}`)},
		{"unknown-keys-1MiB", keys.Bytes()},
		{"long-string-1MiB", []byte(`{"ip":"` + strings.Repeat("a", MaxBodyBytes-10) + `"}`)},
		{"long-utf8-string-1MiB", []byte(`{"ip":"` + strings.Repeat("é", (MaxBodyBytes-10)/2) + `"}`)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = parseObject(bc.body)
			}
		})
	}
}
