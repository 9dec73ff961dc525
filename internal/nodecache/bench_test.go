package nodecache

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// sample is a node as the API registers one: every pointer field set.
func sample(pk int64) registry.Node {
	hw, gpu := int64(3), int64(80)<<30
	// Each string its own allocation, as a row scan makes them.
	owner, ext, state := strings.Clone("agent-gpu-0042"), strings.Clone("scp-host-000123"), strings.Clone("RUNNING")
	seen := time.Now().UTC()
	return registry.Node{PK: pk, IP: strings.Clone("10.12.34.56"), Index: int(pk % 8), CPUMem: 1 << 40,
		DriverVersion: strings.Clone("550.54.15"), HardwareGeneration: &hw, GPUMem: &gpu, LastSeen: &seen, Owner: &owner,
		Source: strings.Clone("scp"), Schedulable: true,
		State: registry.StateFree, ExternalID: &ext, ProviderState: &state, CreatedAt: seen, UpdatedAt: seen, Version: 3}
}

// BenchmarkMemory reports the heap a cached node takes (bytes/node) at
// 100,000 nodes, each with its own allocations as the store scans them.
func BenchmarkMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c := New(nil, Options{Size: n})
		c.mu.Lock()
		for pk := int64(1); pk <= n; pk++ {
			c.installLocked(sample(pk))
		}
		c.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/node")
		b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/n, "objects/node")
		runtime.KeepAlive(c)
	}
}

// BenchmarkHit is a read served from memory.
func BenchmarkHit(b *testing.B) {
	c := New(nil, Options{Size: 1000})
	c.Start(0)
	c.Listening(true)
	c.Sequenced(time.Now().Add(time.Hour), 0)
	for pk := int64(1); pk <= 1000; pk++ {
		c.mu.Lock()
		c.installLocked(sample(pk))
		c.mu.Unlock()
	}
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		pk := int64(0)
		for pb.Next() {
			pk = pk%1000 + 1
			if _, err := c.GetNode(ctx, pk); err != nil {
				b.Fatal(err)
			}
		}
	})
}
