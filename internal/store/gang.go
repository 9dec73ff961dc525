package store

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// maxHostsTried bounds how many candidate hosts a same-host claim tries
// before it gives up with a conflict.
const maxHostsTried = 32

// hostClass is a class of host_free (migration 00013): the free nodes of
// one host that share every attribute a claim filters on by value, NULLs
// stored as 0 (hardware generation) and -1 (gpu_mem).
type hostClass struct {
	ip     string
	hw     int64
	gpuMem int64
	cpuMem int64
	source string
}

// nodes narrows a node query to the class.
func (h hostClass) nodes(q *query) {
	q.add("ip = " + q.arg(h.ip) + "::inet")
	q.add("coalesce(hardware_generation, 0) = " + q.arg(h.hw))
	q.add("coalesce(gpu_mem, -1) = " + q.arg(h.gpuMem))
	q.add("cpu_mem = " + q.arg(h.cpuMem))
	q.add("source = " + q.arg(h.source))
}

// hostWhere is the part of f a class of host_free, aliased t, can answer:
// the attributes it is keyed by. The rest (seen_within, index, pk) only
// the nodes can, so pick checks them; free and state are what the table
// counts. Hosts already tried are left out.
func (q *query) hostWhere(t string, f registry.NodeFilter, tried []string) {
	q.add(t + ".ip <> ALL(" + q.arg(tried) + "::inet[])")
	if f.HardwareGeneration != nil {
		q.add(t + ".hardware_generation = " + q.arg(*f.HardwareGeneration))
	}
	if f.MinGPUMem != nil {
		q.add(t + ".gpu_mem >= " + q.arg(*f.MinGPUMem))
	}
	if f.MinCPUMem != nil {
		q.add(t + ".cpu_mem >= " + q.arg(*f.MinCPUMem))
	}
	if f.Source != nil {
		q.add(t + ".source = " + q.arg(*f.Source))
	}
	if f.IP != nil {
		q.add(t + ".ip = " + q.arg(*f.IP) + "::inet")
	}
}

// hostLockClass keys the transaction-level advisory locks a gang claim
// takes on the hosts it tries ("host"; the two-int form, a key space of
// its own apart from the store's bigint advisory locks). A hash collision
// only makes a claimer pass over a host.
const hostLockClass = 0x686f7374

// hostCandidates is the number of classes a gang claim reads per try before
// it takes the first one no other claimer is trying.
const hostCandidates = 64

// hostCandidatesQuery is the statement a gang claim's try runs: the first
// class with count or more free matching nodes, fewest first, whose host
// no concurrent claimer is trying (it takes that host's advisory lock),
// leaving out hosts already tried. Classes without unfolded deltas come
// from host_free's index on the count; those with deltas are summed.
func hostCandidatesQuery(f registry.NodeFilter, count int, tried []string) (string, []any) {
	var q query
	sql := q.hostCandidates(f, count, tried, "host(ip)")
	return sql, q.args
}

// hostCandidates is hostCandidatesQuery's statement with its arguments in
// q, selecting ip as ipExpr.
func (q *query) hostCandidates(f registry.NodeFilter, count int, tried []string, ipExpr string) string {
	n := q.arg(count)
	saved := q.conds
	q.conds = nil
	q.hostWhere("b", f, tried)
	baseCond := q.cond()
	q.conds = nil
	q.hostWhere("p", f, tried)
	pendingCond := q.cond()
	q.conds = saved
	return `
		WITH p AS MATERIALIZED (
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, sum(delta) AS delta
			FROM host_free_delta GROUP BY 1, 2, 3, 4, 5
		), c AS (
			(SELECT b.ip, b.hardware_generation, b.gpu_mem, b.cpu_mem, b.source, b.free FROM host_free b
			 WHERE b.free >= ` + n + ` AND ` + baseCond + `
			   AND (b.ip, b.hardware_generation, b.gpu_mem, b.cpu_mem, b.source) NOT IN
			       (SELECT ip, hardware_generation, gpu_mem, cpu_mem, source FROM p)
			 ORDER BY b.free LIMIT ` + strconv.Itoa(hostCandidates) + `)
			UNION ALL
			-- One primary-key lookup per pending class, whatever the
			-- planner believes of host_free_delta's size (its statistics
			-- swing from a bulk import's thousands of rows to a handful: a
			-- hash join on a stale estimate read all of host_free, 0.1 s
			-- a claim at 1,000,000 nodes).
			SELECT p.ip, p.hardware_generation, p.gpu_mem, p.cpu_mem, p.source, coalesce(b.free, 0) + p.delta
			FROM p LEFT JOIN LATERAL (
				SELECT h.free FROM host_free h
				WHERE (h.ip, h.hardware_generation, h.gpu_mem, h.cpu_mem, h.source) = (p.ip, p.hardware_generation, p.gpu_mem, p.cpu_mem, p.source)
				LIMIT 1 -- the key is unique; the LIMIT keeps the planner from turning this back into a join
			) b ON true
			WHERE coalesce(b.free, 0) + p.delta >= ` + n + ` AND ` + pendingCond + `
		)
		SELECT ` + ipExpr + ` AS ip, hardware_generation, gpu_mem, cpu_mem, source
		FROM (SELECT * FROM c ORDER BY free LIMIT ` + strconv.Itoa(hostCandidates) + `) c
		WHERE pg_try_advisory_xact_lock(` + strconv.Itoa(hostLockClass) + `, hashtext(host(ip)))
		LIMIT 1`
}

