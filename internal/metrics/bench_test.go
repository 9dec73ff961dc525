package metrics_test

import (
	"testing"
	"time"

	"github.com/registryd/registryd/internal/metrics"
)

// BenchmarkHeartbeatRequest is what metrics add to one heartbeat request,
// from parallel requests: in flight up and down, the request counted and
// timed under its route, the heartbeat and its GetNode statement counted.
func BenchmarkHeartbeatRequest(b *testing.B) {
	m := metrics.New()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.RequestStarted()
			m.ObserveQuery("")
			m.HeartbeatRecorded()
			m.RequestDone("/v1/nodes/ping", "GET", 200, 300*time.Microsecond)
		}
	})
}
