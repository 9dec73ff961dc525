package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// goTool is the go command that runs these tests.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skip("no go command to build registryd with")
	}
	return p
}

// buildRegistryd builds the real binary from the module in dir into a
// temp dir, with flags.
// -trimpath lets the build cache serve every copy of the module.
func buildRegistryd(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "registryd")
	cmd := exec.Command(goTool(t), append(append([]string{"build", "-trimpath"}, flags...), "-o", bin, "./cmd/registryd")...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", flags, err, out)
	}
	return bin
}

func runBinary(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return string(out)
}

// gitRun runs git in dir.
func gitRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// checkoutCopy copies the module's files into a fresh git repository in a
// temp dir, committed and tagged v1.2.3. (go stamps no VCS information in
// a git worktree, whose .git is a file, so the tests' own checkout will
// not do.)
func checkoutCopy(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: the VCS stamping cannot be checked")
	}
	root, dir := moduleRoot(t), t.TempDir()
	for _, f := range strings.Split(gitRun(t, root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if f == "" || os.IsNotExist(err) {
			continue // deleted in the work tree
		} else if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, dir, "init", "-q")
	gitRun(t, dir, "add", "-A")
	gitRun(t, dir, "commit", "-q", "-m", "v1.2.3")
	gitRun(t, dir, "tag", "v1.2.3")
	return dir
}

