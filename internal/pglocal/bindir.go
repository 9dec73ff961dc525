package pglocal

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoServerBinaries is returned (wrapped) when no initdb/postgres binaries
// are found. Callers test for it with errors.Is to fall back to another way of
// getting a database instead of failing outright.
var ErrNoServerBinaries = errors.New("pglocal: no PostgreSQL server binaries (initdb, postgres) found")

// debianVersionGlob is where Debian and Ubuntu install the server: those
// packages keep initdb and postgres off PATH, one directory per major version.
const debianVersionGlob = "/usr/lib/postgresql/*/bin"

// FindBinDir finds the directory holding initdb and postgres: $PG_BINDIR
// override if set, then `pg_config --bindir`, then the highest version of
// /usr/lib/postgresql/*/bin, then PATH. Its error wraps ErrNoServerBinaries
// and its message names three ways out: install the server (e.g. `apt-get
// install postgresql`), set REGISTRY_DATABASE_URL to an existing server, or
// run `docker compose up`.
//
// A PG_BINDIR that lacks the binaries is an error rather than a reason to keep
// searching: an explicit override should never be silently ignored.
func FindBinDir() (string, error) {
	return findBinDir(os.Getenv, debianVersionGlob)
}

// findBinDir is FindBinDir with its environment and version glob injected, so
// tests can exercise every step (and the failure message) on any machine.
func findBinDir(getenv func(string) string, versionGlob string) (string, error) {
	if dir := getenv("PG_BINDIR"); dir != "" {
		if hasServerBinaries(dir) {
			return dir, nil
		}
		return "", noBinaries(fmt.Sprintf("PG_BINDIR=%s does not hold initdb and postgres", dir))
	}
	path := getenv("PATH")
	if pgConfig := lookPath("pg_config", path); pgConfig != "" {
		// pg_config may come from a client-only package (libpq-dev), so its
		// answer is only a hint and gets the same check as every other step.
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) {
				return dir, nil
			}
		}
	}
	if dir := highestVersionDir(versionGlob); dir != "" {
		return dir, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir != "" && hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", noBinaries(fmt.Sprintf("looked at pg_config --bindir, %s and PATH", versionGlob))
}

func noBinaries(detail string) error {
	return fmt.Errorf("%w (%s); install the server (e.g. `apt-get install postgresql`), "+
		"set REGISTRY_DATABASE_URL to an existing server, or run `docker compose up`",
		ErrNoServerBinaries, detail)
}

// highestVersionDir returns the match of versionGlob whose version directory
// (the parent of bin) is numerically highest, so 10 beats 9.6; "" if none
// holds the server binaries.
func highestVersionDir(versionGlob string) string {
	matches, _ := filepath.Glob(versionGlob) // only ErrBadPattern, and the pattern is ours
	matches = slices.DeleteFunc(matches, func(m string) bool { return !hasServerBinaries(m) })
	if len(matches) == 0 {
		return ""
	}
	return slices.MaxFunc(matches, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
}

// compareVersions compares dotted numeric versions ("9.6" < "15");
// non-numeric parts count as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

func hasServerBinaries(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres"))
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// lookPath is exec.LookPath against an explicit PATH value, so the injected
// environment decides where pg_config is searched.
func lookPath(name, path string) string {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue // an empty element means ".", which we never want to trust
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p
		}
	}
	return ""
}
