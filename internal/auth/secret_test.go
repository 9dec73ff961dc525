package auth

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A secret that anyone else could have written or read is refused, with
// the path and the fix.
func TestLoadOrCreateSecretRefuses(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, dirMode, fileMode os.FileMode) (dir, path string) {
		t.Helper()
		dir = filepath.Join(t.TempDir(), "d")
		path = filepath.Join(dir, "jwt-secret")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Repeat("s", 64)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, fileMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, dirMode); err != nil {
			t.Fatal(err)
		}
		return dir, path
	}
	tests := []struct {
		name              string
		dirMode, fileMode os.FileMode
		want              func(dir, path string) string
	}{
		{"secret readable by the group", 0o700, 0o640, func(_, p string) string { return "chmod g-r " + p }},
		{"secret readable by all", 0o700, 0o644, func(_, p string) string { return "chmod go-r " + p }},
		{"secret writable by others", 0o700, 0o602, func(_, p string) string { return "chmod o-w " + p }},
		{"folder writable by all", 0o777, 0o600, func(d, _ string) string { return "chmod go-w " + d }},
		{"folder writable by the group", 0o770, 0o600, func(d, _ string) string { return "chmod g-w " + d }},
	}
	for _, tt := range tests {
		dir, path := write(t, tt.dirMode, tt.fileMode)
		_, _, err := LoadOrCreateSecret(path)
		if want := tt.want(dir, path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, want)
		}
	}

	// A link to a private file of ours is still not the file itself.
	_, path := write(t, 0o700, 0o600)
	if err := os.Rename(path, path+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path+".real", path); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateSecret(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("symlinked secret: %v", err)
	}

	if os.Geteuid() != 0 {
		return // the rest gives files away
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	nobody, _ := strconv.Atoi(u.Uid)
	for _, which := range []string{"file", "folder"} {
		dir, path := write(t, 0o700, 0o600)
		target := path
		if which == "folder" {
			target = dir
		}
		if err := os.Chown(target, nobody, -1); err != nil {
			t.Fatal(err)
		}
		_, _, err := LoadOrCreateSecret(path)
		if err == nil || !strings.Contains(err.Error(), target+" belongs to uid "+u.Uid) {
			t.Errorf("%s of another user: %v", which, err)
		}
	}
}

// Processes starting together agree on one secret: nobody reads a
// half-written file or writes a second secret.
func TestLoadOrCreateSecretConcurrent(t *testing.T) {
	t.Parallel()
	for range 20 {
		path := filepath.Join(t.TempDir(), "jwt-secret")
		var wg sync.WaitGroup
		secrets := make([]string, 8)
		created := make([]bool, 8)
		errs := make([]error, 8)
		for i := range secrets {
			wg.Go(func() {
				s, c, err := LoadOrCreateSecret(path)
				secrets[i], created[i], errs[i] = string(s), c, err
			})
		}
		wg.Wait()
		made := 0
		for i := range secrets {
			if errs[i] != nil {
				t.Fatalf("start %d: %v", i, errs[i])
			}
			if secrets[i] != secrets[0] {
				t.Fatalf("start %d got another secret", i)
			}
			if created[i] {
				made++
			}
		}
		if made != 1 {
			t.Fatalf("%d starts say they made the secret, want 1", made)
		}
		if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
			t.Fatalf("left behind: %v", entries)
		}
	}
}
