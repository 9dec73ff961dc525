package syncer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
	"github.com/registryd/registryd/internal/store"
	"github.com/registryd/registryd/internal/syncer"
)

// BenchmarkSyncPass is one SCP pass of a fleet of REGISTRYD_BENCH_NODES
// nodes (100,000 by default), hosts × 8 GPUs, from the fake server: every
// page fetched and signed, then the store's one transaction. "fetch" is
// the provider's share alone (the fake serving and our client fetching,
// verifying and decoding every page, both in this process); the store's
// share is the difference, or BenchmarkApplyImport in internal/store.
// "first pass" imports into an empty registry, "unchanged pass" is the
// steady state: the same inventory again, nothing to write.
func BenchmarkSyncPass(b *testing.B) {
	nodes := 100_000
	if v := os.Getenv("REGISTRYD_BENCH_NODES"); v != "" {
		var err error
		if nodes, err = strconv.Atoi(strings.ReplaceAll(v, "_", "")); err != nil || nodes < 8 {
			b.Fatalf("REGISTRYD_BENCH_NODES=%q: want a number of at least 8", v)
		}
	}
	hosts := nodes / 8
	nodes = hosts * 8
	fake := scptest.New(b)
	fake.Products = []scptest.Product{{ID: "p", Name: "s8h100_metal", Description: "CPU 96 | Memory 2048GB | H100(80GB)*8 | Disk 960GB",
		GPUModel: "H100", MemoryValue: "2048", CPUValue: "96"}}
	for i := range hosts {
		fake.Nodes = append(fake.Nodes, scptest.Node{ID: fmt.Sprintf("n%07d", i), Name: fmt.Sprintf("gpu-%07d", i),
			PolicyIP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256), ServerType: "s8h100_metal", State: "RUNNING"})
	}
	client, err := scp.New(scp.Config{Endpoint: fake.URL, AccessKey: scptest.AccessKey, SecretKey: scptest.SecretKey,
		AccountID: scptest.AccountID, PageSize: 500})
	if err != nil {
		b.Fatal(err)
	}
	open := func() *store.Store { return pgtest.Open(b, pgtest.New(b), store.Options{}) }
	b.Run("fetch", func(b *testing.B) {
		for b.Loop() {
			inv, err := client.Fetch(context.Background())
			if err != nil || len(inv.Hosts) != hosts {
				b.Fatalf("%v: %d hosts", err, len(inv.Hosts))
			}
			if got, _ := syncer.Nodes(inv); len(got) != nodes {
				b.Fatalf("%d nodes", len(got))
			}
		}
	})
	b.Run("first pass", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			s := newSyncer(b, open(), client)
			b.StartTimer()
			sums, err := s.RunOnce(context.Background())
			if err != nil || sums[0].Result.Added != nodes {
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
			if err != nil || sums[0].Result.Unchanged != nodes {
				b.Fatalf("%v %v", err, sums)
			}
		}
	})
}
