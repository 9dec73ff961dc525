package main

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
)

func TestProcsPlan(t *testing.T) {
	for _, tc := range []struct {
		name          string
		current, cpus int
		envSet, local bool
		want          int
	}{
		{"database on this machine", 2, 2, false, true, 4},
		{"database elsewhere", 2, 2, false, false, 2},
		{"GOMAXPROCS given", 2, 2, true, true, 2},
		{"GOMAXPROCS given, above the cores", 6, 2, true, true, 6},
		{"a container's CPU limit", 1, 4, false, true, 1},
		{"one core", 1, 1, false, true, 2},
	} {
		if got := procsPlan(tc.current, tc.cpus, tc.envSet, tc.local); got != tc.want {
			t.Errorf("%s: procsPlan(%d, %d, %v, %v) = %d, want %d", tc.name, tc.current, tc.cpus, tc.envSet, tc.local, got, tc.want)
		}
	}
}

func TestDatabaseIsLocal(t *testing.T) {
	for url, want := range map[string]bool{
		"": true,
		"postgres://u@/registry?host=/run/postgresql":   true,
		"host=/tmp dbname=registry":                     true,
		"postgres://u:pw@localhost:5432/registry":       true,
		"postgres://u@LOCALHOST/registry":               true,
		"postgres://u@127.0.0.1/registry":               true,
		"postgres://u@127.8.9.10:5433/registry":         true,
		"postgres://u@[::1]:5432/registry":              true,
		"postgres://u@[::ffff:127.0.0.1]:5432/registry": true,
		"postgres://u@db:5432/registry":                 false,
		"postgres://u@10.0.0.5/registry":                false,
		"postgres://u@[2001:db8::1]/registry":           false,
		"postgres://u@db.example.com,localhost/reg":     false, // the first host is the primary
		"postgres://u@%zz/registry":                     false, // unparsable: not claimed local
	} {
		if got := databaseIsLocal(url); got != want {
			t.Errorf("databaseIsLocal(%q) = %v, want %v", url, got, want)
		}
	}
}

// serve on the embedded default runs twice as many Ps as cores and says
// so; a GOMAXPROCS of the operator's is left alone.
func TestServeProcs(t *testing.T) {
	t.Parallel()
	if runtime.GOMAXPROCS(0) < runtime.NumCPU() {
		t.Skip("a CPU limit below the cores applies here: serve leaves GOMAXPROCS alone (TestProcsPlan)")
	}
	want := fmt.Sprintf("gomaxprocs=%d cores=%d", 2*runtime.NumCPU(), runtime.NumCPU())
	for _, tc := range []struct {
		name, procs string
		raised      bool
	}{{"default", "", true}, {"GOMAXPROCS set", "1", false}} {
		env := map[string]string{"REGISTRY_DATA_DIR": filepath.Join(pgtest.TempDir(t), "data"),
			"REGISTRY_LISTEN": "127.0.0.1:0"}
		if tc.procs != "" {
			env["GOMAXPROCS"] = tc.procs
		}
		p := startProcess(t, env, "serve")
		p.serving(t)
		logs := p.stderr.String()
		if got := strings.Contains(logs, want); got != tc.raised {
			t.Errorf("%s: %q in the log = %v, want %v; log:\n%s", tc.name, want, got, tc.raised, logs)
		}
		if err := p.stop(t); err != nil {
			t.Fatalf("%s: serve: %v", tc.name, err)
		}
	}
}
