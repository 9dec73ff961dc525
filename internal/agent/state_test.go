package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStateRoundTrip(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "made", "here")
	path := filepath.Join(dir, "state.json")
	want := map[Key]int64{{IP: "10.0.0.7", Index: 0}: 17, {IP: "10.0.0.7", Index: 1}: 18, {IP: "2001:db8::7", Index: 0}: 3}
	if err := saveState(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Owner-only: the file 0600, the directory it made 0700.
	for p, mode := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, mode)
		}
	}
	// Replaced whole: no temporary file is left beside it.
	if err := saveState(path, map[Key]int64{}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %v", entries)
	}
	if got, err := loadState(path); err != nil || len(got) != 0 {
		t.Errorf("empty state: %v %v", got, err)
	}
	// A missing file is an empty state, not an error.
	if got, err := loadState(filepath.Join(dir, "none.json")); err != nil || len(got) != 0 {
		t.Errorf("missing file: %v %v", got, err)
	}
}

func TestStateRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"garbage":   "\x00\x01",
		"two":       `{"version":1,"nodes":[]}{"version":1,"nodes":[]}`,
		"bad ip":    `{"version":1,"nodes":[{"ip":"10.0.0.300","index":0,"pk":1}]}`,
		"bad index": `{"version":1,"nodes":[{"ip":"10.0.0.7","index":-1,"pk":1}]}`,
		"zero pk":   `{"version":1,"nodes":[{"ip":"10.0.0.7","index":0,"pk":0}]}`,
		"too large": `{"version":1,"nodes":[` + strings.Repeat(`{"ip":"10.0.0.7","index":0,"pk":1},`, maxStateFile/30) + `]}`,
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		got, err := loadState(p)
		if err == nil || got == nil || len(got) != 0 {
			t.Errorf("%s: %v %v, want an error and an empty state", name, got, err)
		}
	}
	// A directory where the file should be cannot be written: an error,
	// not a panic.
	if err := saveState(dir, map[Key]int64{}); err == nil {
		t.Error("saved over a directory")
	}
}
