package registry

import (
	"strconv"
	"strings"
)

// gib is 2^30 bytes, the unit of GPU memory as vendors and providers name
// it ("80GB" is 80 × 2^30 bytes here, as the imports store it).
const gib = int64(1) << 30

// sizelessModels are GPU models whose names carry no memory size and
// whose drivers report noticeably less than they are sold with (memory
// kept back for ECC): their size in GiB, by the name's word.
var sizelessModels = map[string]int64{
	"L40S": 48, "L40": 48, "A40": 48, "L4": 24, "A10": 24, "A10G": 24, "T4": 16,
}

// NominalGPUMemory is the one memory figure of a GPU, whichever way it
// reached the registry: the size it is sold with, in whole GiB, as the
// cloud imports store it. What a driver reports is a little less (an
// H100 80GB HBM3 reports 81,559 MiB, 79.6 GiB) and differs by driver and
// ECC setting; a filter on gpu_mem must find an agent's H100 and an
// imported one alike. reported is the driver's figure in bytes, name the
// model's name as nvidia-smi gives it ("" when unknown). In order:
//
//   - a size in the name ("NVIDIA H100 80GB HBM3", "A100-SXM4-40GB"), when
//     it is at least the reported figure and at most a tenth above it;
//   - a model known to report less than its size (L40S, L40, A40, L4, A10,
//     A10G, T4), likewise;
//   - otherwise the reported figure rounded up to a whole GiB.
//
// A size that disagrees with the report (a name that lies, a partition of
// the GPU) gives way to the report, rounded up.
func NominalGPUMemory(name string, reported int64) int64 {
	if reported <= 0 {
		return reported
	}
	plausible := func(size int64) bool {
		return size > 0 && size <= 1<<20 && size*gib >= reported && size*gib <= reported+reported/10
	}
	for word := range strings.FieldsFuncSeq(strings.ToUpper(name), func(r rune) bool { return r == ' ' || r == '-' || r == '_' || r == ',' }) {
		if n, ok := strings.CutSuffix(word, "GB"); ok {
			if size, err := strconv.ParseInt(n, 10, 64); err == nil && plausible(size) {
				return size * gib
			}
		}
		if size, ok := sizelessModels[word]; ok && plausible(size) {
			return size * gib
		}
	}
	return (reported + gib - 1) / gib * gib
}