// onFirstCandidate narrows a claim to the class hostCandidatesQuery finds
// first (nothing, when it finds none), in the same statement: the lookup
// becomes the claim's CTE "host".
func onFirstCandidate(f registry.NodeFilter, count int) func(q *query) string {
	return func(q *query) string {
		with := `host AS MATERIALIZED (` + q.hostCandidates(f, count, []string{}, "ip") + `)`
		q.add("ip = (SELECT ip FROM host)")
		q.add("coalesce(hardware_generation, 0) = (SELECT hardware_generation FROM host)")
		q.add("coalesce(gpu_mem, -1) = (SELECT gpu_mem FROM host)")
		q.add("cpu_mem = (SELECT cpu_mem FROM host)")
		q.add("source = (SELECT source FROM host)")
		return with
	}
}

// claimOneHost claims c.Count free matching nodes of one host, without
// reading the fleet: host_free (migration 00013) counts the free nodes of
// each class of each host, and its index on the count leads to the classes
// with c.Count or more, fewest first (best fit, so whole hosts stay whole
// for larger gangs); the deltas not yet folded into it are added. Each try
// takes, of the first candidates, the first class whose host no concurrent
// claimer is trying (a transaction-level advisory lock, tried without
// waiting), so concurrent claimers spread over different hosts instead of
// queueing for the first; it then claims that class's nodes with SKIP
// LOCKED, re-checking every filter on the rows. A try that falls short is
// rolled back to its savepoint, giving back its row locks. A host whose
// classes only together have c.Count (nodes of one host with different
// memory or hardware, all matching) is looked for by a grouped read of
// the counts once no single class fits. At most maxHostsTried hosts are
// tried.
//
// The first try is one round trip: BEGIN, the savepoint and the claim,
// whose statement looks the host up itself. Later ones are two: the
// lookup (with the rollback of the try before), then the savepoint and
// the claim. It returns the nodes and the batch for the transaction's
// next round trip.
func (tx *pipeTx) claimOneHost(ctx context.Context, c registry.Claim) ([]registry.Node, *pgx.Batch, error) {
	tried := []string{}
	b := tx.batch()
	// try claims the nodes on narrows c.Filter to, in a savepoint, with
	// what b holds; it keeps the claim if it took c.Count nodes, and
	// otherwise queues the savepoint's rollback on the next batch (b).
	try := func(on func(*query) string) ([]registry.Node, error) {
		b.Queue("savepoint host_try")
		var out []registry.Node
		queueClaim(b, c, on, &out)
		if err := tx.send(ctx, b); err != nil {
			return nil, err
		}
		b = tx.batch()
		if len(out) == c.Count {
			return out, nil // the savepoint is committed with the transaction
		}
		b.Queue("rollback to savepoint host_try")
		return nil, nil
	}
	// The first try looks its host up in the claim's own statement. When
	// it falls short, which host it tried is not known: the tries go on a
	// round trip each, and may try that host once more.
	if out, err := try(onFirstCandidate(c.Filter, c.Count)); err != nil || out != nil {
		return out, b, err
	}
	for len(tried) < maxHostsTried {
		sql, args := hostCandidatesQuery(c.Filter, c.Count, tried)
		var h hostClass
		found := false
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&h.ip, &h.hw, &h.gpuMem, &h.cpuMem, &h.source)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
		if err := tx.send(ctx, b); err != nil {
			return nil, nil, err
		}
		b = tx.batch()
		if !found {
			break
		}
		tried = append(tried, h.ip)
		out, err := try(func(q *query) string { h.nodes(q); return "" })
		if err != nil || out != nil {
			return out, b, err
		}
	}
	if c.Count > 1 && len(tried) < maxHostsTried {
		var q query
		q.hostWhere("t", c.Filter, tried)
		var hosts []string
		b.Queue(`
			SELECT host(t.ip) FROM (
				SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, free FROM host_free
				UNION ALL
				SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, delta FROM host_free_delta
			) t
			WHERE `+q.cond()+`
			GROUP BY t.ip
			HAVING count(DISTINCT (t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source)) > 1 AND sum(t.free) >= `+q.arg(c.Count)+`
			ORDER BY sum(t.free) LIMIT `+q.arg(maxHostsTried-len(tried)), q.args...).Query(func(rows pgx.Rows) error {
			var err error
			hosts, err = pgx.AppendRows(hosts, rows, pgx.RowTo[string])
			return err
		})
		if err := tx.send(ctx, b); err != nil {
			return nil, nil, err
		}
		b = tx.batch()
		for _, h := range hosts {
			out, err := try(func(q *query) string { q.add("ip = " + q.arg(h) + "::inet"); return "" })
			if err != nil || out != nil {
				return out, b, err
			}
		}
	}
	return nil, nil, registry.Conflictf("no single host has %d free matching node(s) that are not being claimed right now", c.Count)
}
