package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/registryd/registryd/internal/registry"
)

// GPU is one GPU as nvidia-smi reports it.
type GPU struct {
	Index int
	// Memory is the GPU's memory in bytes as it is sold, the figure the
	// cloud imports store (registry.NominalGPUMemory of what nvidia-smi
	// reports: 80 GiB for an H100 80GB HBM3 reporting 81,559 MiB); nil
	// when nvidia-smi reports it as not available ([N/A]).
	Memory *int64
	// DriverVersion is the driver nvidia-smi reports for this GPU; "" when
	// not available.
	DriverVersion string
	// UUID is the GPU's own id (GPU-…); "" when not available.
	UUID string
	// Name is the GPU's product name (e.g. "NVIDIA H100 80GB HBM3"); ""
	// when not available.
	Name string
}

// nvidiaSMIArgs is the query the agent runs: one CSV line per GPU, without
// header or units, memory in MiB.
// The name comes last: it is the one field that may hold a comma.
var nvidiaSMIArgs = []string{"--query-gpu=index,memory.total,driver_version,uuid,name", "--format=csv,noheader,nounits"}

// nvidia-smi's exit status when it finds no GPU ("No devices were found").
const nvidiaSMINoDevices = 6

// maxNvidiaSMIOutput bounds what the agent reads of nvidia-smi's output: a
// line is well under 200 bytes, and a host has at most a few dozen GPUs.
const maxNvidiaSMIOutput = 1 << 20

// errNoNvidiaSMI means nvidia-smi is not on PATH: the host has no NVIDIA
// driver, and is a CPU-only host.
var errNoNvidiaSMI = errors.New("nvidia-smi is not on PATH")

// lookPath finds an executable named file in the directories of path (a
// PATH value), as a shell would. It takes PATH as a value, not from the
// process environment, so that the agent's settings come from one place.
func lookPath(path, file string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			// A relative PATH entry would make what runs depend on the
			// working directory; a shell would use it, the agent does not.
			continue
		}
		p := filepath.Join(dir, file)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errNoNvidiaSMI
}

// DiscoverGPUs runs nvidia-smi (found on path, a PATH value) and returns
// the host's GPUs, ordered by index. A host without nvidia-smi has no GPUs
// (errNoNvidiaSMI tells the caller so, for its log); nvidia-smi that finds
// no device (exit status 6) also means no GPUs. Any other failure of an
// existing nvidia-smi is an error: the driver is installed but broken, and
// the host must not pass for CPU-only. timeout bounds the run, since
// nvidia-smi hangs when the driver does.
func DiscoverGPUs(ctx context.Context, path string, timeout time.Duration) ([]GPU, error) {
	bin, err := lookPath(path, "nvidia-smi")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, nvidiaSMIArgs...)
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxNvidiaSMIOutput, 4<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	if stdout.overflow {
		return nil, fmt.Errorf("%s printed more than %d bytes", bin, maxNvidiaSMIOutput)
	}
	if runErr != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%s did not answer within %s (a hung driver?)", bin, timeout)
		}
		var exit *exec.ExitError
		if errors.As(runErr, &exit) && (exit.ExitCode() == nvidiaSMINoDevices || noDevices(stdout.Bytes()) || noDevices(stderr.Bytes())) {
			return nil, nil
		}
		return nil, fmt.Errorf("%s failed (%v): %s", bin, runErr, firstLine(stderr.Bytes(), stdout.Bytes()))
	}
	if noDevices(stdout.Bytes()) {
		return nil, nil
	}
	gpus, err := ParseNvidiaSMI(stdout.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return gpus, nil
}

func noDevices(out []byte) bool { return bytes.Contains(out, []byte("No devices were found")) }

// firstLine is the first non-blank line of the first output that has one,
// trimmed and cut to a length a log line can hold.
func firstLine(outs ...[]byte) string {
	for _, out := range outs {
		for _, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				if len(l) > 300 {
					l = l[:300] + "…"
				}
				return strconv.Quote(l)
			}
		}
	}
	return "no output"
}

