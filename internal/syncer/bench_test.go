package syncer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkImport10kHosts is one SCP pass importing 10,000 hosts × 8 GPUs
// (80,000 nodes) from the fake server into an empty registry: every page
// fetched and signed, then one transaction of batch inserts, audit entries
// and change-log rows. Goal: ≤ 10 s on 2 cores. The second sub-benchmark is
// the steady state: the same inventory again, nothing to write.
func BenchmarkImport10kHosts(b *testing.B) {
	fake := scptest.New(b)
	fake.Products = []scptest.Product{{ID: "p", Name: "s8h100_metal", Description: "CPU 96 | Memory 2048GB | H100(80GB)*8 | Disk 960GB",
		GPUModel: "H100", MemoryValue: "2048", CPUValue: "96"}}
	for i := range 10_000 {
		fake.Nodes = append(fake.Nodes, scptest.Node{ID: fmt.Sprintf("n%05d", i), Name: fmt.Sprintf("gpu-%05d", i),
			PolicyIP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256), ServerType: "s8h100_metal", State: "RUNNING"})
	}
	client, err := scp.New(scp.Config{Endpoint: fake.URL, AccessKey: scptest.AccessKey, SecretKey: scptest.SecretKey,
		AccountID: scptest.AccountID, PageSize: 500})
	if err != nil {
		b.Fatal(err)
	}
	open := func() *store.Store { return pgtest.Open(b, pgtest.New(b), store.Options{}) }
	b.Run("first pass", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			s := newSyncer(b, open(), client)
			b.StartTimer()
			sums, err := s.RunOnce(context.Background())
			if err != nil || sums[0].Result.Added != 80_000 {
				b.Fatalf("%v %v", err, sums)
			}
		}
	})
	b.Run("unchanged pass", func(b *testing.B) {
		s := newSyncer(b, open(), client)
		if _, err := s.RunOnce(context.Background()); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			sums, err := s.RunOnce(context.Background())
			if err != nil || sums[0].Result.Unchanged != 80_000 {
				b.Fatalf("%v %v", err, sums)
			}
		}
	})
}
