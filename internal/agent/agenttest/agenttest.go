// Package agenttest gives tests of the agent a fake nvidia-smi whose
// answer they control, and a fake /proc/meminfo.
package agenttest

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

//go:embed nvidia-smi
var script []byte

// NvidiaSMI is a fake nvidia-smi in a directory of its own: put Dir on
// the agent's PATH.
type NvidiaSMI struct {
	t   testing.TB
	Dir string
}

// NewNvidiaSMI installs the fake in a new temporary directory; it answers
// with no output and status 0 until told otherwise.
func NewNvidiaSMI(t testing.TB) *NvidiaSMI {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	return &NvidiaSMI{t: t, Dir: dir}
}

// GPU is one line of the fake's answer.
type GPU struct {
	Index  int
	MiB    int64
	Driver string
	UUID   string // [N/A] when empty
	Name   string
}

// Line is the GPU as nvidia-smi's CSV query prints it.
func (g GPU) Line() string {
	uuid := g.UUID
	if uuid == "" {
		uuid = "[N/A]"
	}
	return fmt.Sprintf("%d, %d, %s, %s, %s", g.Index, g.MiB, g.Driver, uuid, g.Name)
}

// GPUs makes the fake report these GPUs (none: an empty answer).
func (f *NvidiaSMI) GPUs(gpus ...GPU) {
	f.t.Helper()
	var b strings.Builder
	for _, g := range gpus {
		b.WriteString(g.Line() + "\n")
	}
	f.Answer(b.String(), "", 0)
}

// Answer makes the fake print stdout and stderr and exit with status.
func (f *NvidiaSMI) Answer(stdout, stderr string, status int) {
	f.t.Helper()
	os.Remove(filepath.Join(f.Dir, "hang"))
	f.write("output", stdout)
	f.write("stderr", stderr)
	f.write("status", strconv.Itoa(status))
}

// Hang makes the fake never answer (a hung driver).
func (f *NvidiaSMI) Hang() { f.write("hang", "") }

// Remove takes the fake off its directory: the host has no nvidia-smi.
func (f *NvidiaSMI) Remove() {
	f.t.Helper()
	if err := os.Remove(filepath.Join(f.Dir, "nvidia-smi")); err != nil {
		f.t.Fatal(err)
	}
}

// Args is what the fake was last called with.
func (f *NvidiaSMI) Args() string {
	b, _ := os.ReadFile(filepath.Join(f.Dir, "args"))
	return strings.TrimSpace(string(b))
}

// write replaces a control file atomically, so a run of the fake sees
// the old content or the new, never half of it.
func (f *NvidiaSMI) write(name, content string) {
	f.t.Helper()
	tmp := filepath.Join(f.Dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.Dir, name)); err != nil {
		f.t.Fatal(err)
	}
}

// MemInfo writes a meminfo file saying the host has bytes of memory
// (rounded down to KiB) and returns its path.
func MemInfo(t testing.TB, bytes int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "meminfo")
	content := fmt.Sprintf("MemTotal:       %d kB\nMemFree:        1024 kB\nMemAvailable:   2048 kB\n", bytes>>10)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