// notAvailable reports whether nvidia-smi printed a value as missing:
// "[N/A]" in CSV mode, "N/A" in some versions, "[Not Supported]" for
// fields a GPU lacks.
func notAvailable(v string) bool {
	switch v {
	case "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]":
		return true
	}
	return false
}

// ParseNvidiaSMI reads the output of
//
//	nvidia-smi --query-gpu=index,memory.total,driver_version,name --format=csv,noheader,nounits
//
// one GPU a line: "0, 81559, 550.54.15, NVIDIA H100 80GB HBM3". Memory is
// in MiB and returned in bytes, as the GPU is sold (GPU.Memory). Values reported as not available ([N/A])
// become nil memory or an empty driver version or name; an index must be
// there. Blank lines are skipped, fields trimmed; the name, the last
// field, may itself contain commas. A line it cannot read, or an index
// seen twice, is an error naming the line: better no inventory than a
// wrong one, from which the agent would delete nodes.
func ParseNvidiaSMI(out []byte) ([]GPU, error) {
	var gpus []GPU
	seen := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), maxNvidiaSMIOutput)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		fields := strings.SplitN(line, ",", 5)
		if len(fields) != 5 {
			return nil, fmt.Errorf("line %d: want 5 comma-separated fields (index, memory.total, driver_version, uuid, name), got %d: %s", n, len(fields), firstLine([]byte(line)))
		}
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		idx, err := strconv.Atoi(fields[0])
		if err != nil || idx < 0 || idx > registry.MaxIndex {
			return nil, fmt.Errorf("line %d: index %s is not a GPU index", n, strconv.Quote(fields[0]))
		}
		if seen[idx] {
			return nil, fmt.Errorf("line %d: GPU index %d is listed twice", n, idx)
		}
		seen[idx] = true
		g := GPU{Index: idx}
		if !notAvailable(fields[1]) {
			mib, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || mib < 0 || mib > math.MaxInt64>>20 {
				return nil, fmt.Errorf("line %d: memory.total %s is not a number of MiB", n, strconv.Quote(fields[1]))
			}
			b := mib << 20
			g.Memory = &b
		}
		if !notAvailable(fields[2]) {
			if !printable(fields[2]) || len(fields[2]) > registry.MaxDriverVersion {
				return nil, fmt.Errorf("line %d: driver_version %s is not a driver version", n, strconv.Quote(fields[2]))
			}
			g.DriverVersion = fields[2]
		}
		if !notAvailable(fields[3]) {
			if !printable(fields[3]) || len(fields[3]) > registry.MaxGPUUUID {
				return nil, fmt.Errorf("line %d: uuid %s is not a GPU's id", n, strconv.Quote(fields[3]))
			}
			g.UUID = fields[3]
		}
		if !notAvailable(fields[4]) && printable(fields[4]) {
			g.Name = fields[4]
		}
		if g.Memory != nil {
			nominal := registry.NominalGPUMemory(g.Name, *g.Memory)
			g.Memory = &nominal
		}
		gpus = append(gpus, g)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	return gpus, nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

// limitedBuffer keeps at most max bytes of what is written to it and
// notes whether more came. The buffer is a field, not embedded: an
// embedded bytes.Buffer's ReadFrom would let io.Copy (which exec uses)
// pass Write and its bound by.
type limitedBuffer struct {
	buf      bytes.Buffer
	max      int
	overflow bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.overflow = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte { return b.buf.Bytes() }

// HostMemory reads the host's total memory in bytes from a meminfo file
// (/proc/meminfo): its MemTotal line, in kB (KiB).
func HostMemory(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("host memory: %s: MemTotal line %s is not \"MemTotal: N kB\"", path, strconv.Quote(sc.Text()))
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64>>10 {
			return 0, fmt.Errorf("host memory: %s: MemTotal %s is not a number of kB", path, strconv.Quote(fields[0]))
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("host memory: %s: %w", path, err)
	}
	return 0, fmt.Errorf("host memory: %s has no MemTotal line", path)
}
