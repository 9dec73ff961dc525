#!/usr/bin/env bash
# Measures issue 8's findings 4 and 5 against a real `registryd serve` on
# its embedded PostgreSQL (run as root or as a user that may run
# PostgreSQL; needs prlimit from util-linux):
#
#   fd        the server under a descriptor limit of 1024 (prlimit
#             --nofile=1024:1024); 1,100 idle keep-alive connections, each
#             after one GET /healthz, then a new client's GET /healthz is
#             timed (goal: answered within 3 s).
#   trickle   the server under a descriptor limit of 1024; 1,000
#             connections without a token each announce a body to
#             GET /healthz and trickle it (a byte every 2 s), then a new
#             client's GET /healthz is timed (goal: answered within 3 s).
#   watchers  the server under a descriptor limit of 8192 (WATCH_NOFILE;
#             2,000 watchers need more than 1024: under 1024 the connection
#             limit is 956 and the watch cap half that, so most are refused
#             with 429); 2,000 watchers that never read, 600
#             node changes, the server's RSS sampled and nodes/list timed
#             (goals: RSS <= 400 MB, list within 1 s); then 300 watchers
#             resuming from event 0 while list is timed.
#
# usage: scripts/measure-limits.sh [fd|trickle|watchers|all] [path/to/registryd]
# The binary defaults to one built from this checkout; pass another (say,
# one built from an older commit) to compare.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
work=$(mktemp -d)
trap 'stop_server; rm -rf "$work"' EXIT
chmod 755 "$work" # the embedded PostgreSQL runs as the postgres user when we are root

bin=${2:-}
if [ -z "$bin" ]; then
	go build -o "$work/registryd" ./cmd/registryd
	bin=$work/registryd
fi
go build -o "$work/limitsbench" ./scripts/limitsbench

port=${PORT:-18080}
addr=127.0.0.1:$port
export REGISTRY_LISTEN=$addr
export REGISTRY_JWT_SECRET=measure-limits-secret-0123456789abcdef
export REGISTRY_LOG_LEVEL=info
server_pid=

# start_server NOFILE [ENV=VALUE...]: a fresh data directory each time.
start_server() {
	local nofile=$1
	shift
	local data
	data=$(mktemp -d "$work/data.XXXXXX")
	chmod 755 "$data"
	env REGISTRY_DATA_DIR="$data" "$@" prlimit --nofile="$nofile:$nofile" "$bin" serve >"$work/stdout" 2>"$work/stderr" &
	server_pid=$!
	for _ in $(seq 300); do
		if curl -fsS "http://$addr/readyz" >/dev/null 2>&1; then
			echo "server pid $server_pid, RLIMIT_NOFILE $nofile"
			grep -ho '"max_connections":[0-9]*,"watch_max_streams":[0-9]*' "$work/stderr" || true
			return
		fi
		if ! kill -0 "$server_pid" 2>/dev/null; then
			cat "$work/stderr"
			exit 1
		fi
		sleep 0.1
	done
	echo "the server did not get ready" >&2
	exit 1
}

stop_server() {
	if [ -n "$server_pid" ]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		server_pid=
	fi
}

if [ "$what" = fd ] || [ "$what" = all ]; then
	echo "== fd: 1,100 idle keep-alive connections under RLIMIT_NOFILE 1024"
	start_server 1024
	"$work/limitsbench" idle -addr "$addr" -n 1100
	stop_server
fi

if [ "$what" = trickle ] || [ "$what" = all ]; then
	echo "== trickle: 1,000 connections trickling bodies under RLIMIT_NOFILE 1024"
	start_server 1024
	"$work/limitsbench" trickle -addr "$addr" -n 1000
	stop_server
fi

if [ "$what" = watchers ] || [ "$what" = all ]; then
	echo "== watchers: 2,000 that never read + 600 changes, then 300 resuming from 0"
	# One principal holds every watcher: raise its cap for the measurement.
	start_server "${WATCH_NOFILE:-8192}" REGISTRY_WATCH_MAX_PER_PRINCIPAL=5000
	token=$("$bin" token --sub measure --role admin | tail -n 1)
	"$work/limitsbench" watchers -addr "$addr" -token "$token" -pid "$server_pid" -n 2000 -changes 600 -resume 300
	stop_server
fi