// A real build from a checkout: `registryd version` and `--version` show
// the module version, the revision and whether the tree had changes, the
// commit time, the build time the build recorded, and the Go version. A
// build without VCS information says "(devel)" and that the revision is
// unknown.
func TestVersionOfARealBuild(t *testing.T) {
	t.Parallel()
	src := checkoutCopy(t)
	head := gitRun(t, src, "rev-parse", "HEAD")
	const built = "2026-01-02T03:04:05Z"
	// -buildvcs=true: the developer's GOFLAGS may turn stamping off.
	bin := buildRegistryd(t, src, "-buildvcs=true", "-ldflags", "-X main.buildTime="+built)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out := runBinary(t, bin, args...)
		want := "registryd v1.2.3\nrevision:  " + head + "\ncommitted: "
		if !strings.HasPrefix(out, want) || !strings.Contains(out, "\nbuilt:     "+built+"\n") ||
			!strings.Contains(out, "\ngo:        go1.") {
			t.Errorf("%v: want it to start %q, and the build time and Go version:\n%s", args, want, out)
		}
	}

	// An uncommitted change.
	if err := os.WriteFile(filepath.Join(src, "CHANGED"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runBinary(t, buildRegistryd(t, src, "-buildvcs=true"), "version")
	if !strings.HasPrefix(out, "registryd v1.2.3+dirty\nrevision:  "+head+" (modified: built with uncommitted changes)\n") ||
		strings.Contains(out, "built:") {
		t.Errorf("modified tree:\n%s", out)
	}

	out = runBinary(t, buildRegistryd(t, src, "-buildvcs=false"), "version")
	if !strings.HasPrefix(out, "registryd (devel): a development build") ||
		!strings.Contains(out, "revision:  unknown (built outside a git checkout, or with -buildvcs=false)") {
		t.Errorf("-buildvcs=false:\n%s", out)
	}
}

// `make build` in a checkout stamps what git says: the tag on a tagged
// commit, describe's TAG-N-gHASH after it, -dirty and "modified" for
// uncommitted changes, and "(devel)" with the revision when no tag
// precedes the commit. Go's own VCS stamping is off (-buildvcs=false), as
// in a git worktree, so what is printed is the Makefile's.
func TestVersionFromMakefile(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	src := checkoutCopy(t)
	version := func() string {
		t.Helper()
		cmd := exec.Command("make", "build", "GO="+goTool(t))
		cmd.Dir = src
		// -trimpath lets the build cache serve this copy of the module.
		cmd.Env = append(os.Environ(), "GOFLAGS=-trimpath -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build: %v\n%s", err, out)
		}
		return runBinary(t, filepath.Join(src, "bin", "registryd"), "version")
	}
	head := gitRun(t, src, "rev-parse", "HEAD")
	if out := version(); !strings.HasPrefix(out, "registryd v1.2.3\nrevision:  "+head+"\ncommitted: ") || !strings.Contains(out, "\nbuilt:     ") {
		t.Errorf("tagged commit:\n%s", out)
	}

	// A commit after the tag; then the same with a change not committed.
	if err := os.WriteFile(filepath.Join(src, "CHANGED"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitRun(t, src, "add", "CHANGED")
	gitRun(t, src, "commit", "-q", "-m", "after")
	head = gitRun(t, src, "rev-parse", "HEAD")
	after := "v1.2.3-1-g" + gitRun(t, src, "rev-parse", "--short", "HEAD")
	if out := version(); !strings.HasPrefix(out, "registryd "+after+"\nrevision:  "+head+"\n") {
		t.Errorf("a commit after the tag: want %s:\n%s", after, out)
	}
	if err := os.WriteFile(filepath.Join(src, "CHANGED"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := version(); !strings.HasPrefix(out, "registryd "+after+"-dirty\nrevision:  "+head+" (modified: built with uncommitted changes)\n") {
		t.Errorf("uncommitted change: want %s-dirty, modified:\n%s", after, out)
	}

	gitRun(t, src, "tag", "-d", "v1.2.3")
	if out := version(); !strings.HasPrefix(out, "registryd (devel): a development build, of a commit no version tag precedes\nrevision:  "+head+" (modified") {
		t.Errorf("no tag:\n%s", out)
	}
}

// The cases a build from the checkout does not produce.
func TestVersionText(t *testing.T) {
	t.Parallel()
	if out := versionText(stamps{}, nil); !strings.HasPrefix(out, "registryd (devel): this binary carries no build information") {
		t.Errorf("no build info: %q", out)
	}
	installed := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/registryd/registryd", Version: "v1.4.0"}}
	out := versionText(stamps{}, installed)
	if !strings.HasPrefix(out, "registryd v1.4.0\n") || !strings.Contains(out, "revision:  not recorded (built from the module v1.4.0") ||
		!strings.Contains(out, "go:        go1.26.0 ") {
		t.Errorf("go install @v1.4.0:\n%s", out)
	}
	clean := &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201070450-3b18206c0f1e"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3b18206c0f1e"}, {Key: "vcs.modified", Value: "false"}, {Key: "vcs.time", Value: "2026-12-01T07:04:50Z"}}}
	out = versionText(stamps{}, clean)
	if !strings.Contains(out, "revision:  3b18206c0f1e\n") || !strings.Contains(out, "committed: 2026-12-01T07:04:50Z\n") {
		t.Errorf("clean checkout:\n%s", out)
	}

	// The Makefile's stamps win over what Go recorded, and a version
	// without a tag is no version.
	for _, tc := range []struct {
		stamps stamps
		want   string
	}{
		{stamps{version: "v0.1.0", revision: "abc123", commitTime: "2026-12-01T07:04:50Z"},
			"registryd v0.1.0\nrevision:  abc123\ncommitted: 2026-12-01T07:04:50Z\ngo:        go1.26.0 "},
		{stamps{version: "v0.1.0-rc.1-4-gabc1234-dirty", revision: "abc1234ff"},
			"registryd v0.1.0-rc.1-4-gabc1234-dirty\nrevision:  abc1234ff (modified: built with uncommitted changes)\ncommitted: 2026-12-01T07:04:50Z\n"},
		{stamps{version: "abc1234", revision: "abc1234ff"},
			"registryd (devel): a development build, of a commit no version tag precedes\nrevision:  abc1234ff\n"},
		{stamps{version: "v0.2.0"},
			"registryd v0.2.0\nrevision:  3b18206c0f1e\n"},
	} {
		bi := *clean
		bi.GoVersion = "go1.26.0"
		if out := versionText(tc.stamps, &bi); !strings.HasPrefix(out, tc.want) {
			t.Errorf("%+v: want it to start\n%s\ngot:\n%s", tc.stamps, tc.want, out)
		}
	}
	if out := versionText(stamps{version: "v0.1.0", revision: "abc123"}, nil); !strings.HasPrefix(out, "registryd v0.1.0\nrevision:  abc123\ngo:  ") {
		t.Errorf("stamps, no build information:\n%s", out)
	}
}

// registryd_build_info's labels: the module version, the revision (marked
// when the tree was modified) and the Go version; a binary without build
// information is (devel) with no revision.
func TestBuildLabels(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	if v, r, g := buildLabels(stamps{}, bi); v != "v1.2.3" || r != "abc123-modified" || g != "go1.99.1" {
		t.Errorf("buildLabels = %q, %q, %q", v, r, g)
	}
	bi.Settings[1].Value = "false"
	if _, r, _ := buildLabels(stamps{}, bi); r != "abc123" {
		t.Errorf("unmodified revision %q", r)
	}
	if v, r, g := buildLabels(stamps{}, nil); v != "(devel)" || r != "" || g != runtime.Version() {
		t.Errorf("no build information: %q, %q, %q", v, r, g)
	}
	if v, r, _ := buildLabels(stamps{version: "v0.1.0-dirty", revision: "def456"}, bi); v != "v0.1.0-dirty" || r != "def456-modified" {
		t.Errorf("stamped: %q, %q", v, r)
	}
	if v, r, _ := buildLabels(stamps{version: "def4567", revision: "def4567ff"}, bi); v != "(devel)" || r != "def4567ff" {
		t.Errorf("stamped, no tag: %q, %q", v, r)
	}
}
