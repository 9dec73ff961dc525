package registry

import "testing"

// Figures as nvidia-smi reports them (memory.total in MiB) against the
// size each GPU is sold with, which the imports store.
func TestNominalGPUMemory(t *testing.T) {
	for _, c := range []struct {
		name     string
		mib      int64
		wantGiB  int64
		comments string
	}{
		{"NVIDIA H100 80GB HBM3", 81559, 80, "size in the name"},
		{"NVIDIA A100-SXM4-40GB", 40960, 40, "reports exactly its size"},
		{"NVIDIA A100 80GB PCIe", 81920, 80, ""},
		{"Tesla V100-SXM2-16GB", 16160, 16, ""},
		{"NVIDIA H200", 143771, 141, "no size: rounded up"},
		{"NVIDIA B200", 183359, 180, "no size: rounded up"},
		{"NVIDIA GeForce RTX 4090", 24564, 24, ""},
		{"NVIDIA L40S", 46068, 48, "ECC kept back: known model"},
		{"NVIDIA A40", 46068, 48, ""},
		{"NVIDIA L4", 23034, 24, ""},
		{"NVIDIA A10", 23028, 24, "not A100"},
		{"Tesla T4", 15360, 16, ""},
		{"NVIDIA H100 80GB HBM3", 20096, 20, "a size the report contradicts (a partition): rounded up"},
		{"", 81559, 80, "no name: rounded up"},
		{"NVIDIA L4", 81559, 80, "a known model the report contradicts"},
	} {
		if got := NominalGPUMemory(c.name, c.mib<<20); got != c.wantGiB<<30 {
			t.Errorf("%q reporting %d MiB: %d GiB (%d bytes), want %d GiB (%s)", c.name, c.mib, got>>30, got, c.wantGiB, c.comments)
		}
	}
	if got := NominalGPUMemory("NVIDIA H100 80GB HBM3", 0); got != 0 {
		t.Errorf("0 bytes: %d", got)
	}
}
