package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/registryd/registryd/internal/registry"
)

// Key identifies a node the way the registry does: a host address and a
// GPU index.
type Key struct {
	IP    string `json:"ip"`
	Index int    `json:"index"`
}

func (k Key) String() string { return fmt.Sprintf("%s/%d", k.IP, k.Index) }

// CompareKeys orders keys by address, then index.
func CompareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.IP, b.IP), cmp.Compare(a.Index, b.Index))
}

// stateVersion is the state file's format; a file of another version is
// not read (the agent starts afresh, which costs it nothing but a lookup).
const stateVersion = 1

// maxStateFile bounds what the agent reads of its state file: an entry is
// under 100 bytes.
const maxStateFile = 1 << 20

// stateFile is what the agent remembers across restarts: the pk of every
// node it registered, by (ip, index).
type stateFile struct {
	Version int          `json:"version"`
	Nodes   []stateEntry `json:"nodes"`
}

type stateEntry struct {
	Key
	PK int64 `json:"pk"`
}

// loadState reads the state file at path. A missing file is an empty
// state. A file that cannot be read as a state (corrupt, truncated,
// another version) is reported through the error but still yields an
// empty state, never a crash: the agent finds its nodes again through the
// server (a registration answered 409 names the existing node, which the
// agent takes back once it proves it may act as it).
func loadState(path string) (map[Key]int64, error) {
	nodes := map[Key]int64{}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nodes, nil
	}
	if err != nil {
		return nodes, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return nodes, err
	}
	if len(b) > maxStateFile {
		return nodes, fmt.Errorf("%s is larger than %d bytes", path, maxStateFile)
	}
	var st stateFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nodes, fmt.Errorf("%s is not a state file: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nodes, fmt.Errorf("%s is not a state file: more after its object", path)
	}
	if st.Version != stateVersion {
		return nodes, fmt.Errorf("%s has version %d; this agent reads version %d", path, st.Version, stateVersion)
	}
	for _, e := range st.Nodes {
		ip, err := registry.CanonicalIP(e.IP)
		if err != nil || e.Index < 0 || e.Index > registry.MaxIndex || e.PK <= 0 {
			return map[Key]int64{}, fmt.Errorf("%s has a bad entry %+v", path, e)
		}
		nodes[Key{IP: ip, Index: e.Index}] = e.PK
	}
	return nodes, nil
}

// saveState writes nodes to path (see WriteFileAtomic).
func saveState(path string, nodes map[Key]int64) error {
	st := stateFile{Version: stateVersion, Nodes: []stateEntry{}}
	for k, pk := range nodes {
		st.Nodes = append(st.Nodes, stateEntry{Key: k, PK: pk})
	}
	slices.SortFunc(st.Nodes, func(a, b stateEntry) int { return CompareKeys(a.Key, b.Key) })
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, append(b, '\n'))
}

// WriteFileAtomic writes data to path atomically: a temporary file in the
// same directory, synced, renamed over the old one, then the directory
// synced, so a crash leaves either the old file or the new, never half of
// one. The file is 0600 and a directory it creates 0700: what the agent
// keeps (its nodes, its token) is its own.
func WriteFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes the file 0600 already; say so rather than rely on it.
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
