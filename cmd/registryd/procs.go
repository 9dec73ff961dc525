package main

import (
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// procsFactor is how many Go Ps serve runs per core when PostgreSQL shares
// the machine with it. The kernel shares a core between runnable threads,
// not between processes: with only as many threads as cores, a request
// that arrives while each has lost its core to a PostgreSQL backend waits
// out the scheduler's slices, however little work it needs (see
// docs/operating.md; figures in docs/benchmarks.md).
const procsFactor = 2

// procsPlan decides serve's GOMAXPROCS. current is the runtime's value,
// cpus the machine's cores, envSet whether GOMAXPROCS was given, local
// whether PostgreSQL runs on this machine. It returns current unless the
// database shares these cores and nothing chose the value already: a
// GOMAXPROCS of the operator's, or a container's CPU limit, which the Go
// runtime already applied (current below cpus) and which more Ps than the
// limit would only spend faster, to be throttled for the rest of the
// period.
func procsPlan(current, cpus int, envSet, local bool) int {
	if envSet || !local || current < cpus {
		return current
	}
	return cpus * procsFactor
}

// databaseIsLocal reports whether REGISTRY_DATABASE_URL names a PostgreSQL
// on this machine: a unix socket or a loopback address. "" is the embedded
// default, which always is.
func databaseIsLocal(url string) bool {
	if url == "" {
		return true
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return false
	}
	return hostIsLocal(cfg.Host)
}

func hostIsLocal(host string) bool {
	if strings.HasPrefix(host, "/") || strings.EqualFold(host, "localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}
