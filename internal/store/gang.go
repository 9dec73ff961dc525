package store

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// gangClaim is a claim of c.Count free matching nodes of one host
// (c.SameHost), best fit first, without reading the fleet: host_free
// (migration 00013) counts the free nodes of each class of each host, and
// the deltas not yet folded into it are added. Each try takes, of the
// first candidates, the first class whose host no concurrent claimer is
// trying (a transaction-level advisory lock, tried without waiting), then
// claims that class's nodes with SKIP LOCKED, re-checking every filter on
// the rows; a try that falls short is rolled back to its savepoint. Once
// no single class fits, hosts whose classes only together have c.Count are
// tried. At most maxHostsTried hosts are tried. It never shares a
// transaction: its tries take round trips of their own.
//
// The first try is the transaction's first round trip (BEGIN, the
// savepoint and the claim, whose statement looks the host up itself);
// later ones are two each: the lookup (with the rollback of the try
// before), then the savepoint and the claim.
type gangClaim struct {
	*claiming
	tried []string // hosts tried by lookup
}

func (g *gangClaim) queue(b *pgx.Batch) {
	queueOwn(b, g.c.Job, g.owner, &g.owned)
	g.queueTry(b, onFirstCandidate(g.c.Filter, g.c.Count))
}

func (g *gangClaim) shares() bool { return false }

func (g *gangClaim) reset() { g.nodes, g.owned, g.tried = nil, false, []string{} }

// settle tries more hosts until one has the nodes, and records them.
func (g *gangClaim) settle(ctx context.Context, tx *pipeTx, b *pgx.Batch, actor registry.Actor, alone bool) (*pgx.Batch, bool, error) {
	if !g.owned {
		return nil, false, g.refused(alone)
	}
	b, err := g.tryMore(ctx, tx, b)
	if err != nil {
		return nil, false, err
	}
	g.record(b, actor)
	return b, true, nil
}

// queueTry queues a try: a savepoint, and the claim of the nodes on
// narrows the filter to.
func (g *gangClaim) queueTry(b *pgx.Batch, on func(*query) string) {
	b.Queue("savepoint host_try")
	queueClaim(b, g.c, g.owner, on, &g.nodes, nil)
}

// kept reports whether the last try took c.Count nodes (its savepoint is
// then committed with the transaction); if not, it queues the savepoint's
// rollback on b, the next round trip.
func (g *gangClaim) kept(b *pgx.Batch) bool {
	if len(g.nodes) == g.c.Count {
		return true
	}
	g.nodes = nil
	b.Queue("rollback to savepoint host_try")
	return false
}

// try sends a try narrowed by on with what b holds, and returns the batch
// of the next round trip and whether the try kept its nodes.
func (g *gangClaim) try(ctx context.Context, tx *pipeTx, b *pgx.Batch, on func(*query) string) (*pgx.Batch, bool, error) {
	g.queueTry(b, on)
	if err := tx.send(ctx, b); err != nil {
		return nil, false, err
	}
	b = tx.batch()
	return b, g.kept(b), nil
}

// tryMore goes on from the first try, b being the next round trip's
// batch, until a try keeps its nodes; it returns the batch that follows.
// Which host the first try tried is not known: it may be tried again.
func (g *gangClaim) tryMore(ctx context.Context, tx *pipeTx, b *pgx.Batch) (*pgx.Batch, error) {
	if g.kept(b) {
		return b, nil
	}
	for len(g.tried) < maxHostsTried {
		if g.caller.Err() != nil { // its statements no longer stop when the caller goes (runTx)
			return nil, errGroupCancelled
		}
		var h hostClass
		found := false
		sql, args := hostCandidatesQuery(g.c.Filter, g.c.Count, g.tried)
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&h.ip, &h.hw, &h.gpuMem, &h.cpuMem, &h.source, &h.fabric)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
		if err := tx.send(ctx, b); err != nil {
			return nil, err
		}
		if b = tx.batch(); !found {
			break
		}
		g.tried = append(g.tried, h.ip)
		var ok bool
		var err error
		if b, ok, err = g.try(ctx, tx, b, func(q *query) string { h.nodes(q); return "" }); err != nil || ok {
			return b, err
		}
	}
	if g.c.Count > 1 && len(g.tried) < maxHostsTried {
		var hosts []string
		g.queueMixedHosts(b, &hosts)
		if err := tx.send(ctx, b); err != nil {
			return nil, err
		}
		b = tx.batch()
		for _, h := range hosts {
			var ok bool
			var err error
			if b, ok, err = g.try(ctx, tx, b, func(q *query) string { q.add("ip = " + q.arg(h) + "::inet"); return "" }); err != nil || ok {
				return b, err
			}
		}
	}
	return nil, registry.Coded(registry.ErrConflict, registry.CodeNoSingleHost, "no single host has %d free matching node(s) that are not being claimed right now", g.c.Count)
}

