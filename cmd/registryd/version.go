package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// buildTime is when the binary was built, if the build recorded it:
// go build -ldflags "-X main.buildTime=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
// (make build does). Go itself records the commit's time, not the build's.
var buildTime string

// readBuildInfo is debug.ReadBuildInfo, or nil.
func readBuildInfo() *debug.BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return bi
}

// versionText is `registryd version`: the module version, the VCS
// revision (and whether the tree had uncommitted changes), the commit and
// build times, and the Go version, each line saying plainly what the build
// did not record.
func versionText(bi *debug.BuildInfo) string {
	var b strings.Builder
	goVersion := runtime.Version()
	if bi == nil {
		fmt.Fprintf(&b, "registryd (devel): this binary carries no build information\n")
		fmt.Fprintf(&b, "go:        %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		vcs[s.Key] = s.Value
	}
	version := bi.Main.Version
	switch version {
	case "", "(devel)":
		fmt.Fprintf(&b, "registryd (devel): a development build, with no module version\n")
	default:
		fmt.Fprintf(&b, "registryd %s\n", version)
	}
	switch rev := vcs["vcs.revision"]; {
	case rev != "" && vcs["vcs.modified"] == "true":
		fmt.Fprintf(&b, "revision:  %s (modified: built with uncommitted changes)\n", rev)
	case rev != "":
		fmt.Fprintf(&b, "revision:  %s\n", rev)
	case version != "" && version != "(devel)":
		fmt.Fprintf(&b, "revision:  not recorded (built from the module %s, not a checkout)\n", version)
	default:
		fmt.Fprintf(&b, "revision:  unknown (built outside a git checkout, or with -buildvcs=false)\n")
	}
	if t := vcs["vcs.time"]; t != "" {
		fmt.Fprintf(&b, "committed: %s\n", t)
	}
	if buildTime != "" {
		fmt.Fprintf(&b, "built:     %s\n", buildTime)
	}
	fmt.Fprintf(&b, "go:        %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}

// buildLabels are registryd_build_info's labels: the module version
// ("(devel)" when there is none), the VCS revision ("" when unknown, with
// "-modified" for a tree with uncommitted changes) and the Go version.
func buildLabels(bi *debug.BuildInfo) (version, revision, goVersion string) {
	version, goVersion = "(devel)", runtime.Version()
	if bi == nil {
		return version, "", goVersion
	}
	if v := bi.Main.Version; v != "" {
		version = v
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision != "" && modified {
		revision += "-modified"
	}
	return version, revision, goVersion
}
