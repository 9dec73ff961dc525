package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/registryd/registryd/internal/agent/agenttest"
)

func TestParseNvidiaSMI(t *testing.T) {
	t.Parallel()
	mib := func(n int64) *int64 { v := n << 20; return &v }
	for _, tc := range []struct {
		name string
		out  string
		want []GPU
		err  string
	}{
		{name: "two GPUs", out: "0, 81559, 550.54.15, GPU-a0, NVIDIA H100 80GB HBM3\n1, 81559, 550.54.15, GPU-a1, NVIDIA H100 80GB HBM3\n",
			want: []GPU{{0, mib(80 << 10), "550.54.15", "GPU-a0", "NVIDIA H100 80GB HBM3"}, {1, mib(80 << 10), "550.54.15", "GPU-a1", "NVIDIA H100 80GB HBM3"}}},
		{name: "white space, CRLF, blank lines, out of order", out: "\r\n  1 ,40960,535.104.05 , GPU-b1 ,  NVIDIA A100-SXM4-40GB  \r\n\n0,40960,535.104.05,GPU-b0,NVIDIA A100-SXM4-40GB\r\n",
			want: []GPU{{0, mib(40960), "535.104.05", "GPU-b0", "NVIDIA A100-SXM4-40GB"}, {1, mib(40960), "535.104.05", "GPU-b1", "NVIDIA A100-SXM4-40GB"}}},
		{name: "not available", out: "0, [N/A], [N/A], [N/A], [N/A]\n1, [Not Supported], N/A, [N/A], NVIDIA GH200 480GB\n",
			want: []GPU{{Index: 0}, {Index: 1, Name: "NVIDIA GH200 480GB"}}},
		{name: "a driver per GPU", out: "0, 24576, 550.54.15, GPU-c0, NVIDIA L4\n1, 24576, 560.28.03, GPU-c1, NVIDIA L4\n",
			want: []GPU{{0, mib(24576), "550.54.15", "GPU-c0", "NVIDIA L4"}, {1, mib(24576), "560.28.03", "GPU-c1", "NVIDIA L4"}}},
		{name: "a comma in the name", out: "0, 1024, 1.0, GPU-d, Odd, GPU\n", want: []GPU{{0, mib(1024), "1.0", "GPU-d", "Odd, GPU"}}},
		{name: "empty", out: "", want: nil},
		{name: "too few fields", out: "0, 81559, 550.54.15, NVIDIA H100\n", err: "line 1: want 5 comma-separated fields"},
		{name: "index not a number", out: "0, 1, 1, U, A\nGPU-1, 1, 1, U, A\n", err: `line 2: index "GPU-1" is not a GPU index`},
		{name: "index not available", out: "[N/A], 1, 1, U, A\n", err: `index "[N/A]"`},
		{name: "negative index", out: "-1, 1, 1, U, A\n", err: `index "-1"`},
		{name: "index twice", out: "0, 1, 1, U, A\n0, 1, 1, U, A\n", err: "line 2: GPU index 0 is listed twice"},
		{name: "memory not a number", out: "0, 80 GiB, 1, U, A\n", err: `memory.total "80 GiB"`},
		{name: "negative memory", out: "0, -1, 1, U, A\n", err: `memory.total "-1"`},
		{name: "memory beyond int64 bytes", out: "0, 8796093022208, 1, U, A\n", err: "memory.total"},
		{name: "control character in driver", out: "0, 1, 5\x01, U, A\n", err: "driver_version"},
		{name: "driver too long", out: "0, 1, " + strings.Repeat("9", 129) + ", U, A\n", err: "driver_version"},
		{name: "control character in uuid", out: "0, 1, 1, GPU-\x02, A\n", err: "uuid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseNvidiaSMI([]byte(tc.out))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiscoverGPUs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	smi := agenttest.NewNvidiaSMI(t)

	smi.GPUs(agenttest.GPU{Index: 0, MiB: 81559, Driver: "550.54.15", Name: "NVIDIA H100 80GB HBM3"})
	gpus, err := DiscoverGPUs(ctx, smi.Dir, 10*time.Second)
	if err != nil || len(gpus) != 1 || *gpus[0].Memory != 80<<30 {
		t.Fatalf("%+v %v", gpus, err)
	}

	// A failing nvidia-smi names itself and what it said.
	smi.Answer("", "Failed to initialize NVML: Driver/library version mismatch\n", 18)
	_, err = DiscoverGPUs(ctx, smi.Dir, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "Driver/library version mismatch") || !strings.Contains(err.Error(), "exit status 18") {
		t.Errorf("failing nvidia-smi: %v", err)
	}
	// So does one that prints what the agent cannot read.
	smi.Answer("Unknown option\n", "", 0)
	if _, err = DiscoverGPUs(ctx, smi.Dir, 10*time.Second); err == nil || !strings.Contains(err.Error(), "nvidia-smi: line 1") {
		t.Errorf("unreadable answer: %v", err)
	}
	// An answer beyond the bound is refused, not read into memory.
	smi.Answer(strings.Repeat("0, 1, 1, U, A\n", maxNvidiaSMIOutput/10), "", 0)
	if _, err = DiscoverGPUs(ctx, smi.Dir, 10*time.Second); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("huge answer: %v", err)
	}

	// Not on PATH; relative PATH entries and non-executables do not count.
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "nvidia-smi"), []byte("#!/bin/sh\n"), 0o644)
	for _, path := range []string{"", empty, "relative/dir", t.TempDir() + string(filepath.ListSeparator) + empty} {
		if _, err := DiscoverGPUs(ctx, path, 10*time.Second); !errors.Is(err, errNoNvidiaSMI) {
			t.Errorf("PATH %q: %v", path, err)
		}
	}
	// The first directory of PATH that has it wins.
	if _, err := DiscoverGPUs(ctx, empty+string(filepath.ListSeparator)+smi.Dir, 10*time.Second); errors.Is(err, errNoNvidiaSMI) {
		t.Errorf("not found further down PATH: %v", err)
	}
}

