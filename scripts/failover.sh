#!/usr/bin/env bash
# Measures a PostgreSQL failover under registryd (docs/operating.md,
# "Failover, measured"): a primary and a synchronous streaming standby built from
# the local server binaries (initdb, pg_basebackup) under the system temp
# dir, registryd serving against both through one multi-host URL with
# target_session_attrs=read-write, writers registering nodes without
# pause; then the primary is killed (every one of its processes, SIGKILL),
# the standby promoted after PROMOTE_DELAY, and scripts/failover reports
# when writes stopped and resumed and whether every acknowledged write is
# on the new primary (exit 1 if one is missing).
#
# usage: scripts/failover.sh            (as root, or as a user that may run PostgreSQL)
#   PROMOTE_DELAY=0    seconds between the kill and `pg_ctl promote`: what
#                      an HA manager spends noticing (Patroni's ttl,
#                      CloudNativePG's probes); 0 isolates registryd's part
#   DURATION=25        seconds of writing in all; the kill comes at 8
#   WORKERS=4          concurrent writers
#   RETRY_INTERVAL=5s  the standby's wal_retrieve_retry_interval (PostgreSQL's
#                      default 5s): how long a standby whose primary went
#                      away waits before trying again, which a promotion
#                      requested meanwhile waits out
set -euo pipefail
trap 'echo "failover.sh: line $LINENO failed" >&2' ERR
cd "$(dirname "$0")/.."

PROMOTE_DELAY=${PROMOTE_DELAY:-0}
DURATION=${DURATION:-25}
WORKERS=${WORKERS:-4}
RETRY_INTERVAL=${RETRY_INTERVAL:-5s}
KILL_AT=8

. scripts/lib/pgcluster.sh
pg_workdir failover primary standby
p1=$(free_port)
p2=$(free_port)
[ "$p1" != "$p2" ] || p2=$((p1 + 1))
[ "$(id -u)" = 0 ] && chown postgres "$work"

echo "== primary on 127.0.0.1:$p1, synchronous standby on 127.0.0.1:$p2 ($("$bindir/postgres" --version))"
as_pg "$bindir/initdb" -D "$work/primary" -U postgres --auth=trust -E UTF8 >/dev/null
cat >>"$work/primary/postgresql.conf" <<CONF
log_line_prefix = '%m [%p] '
log_timezone = 'UTC'
listen_addresses = '127.0.0.1'
port = $p1
unix_socket_directories = '$work'
wal_level = replica
max_wal_senders = 4
hot_standby = on
synchronous_commit = on
wal_sender_timeout = 5s
CONF
echo "host replication postgres 127.0.0.1/32 trust" >>"$work/primary/pg_hba.conf"
as_pg "$bindir/pg_ctl" -D "$work/primary" -l "$work/primary.log" -w start >/dev/null
as_pg "$bindir/psql" -h "$work" -p "$p1" -U postgres -qc "CREATE DATABASE registry" >/dev/null

as_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$work/standby" -X stream -R -c fast
# The standby's own settings (postgresql.auto.conf wins over the copied
# postgresql.conf): its port, its name for synchronous replication, and
# no synchronous standby of its own, or once promoted it would wait
# forever for one that does not exist. (Patroni and CloudNativePG manage
# synchronous_standby_names this way across a failover.)
cat >>"$work/standby/postgresql.auto.conf" <<CONF
port = $p2
primary_conninfo = 'host=127.0.0.1 port=$p1 user=postgres application_name=standby1'
synchronous_standby_names = ''
wal_retrieve_retry_interval = '$RETRY_INTERVAL'
CONF
[ "$(id -u)" = 0 ] && chown -R postgres "$work/standby"
as_pg "$bindir/pg_ctl" -D "$work/standby" -l "$work/standby.log" -w start >/dev/null
# From now on commits wait until the standby has the WAL on disk.
as_pg "$bindir/psql" -h "$work" -p "$p1" -U postgres -qc "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" -c "SELECT pg_reload_conf()" >/dev/null
for _ in $(seq 50); do
	state=$(as_pg "$bindir/psql" -h "$work" -p "$p1" -U postgres -Atc "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'")
	[ "$state" = sync ] && break
	sleep 0.2