// queueMixedHosts queues the lookup of hosts not tried yet whose classes
// only together have c.Count free matching nodes (nodes of one host with
// different memory or hardware, all matching), fewest first; they are
// appended to hosts.
func (g *gangClaim) queueMixedHosts(b *pgx.Batch, hosts *[]string) {
	var q query
	q.hostWhere("t", g.c.Filter, g.tried)
	b.Queue(`
		SELECT host(t.ip) FROM (
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, free FROM host_free
			UNION ALL
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta FROM host_free_delta
		) t
		WHERE `+q.cond()+`
		GROUP BY t.ip
		HAVING count(DISTINCT (t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric)) > 1 AND sum(t.free) >= `+q.arg(g.c.Count)+`
		ORDER BY sum(t.free) LIMIT `+q.arg(maxHostsTried-len(g.tried)), q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*hosts, err = pgx.AppendRows(*hosts, rows, pgx.RowTo[string])
		return err
	})
}

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
	fabric string // '' for none
}

// nodes narrows a node query to the class.
func (h hostClass) nodes(q *query) {
	q.add("ip = " + q.arg(h.ip) + "::inet")
	q.add("coalesce(hardware_generation, 0) = " + q.arg(h.hw))
	q.add("coalesce(gpu_mem, -1) = " + q.arg(h.gpuMem))
	q.add("cpu_mem = " + q.arg(h.cpuMem))
	q.add("source = " + q.arg(h.source))
	q.add("coalesce(fabric, '') = " + q.arg(h.fabric))
}

// hostWhere is the part of f a class of host_free, aliased t, can answer:
// the attributes it is keyed by. The rest (seen_within, index, pk) only
// the nodes can, so pick checks them; free and state are what the table
// counts. Hosts already tried are left out.
func (q *query) hostWhere(t string, f registry.NodeFilter, tried []string) {
	q.add(t + ".ip <> ALL(" + q.arg(tried) + "::inet[])")
	if f.IP != nil {
		q.ipWhere(t+".ip", *f.IP)
	}
	q.classWhere(t, f)
}

// classWhere is the part of f a class's attributes answer, whatever its
// host: hostWhere without the address.
func (q *query) classWhere(t string, f registry.NodeFilter) {
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
	if f.Fabric != nil {
		q.add(t + ".fabric = " + q.arg(*f.Fabric))
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
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, sum(delta) AS delta
			FROM host_free_delta GROUP BY 1, 2, 3, 4, 5, 6
		), c AS (
			(SELECT b.ip, b.hardware_generation, b.gpu_mem, b.cpu_mem, b.source, b.fabric, b.free FROM host_free b
			 WHERE b.free >= ` + n + ` AND ` + baseCond + `
			   AND (b.ip, b.hardware_generation, b.gpu_mem, b.cpu_mem, b.source, b.fabric) NOT IN
			       (SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric FROM p)
			 ORDER BY b.free LIMIT ` + strconv.Itoa(hostCandidates) + `)
			UNION ALL
			-- One primary-key lookup per pending class, whatever the
			-- planner believes of host_free_delta's size (docs/design.md).
			SELECT p.ip, p.hardware_generation, p.gpu_mem, p.cpu_mem, p.source, p.fabric, coalesce(b.free, 0) + p.delta
			FROM p LEFT JOIN LATERAL (
				SELECT h.free FROM host_free h
				WHERE (h.ip, h.hardware_generation, h.gpu_mem, h.cpu_mem, h.source, h.fabric) = (p.ip, p.hardware_generation, p.gpu_mem, p.cpu_mem, p.source, p.fabric)
				LIMIT 1 -- the key is unique; the LIMIT keeps the planner from turning this back into a join
			) b ON true
			WHERE coalesce(b.free, 0) + p.delta >= ` + n + ` AND ` + pendingCond + `
		)
		SELECT ` + ipExpr + ` AS ip, hardware_generation, gpu_mem, cpu_mem, source, fabric
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
		q.add("coalesce(fabric, '') = (SELECT fabric FROM host)")
		return with
	}
}
