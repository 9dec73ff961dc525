package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

func numCPU() int { return runtime.NumCPU() }

// Machine describes where the numbers were measured.
type Machine struct {
	CPU        string            `json:"cpu"`
	Cores      int               `json:"cores"`
	MemoryMB   int64             `json:"memory_mb"`
	OS         string            `json:"os"`
	Kernel     string            `json:"kernel"`
	Go         string            `json:"go"`
	PostgreSQL string            `json:"postgresql"`
	Pgbench    string            `json:"pgbench,omitempty"`
	Settings   map[string]string `json:"postgresql_settings"` // durability and memory
	LoadAvg    string            `json:"loadavg_at_start"`    // others' work on a shared machine shows here
}

// durabilitySettings are the PostgreSQL settings a reader of the numbers
// needs: whether commits wait for the disk, and how much memory it has.
var durabilitySettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_connections"}

func describeMachine(ctx context.Context, pool *pgxpool.Pool, pgbench string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Settings: map[string]string{}}
	m.CPU = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0], 10, 64); err == nil {
		m.MemoryMB = kb / 1024
	}
	m.OS = strings.Trim(procField("/etc/os-release", "PRETTY_NAME"), `"`)
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if pool != nil {
		_ = pool.QueryRow(ctx, `SELECT version()`).Scan(&m.PostgreSQL)
		if short, _, ok := strings.Cut(m.PostgreSQL, " on "); ok {
			m.PostgreSQL = short
		}
		for _, s := range durabilitySettings {
			var v string
			if pool.QueryRow(ctx, `SELECT current_setting($1)`, s).Scan(&v) == nil {
				m.Settings[s] = v
			}
		}
	}
	if pgbench != "" {
		if out, err := exec.CommandContext(ctx, pgbench, "--version").Output(); err == nil {
			m.Pgbench = strings.TrimSpace(string(out))
		}
	}
	return m
}

// procField returns the value of the first "name: value" (or name=value)
// line of a /proc- or /etc-style file.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			k, v, ok = strings.Cut(line, "=")
		}
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// resetPeakRSS restarts pid's VmHWM at its current RSS (writing 5 to
// clear_refs, Linux ≥ 4.0), so the next peakRSS is the peak since now.
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// peakRSS is pid's VmHWM in bytes.
func peakRSS(pid int) int64 {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM")
}

// pss is the proportional set size of pid and its children in bytes: the
// shared buffers every PostgreSQL process maps are counted once in all,
// not once per process.
func pss(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	total := kbField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			total += kbField(d+"/smaps_rollup", "Pss")
		}
	}
	return total
}

func kbField(path, name string) int64 {
	v := strings.Fields(procField(path, name))
	if len(v) == 0 {
		return 0
	}
	kb, _ := strconv.ParseInt(v[0], 10, 64)
	return kb * 1024
}
