package pglocal

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procStat is what we need of /proc/PID/stat.
type procStat struct {
	comm  string
	state byte
	start uint64 // clock ticks after boot; with the pid it names one process
}

// readProcStat parses /proc/PID/stat. The command name is in parentheses
// and may itself hold spaces and parentheses, so fields are counted from
// the last ')'.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("pglocal: /proc/%d/stat: unexpected format", pid)
	}
	// After the name: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime priority nice
	// num_threads itrealvalue starttime ...
	f := strings.Fields(s[end+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("pglocal: /proc/%d/stat: unexpected format", pid)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("pglocal: /proc/%d/stat: %w", pid, err)
	}
	return procStat{comm: s[open+1 : end], state: f[0][0], start: start}, nil
}

// serverProcesses lists the live postgres processes working on dataDir:
// a postmaster and its children. Each child leads a process group (and
// session) of its own, since postgres calls setsid in every one, and a
// killed postmaster's children are reparented; what they all keep is their
// working directory, the data directory. Zombies are left out: they hold no
// shared memory and are their parent's to reap. Only processes named
// postgres count, so nothing else that happens to work there is touched.
func serverProcesses(dataDir string) []int {
	want, err := os.Stat(dataDir)
	if err != nil {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.state == 'Z' || (st.comm != "postgres" && st.comm != "postmaster") {
			continue
		}
		if cwd, err := os.Stat(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && os.SameFile(cwd, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killServer SIGKILLs every postgres process still working on dataDir and
// waits, up to limit, until none is left.
func killServer(dataDir string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		pids := serverProcesses(dataDir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pglocal: postgres processes %v on %s survive SIGKILL", pids, dataDir)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
