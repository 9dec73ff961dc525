package heartbeat_test

import (
	"testing"

	"github.com/registryd/registryd/internal/heartbeat"
	"github.com/registryd/registryd/internal/metrics"
)

// BenchmarkRecord is the cost a heartbeat adds to its request: noting the
// node in memory, from parallel requests; with and without metrics.
func BenchmarkRecord(b *testing.B) {
	for _, bc := range []struct {
		name     string
		observer heartbeat.Observer
	}{{"plain", nil}, {"metrics", metrics.New()}} {
		b.Run(bc.name, func(b *testing.B) {
			r := heartbeat.New(nil, heartbeat.Options{Observer: bc.observer})
			b.RunParallel(func(pb *testing.PB) {
				var pk int64
				for pb.Next() {
					pk = (pk + 1) % 10_000
					r.Record(pk)
				}
			})
		})
	}
}
