# Shared by the scripts that build throwaway PostgreSQL clusters from the
# local server binaries (failover.sh, backup-restore.sh). Source it after
# `cd` to the checkout; it sets:
#
#   bindir              the server binaries (PG_BINDIR, pg_config --bindir,
#                       or the newest /usr/lib/postgresql/*/bin)
#   as_pg CMD...        runs CMD as the postgres user when run as root
#                       (PostgreSQL refuses root), as is otherwise
#   free_port           prints a TCP port nothing listens on
#   pg_workdir NAME C…  makes a work folder under the system temp dir (in
#                       $work), and on exit kills $pids, stops clusters
#                       C… in it (immediate) and removes it

bindir=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null || true)}
if [ ! -x "$bindir/initdb" ]; then
	bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
fi
[ -x "$bindir/initdb" ] || { echo "no PostgreSQL server binaries (initdb); install postgresql or set PG_BINDIR" >&2; exit 1; }

as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 30000))
		ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
	done
}

pids=()
pg_clusters=()
pg_workdir() {
	work=$(mktemp -d "${TMPDIR:-/tmp}/registryd-$1.XXXXXX")
	chmod 755 "$work"
	shift
	pg_clusters=("$@")
	trap pg_cleanup EXIT
}

pg_cleanup() {
	local p d
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for d in "${pg_clusters[@]}"; do
		[ -f "$work/$d/postmaster.pid" ] && as_pg "$bindir/pg_ctl" -D "$work/$d" -m immediate stop >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
