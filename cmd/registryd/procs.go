package main

import (
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// procsFactor is how many Go Ps serve runs per core when PostgreSQL shares
// the machine with it.
//
// Why more Ps than cores: the kernel shares a core between runnable
// threads, not between processes. With only as many threads as cores, a
// request that arrives while every one of them has lost its core to a
// PostgreSQL backend (or anything else busy) waits out the scheduler's
// slices, however little work it needs. Measured at 100,000 nodes on two
// cores with the load generator on them too (docs/benchmarks.md): twice the
// Ps halved the p99 of reads served from memory (retrieve 17-19 ms to 8-9
// ms, a page of free nodes 23 to 14 ms) for a few percent of their rate.
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
