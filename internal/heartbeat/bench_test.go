package heartbeat_test

import (
	"testing"

	"github.com/registryd/registryd/internal/heartbeat"
)

// BenchmarkRecord is the cost a heartbeat adds to its request: noting the
// node in memory, from parallel requests.
func BenchmarkRecord(b *testing.B) {
	r := heartbeat.New(nil, heartbeat.Options{})
	b.RunParallel(func(pb *testing.PB) {
		var pk int64
		for pb.Next() {
			pk = (pk + 1) % 10_000
			r.Record(pk)
		}
	})
}
