package connlimit

// ReserveExtra is what the derived limit leaves, beyond the database pool,
// for every other descriptor the process holds: the LISTEN and sync
// sessions, the embedded PostgreSQL's pipes, the listener itself, log and
// data files, refused connections still being answered, and headroom.
const ReserveExtra = 64

// MinLimit is the smallest limit FromNoFile returns, however low the
// descriptor limit: below it the server could hardly serve at all.
const MinLimit = 16

// Reserve is how many descriptors to keep out of the connection limit
// for a database pool of poolSize connections.
func Reserve(poolSize int) int { return max(poolSize, 0) + ReserveExtra }

// FromNoFile derives the connection limit from the soft RLIMIT_NOFILE:
// nofile minus reserve, at least MinLimit and at most 1<<24.
func FromNoFile(nofile uint64, reserve int) int {
	const ceiling = 1 << 24
	if nofile > ceiling {
		nofile = ceiling
	}
	return max(int(nofile)-reserve, MinLimit)
}