done
[ "$state" = sync ] || { echo "the standby did not become synchronous ($state)" >&2; exit 1; }
echo "   replication: $state"

echo "== registryd against postgres://...@127.0.0.1:$p1,127.0.0.1:$p2/registry?target_session_attrs=read-write"
go build -o "$work/registryd" ./cmd/registryd
go build -o "$work/failover" ./scripts/failover
export REGISTRY_DATABASE_URL="postgres://postgres@127.0.0.1:$p1,127.0.0.1:$p2/registry?target_session_attrs=read-write&connect_timeout=2&sslmode=disable"
export REGISTRY_JWT_SECRET=failover-measurement-secret-0123456789abcdef
export REGISTRY_LISTEN=127.0.0.1:0
export REGISTRY_LOG_FORMAT=json
"$work/registryd" migrate up >/dev/null
token=$("$work/registryd" token --sub failover --role admin | tail -1)
"$work/registryd" serve >"$work/serve.out" 2>"$work/serve.log" &
pids+=($!)
for _ in $(seq 100); do
	url=$(grep -o 'serving on http://[^ ]*' "$work/serve.out" | cut -d' ' -f3 || true)
	[ -n "$url" ] && break
	sleep 0.1
done
[ -n "$url" ] || { echo "registryd did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
echo "   $url"

marks=$work/marks
: >"$marks"
echo "   the standby's wal_retrieve_retry_interval: $RETRY_INTERVAL"
echo "== writing for ${DURATION}s with $WORKERS writers; the primary dies at ${KILL_AT}s, promotion ${PROMOTE_DELAY}s later"
"$work/failover" -url "$url" -token "$token" -duration "${DURATION}s" -workers "$WORKERS" -marks "$marks" >"$work/report" 2>&1 &
writer=$!
pids+=($writer)
sleep "$KILL_AT"

# A crash, as near as one host can make it: every process of the primary,
# SIGKILL, at once.
# Each mark is taken just before and just after its action (a shell on a
# busy machine can take tens of milliseconds to fork date); the moment
# the promoted standby took writes comes from its own log.
pm=$(head -1 "$work/primary/postmaster.pid")
victims="$pm $(pgrep -P "$pm" | tr '\n' ' ')"
echo "kill $(date +%s%N)" >>"$marks"
kill -9 $victims 2>/dev/null || true
echo "killed $(date +%s%N)" >>"$marks"
sleep "$PROMOTE_DELAY"
echo "promote $(date +%s%N)" >>"$marks"
as_pg "$bindir/pg_ctl" -D "$work/standby" -w promote >/dev/null
echo "promoted $(date +%s%N)" >>"$marks"
# pg_ctl returns when the control file says "in production"; the log
# line may follow a moment later.
for _ in $(seq 100); do
	ready=$(grep 'database system is ready to accept connections' "$work/standby.log" | tail -1 | cut -d' ' -f1-3 || true)
	[ -n "$ready" ] && break
	sleep 0.05
done
[ -n "$ready" ] || { echo "the promoted standby never logged that it accepts connections" >&2; exit 1; }
echo "ready $(date -d "$ready" +%s%N)" >>"$marks"

status=0
wait "$writer" || status=$?
cat "$work/report"
n=$(as_pg "$bindir/psql" -h "$work" -p "$p2" -U postgres -d registry -Atc "SELECT count(*) FROM nodes")
echo "nodes on the new primary (psql): $n"
echo "the standby's log from the kill on:"
sed -n '/could not receive data from WAL stream\|terminated\|could not connect to the primary/,$p' "$work/standby.log" | grep -v 'FATAL:  the database system is not accepting\|cannot execute' | head -12 | sed 's/^/   /' || true
echo "registryd's log around the failover (warnings and errors):"
grep -E '"level":"(WARN|ERROR)"' "$work/serve.log" | cut -c1-220 | sort | uniq -c | sort -rn | head -8 || true
exit "$status"
