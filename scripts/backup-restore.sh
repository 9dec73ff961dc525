#!/usr/bin/env bash
# Rehearses the backups of docs/operating.md on a throwaway cluster built from
# the local server binaries under the system temp dir, with registryd
# serving on it, and checks each restore through registryd's API:
#
#   1. pg_dump (custom format) of the live database, pg_restore into a
#      fresh database: registryd started on the copy lists the same nodes.
#   2. WAL archiving and point-in-time recovery: a base backup
#      (pg_basebackup) plus the archived WAL, recovered to the moment just
#      before a node was deleted by mistake: registryd on the recovered
#      cluster lists that node again, and nothing written after the target.
#
# usage: scripts/backup-restore.sh   (as root, or a user that may run PostgreSQL)
# Exits 1 if a restore does not give back what it should.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/pgcluster.sh
pg_workdir backup primary recovered
[ "$(id -u)" = 0 ] && chown postgres "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

go build -o "$work/registryd" ./cmd/registryd
export REGISTRY_JWT_SECRET=backup-rehearsal-secret-0123456789abcdef0123
export REGISTRY_LISTEN=127.0.0.1:0
url_of() { echo "postgres://postgres@127.0.0.1:$1/$2?sslmode=disable"; }
psql_on() { local port=$1 db=$2; shift 2; as_pg "$bindir/psql" -h "$work" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 -Atq "$@"; }

# serve PORT DB: starts registryd on that database; sets $api.
serve() {
	: >"$work/serve.out"
	REGISTRY_DATABASE_URL=$(url_of "$1" "$2") "$work/registryd" serve >"$work/serve.out" 2>>"$work/serve.log" &
	pids+=($!)
	server=$!
	api=
	for _ in $(seq 150); do
		api=$(grep -o 'serving on http://[^ ]*' "$work/serve.out" | cut -d' ' -f3 || true)
		[ -n "$api" ] && return
		sleep 0.1
	done
	cat "$work/serve.log" >&2
	fail "registryd did not start on $2"
}
stop_serving() { kill "$server"; wait "$server" || true; }
list() { curl -sf -X POST -H "Authorization: Bearer $token" "$api/v1/nodes/list" | jq -c '[.[] | {pk, ip, index, cpu_mem, driver_version}]'; }
create() {
	curl -sf -o /dev/null -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' "$api/v1/nodes/create" \
		-d "{\"ip\":\"$1\",\"index\":0,\"cpu_mem\":1024,\"driver_version\":\"550\",\"hardware_generation\":null,\"gpu_mem\":null}"
}

p1=$(free_port)
echo "== a cluster on 127.0.0.1:$p1 with WAL archiving ($("$bindir/postgres" --version))"
mkdir -p "$work/archive"
[ "$(id -u)" = 0 ] && chown postgres "$work/archive"
as_pg "$bindir/initdb" -D "$work/primary" -U postgres --auth=trust -E UTF8 >/dev/null
cat >>"$work/primary/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $p1
unix_socket_directories = '$work'
wal_level = replica
archive_mode = on
archive_command = 'test ! -f $work/archive/%f && cp %p $work/archive/%f'
log_timezone = 'UTC'
timezone = 'UTC'
CONF
as_pg "$bindir/pg_ctl" -D "$work/primary" -l "$work/primary.log" -w start >/dev/null
psql_on "$p1" postgres -c "CREATE DATABASE registry"
REGISTRY_DATABASE_URL=$(url_of "$p1" registry) "$work/registryd" migrate up >/dev/null
token=$(REGISTRY_DATABASE_URL=$(url_of "$p1" registry) "$work/registryd" token --sub backup --role admin | tail -1)
serve "$p1" registry
for i in 1 2 3; do create "10.7.0.$i"; done

echo "== 1. pg_dump of the live database, pg_restore into a fresh one"
as_pg "$bindir/pg_dump" --format=custom --file="$work/registry.dump" --dbname="$(url_of "$p1" registry)"
psql_on "$p1" postgres -c "CREATE DATABASE registry_restored"
as_pg "$bindir/pg_restore" --no-owner --exit-on-error --dbname="$(url_of "$p1" registry_restored)" "$work/registry.dump"
before=$(list)
stop_serving
serve "$p1" registry_restored
after=$(list)
[ "$before" = "$after" ] || fail "the restored database lists $after, the original $before"
echo "   registryd on the restored copy lists the same $(jq length <<<"$after") nodes"
stop_serving

echo "== 2. base backup, more writes, a mistake, point-in-time recovery to just before it"
as_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$work/base" -X fetch -c fast
serve "$p1" registry
for i in 4 5; do create "10.7.0.$i"; done # after the base backup: only in the WAL
sleep 1
target=$(psql_on "$p1" postgres -c "SELECT now()")
sleep 1
wanted=$(list) # the registry as it was at the target
victim=$(jq -r '.[] | select(.ip == "10.7.0.2") | .pk' <<<"$wanted")
curl -sf -o /dev/null -X DELETE -H "Authorization: Bearer $token" "$api/v1/nodes/$victim" || fail "delete node $victim"
create 10.7.0.6 # after the target: must not come back
stop_serving
psql_on "$p1" postgres -c "SELECT pg_switch_wal()" >/dev/null # archive the segment that has the mistake
for _ in $(seq 100); do
	[ "$(psql_on "$p1" postgres -c "SELECT last_failed_wal IS NULL AND last_archived_wal IS NOT NULL FROM pg_stat_archiver")" = t ] && break
	sleep 0.1
done
as_pg "$bindir/pg_ctl" -D "$work/primary" -m fast -w stop >/dev/null # the primary is lost
echo "   recovery target: $target (node pk $victim was deleted after it)"

p2=$(free_port)
cp -a "$work/base" "$work/recovered"
cat >>"$work/recovered/postgresql.auto.conf" <<CONF
port = $p2
archive_mode = off
restore_command = 'cp $work/archive/%f %p'
recovery_target_time = '$target'
recovery_target_action = 'promote'
CONF
touch "$work/recovered/recovery.signal"
[ "$(id -u)" = 0 ] && chown -R postgres "$work/recovered"
as_pg "$bindir/pg_ctl" -D "$work/recovered" -l "$work/recovered.log" -w -t 60 start >/dev/null
for _ in $(seq 100); do
	[ "$(psql_on "$p2" postgres -c "SELECT pg_is_in_recovery()")" = f ] && break
	sleep 0.1
done
grep -E 'recovery stopping|starting point-in-time recovery' "$work/recovered.log" | cut -d' ' -f4- | sed 's/^/   postgres: /'
serve "$p2" registry
got=$(list)
[ "$got" = "$wanted" ] || fail "the recovered registry lists $got; want $wanted"
echo "   registryd on the recovered cluster lists $(jq length <<<"$got") nodes: the deleted node is back, the node written after the target is not"
stop_serving
echo "ok"