func TestHostMemory(t *testing.T) {
	t.Parallel()
	n, err := HostMemory(agenttest.MemInfo(t, 64<<30))
	if err != nil || n != 64<<30 {
		t.Fatalf("%d %v", n, err)
	}
	// The real one, where there is one.
	if _, err := os.Stat("/proc/meminfo"); err == nil {
		if n, err := HostMemory("/proc/meminfo"); err != nil || n <= 0 {
			t.Errorf("/proc/meminfo: %d %v", n, err)
		}
	}
	dir := t.TempDir()
	for content, want := range map[string]string{
		"MemFree: 1 kB\n":                    "no MemTotal line",
		"MemTotal: 1 MB\n":                   `is not "MemTotal: N kB"`,
		"MemTotal: lots kB\n":                "not a number of kB",
		"MemTotal: -5 kB\n":                  "not a number of kB",
		"MemTotal: 1 2 kB\n":                 "is not",
		"MemTotal: 9999999999999999999 kB\n": "not a number",
	} {
		p := filepath.Join(dir, "meminfo")
		os.WriteFile(p, []byte(content), 0o644)
		if _, err := HostMemory(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", content, err, want)
		}
	}
	if _, err := HostMemory(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file read")
	}
}

func TestHardwareNames(t *testing.T) {
	t.Parallel()
	for product, want := range map[string][]string{
		"NVIDIA H100 80GB HBM3":   {"NVIDIA H100 80GB HBM3", "H100 80GB HBM3", "H100"},
		"NVIDIA A100-SXM4-80GB":   {"NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "A100"},
		"Tesla V100-SXM2-32GB":    {"Tesla V100-SXM2-32GB", "V100"},
		"NVIDIA L4":               {"NVIDIA L4", "L4"},
		"NVIDIA GeForce RTX 4090": {"NVIDIA GeForce RTX 4090", "GeForce RTX 4090"},
		"NVIDIA RTX A6000":        {"NVIDIA RTX A6000", "RTX A6000"},
		"B200":                    {"B200"},
		"  NVIDIA   H200  ":       {"NVIDIA H200", "H200"},
		"":                        nil,
	} {
		if diff := cmp.Diff(want, hardwareNames(product)); diff != "" {
			t.Errorf("%q (-want +got):\n%s", product, diff)
		}
	}
}
