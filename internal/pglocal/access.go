package pglocal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// runAs is the identity initdb and postgres run under.
type runAs struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
	// cred is set only when we must switch users (we are root); nil means
	// the children simply inherit our identity.
	cred *syscall.Credential
}

// serverUser returns who will run the server: PostgreSQL refuses to start as
// root, so root hands the job to the postgres system user the distribution
// packages create; anyone else runs it as themselves.
func serverUser() (runAs, error) {
	if os.Geteuid() != 0 {
		groups, err := os.Getgroups()
		if err != nil {
			return runAs{}, fmt.Errorf("pglocal: groups: %w", err)
		}
		ra := runAs{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
		ra.name = strconv.Itoa(int(ra.uid))
		if u, err := user.Current(); err == nil {
			ra.name = u.Username
		}
		for _, g := range groups {
			ra.groups = append(ra.groups, uint32(g))
		}
		return ra, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("pglocal: running as root, so the server must run as the postgres system user "+
			"(PostgreSQL refuses root), but it cannot be found: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	gids, err3 := u.GroupIds()
	if err := errors.Join(err1, err2, err3); err != nil {
		return runAs{}, fmt.Errorf("pglocal: postgres user: %w", err)
	}
	ra := runAs{name: u.Username, uid: uint32(uid), gid: uint32(gid)}
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			ra.groups = append(ra.groups, uint32(n))
		}
	}
	// Pass the groups explicitly: with none, Go would setgroups to the empty
	// list and drop memberships (e.g. ssl-cert) the server may rely on.
	ra.cred = &syscall.Credential{Uid: ra.uid, Gid: ra.gid, Groups: ra.groups}
	return ra, nil
}

// chown hands path to the server user when we are switching users; when we
// run the server as ourselves we already own what we create.
func (ra runAs) chown(path string) error {
	if ra.cred == nil {
		return nil
	}
	return os.Chown(path, int(ra.uid), int(ra.gid))
}

// canEnter applies the classic permission check for searching a directory:
// the first matching class (owner, group, other) decides, even if a later
// one would allow it. ACLs are not considered.
func (ra runAs) canEnter(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || ra.uid == 0 {
		return true
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == ra.uid:
		return perm&0o100 != 0
	case st.Gid == ra.gid || slices.Contains(ra.groups, st.Gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// CheckAccess reports whether the user that will run postgres (the postgres
// system user when we are root, else ourselves) can enter every parent
// directory of dir (walk from / down to dir's parent; check the execute bit
// for that uid/gid/groups via stat mode bits; dir itself may not exist yet).
// The error names the first directory that blocks and says how to fix it
// (choose a REGISTRY_DATA_DIR elsewhere, or chmod o+x that directory).
//
// It exists because the failure otherwise surfaces late and cryptically: as
// root we can create a data dir under, say, /root (mode 0700), but the server
// running as postgres then cannot reach it.
func CheckAccess(dir string) error {
	ra, err := serverUser()
	if err != nil {
		return err
	}
	return ra.checkAccess(dir)
}

func (ra runAs) checkAccess(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("pglocal: check access: %w", err)
	}
	// Walk both the path as written and with symlinks resolved: the server
	// needs to pass through the directories holding the links as well as
	// those holding their targets.
	paths := []string{abs}
	if real := resolveExisting(abs); real != abs {
		paths = append(paths, real)
	}
	for _, p := range paths {
		for _, d := range ancestors(p) {
			fi, err := os.Stat(d)
			if errors.Is(err, fs.ErrNotExist) {
				break // the rest gets created by us, traversable
			}
			if err != nil {
				return fmt.Errorf("pglocal: check access: %w", err)
			}
			if !fi.IsDir() {
				return fmt.Errorf("pglocal: %s is not a directory, so %s cannot be created", d, dir)
			}
			if !ra.canEnter(fi) {
				return fmt.Errorf("pglocal: user %s (uid %d), which runs the server, cannot enter %s (mode %v, owner uid %d), "+
					"so it cannot reach %s; choose a REGISTRY_DATA_DIR elsewhere, or run: chmod o+x %s",
					ra.name, ra.uid, d, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, abs, d)
			}
		}
	}
	return nil
}

// ancestors lists the directories from / down to the parent of the absolute
// path p, excluding p itself.
func ancestors(p string) []string {
	var dirs []string
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	slices.Reverse(dirs)
	return dirs
}

// resolveExisting resolves symlinks in the longest existing prefix of the
// absolute path p and re-appends the part that does not exist yet.
func resolveExisting(p string) string {
	rest := ""
	for d := p; ; d = filepath.Dir(d) {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			return filepath.Join(real, rest)
		}
		if d == filepath.Dir(d) {
			return p
		}
		rest = filepath.Join(filepath.Base(d), rest)
	}
}
