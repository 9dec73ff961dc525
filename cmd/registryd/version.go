package main

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// What the build stamped with -ldflags "-X main.NAME=VALUE" (the Makefile
// does, from git; a plain go build leaves them empty and the version comes
// from the build information Go records):
//
//	version    git describe --tags --always --dirty: a tag (v0.1.0) for a
//	           build of a tagged commit, TAG-N-gHASH after one, a bare
//	           abbreviated HASH with no tag in the history; -dirty when
//	           the tree had uncommitted changes
//	revision   git rev-parse HEAD
//	commitTime the commit's time, UTC, RFC 3339
//	buildTime  when the binary was built (make build; make release leaves
//	           it out, so a release rebuilt from its tag is the same bytes)
//
// Go itself records the commit's time, not the build's, and records no
// VCS information at all in a git worktree or with -buildvcs=false.
var version, revision, commitTime, buildTime string

// stamps are the values above, as one value for the functions below.
type stamps struct {
	version, revision, commitTime, buildTime string
}

func linkerStamps() stamps {
	return stamps{version: version, revision: revision, commitTime: commitTime, buildTime: buildTime}
}

// readBuildInfo is debug.ReadBuildInfo, or nil.
func readBuildInfo() *debug.BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return bi
}

// build is what registryd knows of how it was built.
type build struct {
	version   string // a tag, describe's output after one, a module version, or "" (devel)
	revision  string // the commit, or ""
	modified  bool   // built with uncommitted changes
	committed string
	built     string
	goVersion string
	fromGit   bool // version and revision are the Makefile's, from git
}

// untagged is describe's output when no tag precedes the commit: the
// abbreviated hash alone.
var untagged = regexp.MustCompile(`^[0-9a-f]{4,40}(-dirty)?$`)

// buildOf merges the stamps with Go's build information; the stamps win,
// since they come from git even where Go records nothing.
func buildOf(s stamps, bi *debug.BuildInfo) build {
	b := build{goVersion: runtime.Version(), committed: s.commitTime, built: s.buildTime}
	if bi != nil {
		if bi.GoVersion != "" {
			b.goVersion = bi.GoVersion
		}
		if v := bi.Main.Version; v != "(devel)" {
			b.version = v
		}
		for _, st := range bi.Settings {
			switch st.Key {
			case "vcs.revision":
				b.revision = st.Value
			case "vcs.modified":
				b.modified = st.Value == "true"
			case "vcs.time":
				if b.committed == "" {
					b.committed = st.Value
				}
			}
		}
	}
	if s.version != "" {
		b.fromGit = true
		b.version, b.modified = s.version, strings.HasSuffix(s.version, "-dirty")
		if untagged.MatchString(s.version) {
			b.version = ""
		}
	}
	if s.revision != "" {
		b.revision = s.revision
	}
	return b
}

// versionText is `registryd version`: the version, the VCS revision (and
// whether the tree had uncommitted changes), the commit and build times,
// and the Go version, each line saying plainly what the build did not
// record.
func versionText(s stamps, bi *debug.BuildInfo) string {
	var w strings.Builder
	b := buildOf(s, bi)
	if bi == nil && s.version == "" {
		fmt.Fprintf(&w, "registryd (devel): this binary carries no build information\n")
		fmt.Fprintf(&w, "go:        %s %s/%s\n", b.goVersion, runtime.GOOS, runtime.GOARCH)
		return w.String()
	}
	switch {
	case b.version != "":
		fmt.Fprintf(&w, "registryd %s\n", b.version)
	case b.fromGit:
		fmt.Fprintf(&w, "registryd (devel): a development build, of a commit no version tag precedes\n")
	default:
		fmt.Fprintf(&w, "registryd (devel): a development build, with no module version\n")
	}
	switch {
	case b.revision != "" && b.modified:
		fmt.Fprintf(&w, "revision:  %s (modified: built with uncommitted changes)\n", b.revision)
	case b.revision != "":
		fmt.Fprintf(&w, "revision:  %s\n", b.revision)
	case b.version != "" && !b.fromGit:
		fmt.Fprintf(&w, "revision:  not recorded (built from the module %s, not a checkout)\n", b.version)
	default:
		fmt.Fprintf(&w, "revision:  unknown (built outside a git checkout, or with -buildvcs=false)\n")
	}
	if b.committed != "" {
		fmt.Fprintf(&w, "committed: %s\n", b.committed)
	}
	if b.built != "" {
		fmt.Fprintf(&w, "built:     %s\n", b.built)
	}
	fmt.Fprintf(&w, "go:        %s %s/%s\n", b.goVersion, runtime.GOOS, runtime.GOARCH)
	return w.String()
}

// buildLabels are registryd_build_info's labels: the version ("(devel)"
// when there is none), the VCS revision ("" when unknown, with
// "-modified" for a tree with uncommitted changes) and the Go version.
func buildLabels(s stamps, bi *debug.BuildInfo) (version, revision, goVersion string) {
	b := buildOf(s, bi)
	version, revision = b.version, b.revision
	if version == "" {
		version = "(devel)"
	}
	if revision != "" && b.modified {
		revision += "-modified"
	}
	return version, revision, b.goVersion
}
