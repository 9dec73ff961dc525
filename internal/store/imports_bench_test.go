package store_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// benchFleet is an inventory of hosts × 8 GPUs, as the syncer maps it. In
// variant "changed", every 200th host reports other GPU memory and every
// 200th host (another one) vanished: 1 % of the nodes change.
//
// Hosts come in fabrics of 500 with an SCP import's four labels, unless
// REGISTRYD_BENCH_TOPOLOGY=off (the fleet as imports saw it before nodes
// had a topology).
func benchFleet(nodes int, changed bool) []registry.ImportedNode {
	hosts := (nodes + 7) / 8
	out := make([]registry.ImportedNode, 0, nodes)
	topology := os.Getenv("REGISTRYD_BENCH_TOPOLOGY") != "off"
	labels := map[int]registry.Labels{}
	for h := range hosts {
		if changed && h%200 == 100 {
			continue
		}
		mem := int64(80) << 30
		if changed && h%200 == 0 {
			mem = 94 << 30
		}
		ext := fmt.Sprintf("host-%07d", h)
		ip := fmt.Sprintf("10.%d.%d.%d", h>>16, (h>>8)&0xff, h&0xff)
		var fabric string
		var l registry.Labels
		if topology {
			f := h / 500
			fabric = fmt.Sprintf("%032x", f)
			if _, ok := labels[f]; !ok {
				var err error
				labels[f], err = registry.MakeLabels(map[string]string{"scp.registryd.io/region": "kr-west1",
					"scp.registryd.io/node-pool": fmt.Sprintf("POOL%03d-krw1a", f/4), "scp.registryd.io/fabric-name": fmt.Sprintf("cluster%03d", f),
					"scp.registryd.io/server-type": "s8h100_metal"})
				if err != nil {
					panic(err)
				}
			}
			l = labels[f]
		}
		for i := 0; i < 8 && len(out) < nodes; i++ {
			out = append(out, registry.ImportedNode{ExternalID: ext, IP: ip, Index: i, CPUMem: 2 << 40,
				GPUMem: &mem, GPUModel: "H100", State: "RUNNING", Running: true, Fabric: fabric, Labels: l})
		}
	}
	return out
}

// benchNodes is REGISTRYD_BENCH_NODES, 100,000 by default.
func benchNodes(b *testing.B) int {
	n := 100_000
	if v := os.Getenv("REGISTRYD_BENCH_NODES"); v != "" {
		var err error
		if n, err = strconv.Atoi(strings.ReplaceAll(v, "_", "")); err != nil || n <= 0 {
			b.Fatalf("REGISTRYD_BENCH_NODES=%q: want a positive number", v)
		}
	}
	return n
}

// resetPeakRSS starts the process's peak resident set (VmHWM) afresh.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS reports the process's peak resident set (VmHWM) since
// resetPeakRSS, the benchmark's own inventory included.
func peakRSS(b *testing.B) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			b.ReportMetric(float64(kb)/1024, "MB-peak-RSS")
		}
	}
}

// BenchmarkApplyImport is the store's share of a sync pass over a fleet of
// REGISTRYD_BENCH_NODES nodes (hosts × 8 GPUs), without any provider:
// the first import into an empty registry (every node inserted, audited and
// on the change log), a pass that changes nothing, and a pass where 1 % of
// the nodes changed or vanished. Run it with -benchtime 1x at large N, and
// point TEST_DATABASE_URL at a durable server to measure commits as
// production pays them.
func BenchmarkApplyImport(b *testing.B) {
	ctx := context.Background()
	n := benchNodes(b)
	full := benchFleet(n, false)
	apply := func(b *testing.B, st *store.Store, inv []registry.ImportedNode) registry.ImportResult {
		b.Helper()
		res, err := st.ApplyImport(ctx, syncSCP, "scp", inv, nil)
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	b.Run("first", func(b *testing.B) {
		resetPeakRSS()
		for b.Loop() {
			b.StopTimer()
			st := pgtest.Open(b, pgtest.New(b), store.Options{})
			b.StartTimer()
			if res := apply(b, st, full); res.Added != n {
				b.Fatalf("added %d of %d: %+v", res.Added, n, res)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
		peakRSS(b)
	})
	b.Run("unchanged", func(b *testing.B) {
		st := pgtest.Open(b, pgtest.New(b), store.Options{})
		apply(b, st, full)
		runtime.GC()
		resetPeakRSS()
		for b.Loop() {
			if res := apply(b, st, full); res.Unchanged != n {
				b.Fatalf("unchanged %d of %d: %+v", res.Unchanged, n, res)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
		peakRSS(b)
	})
	b.Run("1pct", func(b *testing.B) {
		changed := benchFleet(n, true)
		resetPeakRSS()
		st := pgtest.Open(b, pgtest.New(b), store.Options{})
		for b.Loop() {
			b.StopTimer()
			apply(b, st, full)
			b.StartTimer()
			res := apply(b, st, changed)
			if res.Removed != n-len(changed) || res.Added != 0 || res.Updated+res.Removed+res.Unchanged != n {
				b.Fatalf("%+v", res)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
		peakRSS(b)
	})
}
