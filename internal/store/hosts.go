package store

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// hostsClaim is a claim of c.Count nodes in whole groups of c.PerHost, one
// group per host, from c.Hosts() hosts, all in one fabric when
// c.SameFabric. It reads host_free (migration 00013, keyed by fabric since
// 00020), never the fleet:
//
//   - with SameFabric, the first round trip ranks the fabrics by how many
//     hosts could hold a group: best fit is the fewest that still fits,
//     so big fabrics stay whole for big jobs;
//   - a lookup takes, of the hosts (of that fabric) whose class has
//     PerHost free matching nodes, the fewest free first (hosts with
//     exactly PerHost before the rest), skipping hosts another claimer
//     is trying (the gang claims' advisory lock on the host);
//   - a try, in a savepoint, locks PerHost free matching nodes of each of
//     those hosts (SKIP LOCKED, every filter checked on the rows) and
//     takes them only when every host gave its group; a try that falls
//     short is rolled back and its hosts are not tried again.
//
// A fabric that runs out of hosts not being claimed gives way to the next
// best. Like gangClaim it never shares a transaction.
type hostsClaim struct {
	*claiming
	fabrics []fabricFit // SameFabric: the fabrics to try, best fit first
	most    int         // SameFabric: the most hosts one fabric could give
	tried   []string    // hosts given up on
}

// fabricFit is a fabric and how many of its hosts could hold a group.
type fabricFit struct {
	name  string
	hosts int
}

// fabricsRanked is how many fabrics a claim ranks and tries at most.
const fabricsRanked = 16

func (h *hostsClaim) queue(b *pgx.Batch) {
	queueOwn(b, h.c.Job, h.owner, &h.owned)
	if h.c.SameFabric {
		h.queueRankFabrics(b)
	}
}

func (h *hostsClaim) shares() bool { return false }

func (h *hostsClaim) reset() {
	h.nodes, h.before, h.owned, h.fabrics, h.most, h.tried = nil, nil, false, nil, 0, nil
}

func (h *hostsClaim) settle(ctx context.Context, tx *pipeTx, b *pgx.Batch, actor registry.Actor, alone bool) (*pgx.Batch, bool, error) {
	if !h.owned {
		return nil, false, h.refused(alone)
	}
	b, err := h.place(ctx, tx, b)
	if err != nil {
		return nil, false, err
	}
	h.record(b, actor)
	return b, true, nil
}

// freeClasses is the union of host_free and the deltas not folded into it
// yet: each class's free count now, for the classes cond (a hostWhere on
// alias t) keeps. Classes with pending deltas are read by key, one
// lookup each, as hostCandidates reads them.
func freeClasses(cond string) string {
	return pendingClasses + `, c AS (
			SELECT t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric, t.free FROM host_free t
			WHERE ` + cond + ` AND (t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric) NOT IN
				(SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric FROM p)
			UNION ALL
			SELECT t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric, coalesce(b.free, 0) + t.delta
			FROM p t ` + foldedFree + `
			WHERE ` + cond + `
		)`
}

// pendingClasses is the CTE p: the classes with deltas not folded yet,
// and their sum.
const pendingClasses = `
		p AS MATERIALIZED (
			SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, sum(delta) AS delta
			FROM host_free_delta GROUP BY 1, 2, 3, 4, 5, 6
		)`

// foldedFree joins a pending class t to its folded count, b.free (NULL
// when host_free has none): one primary-key lookup per pending class,
// whatever the planner believes of host_free_delta's size.
const foldedFree = `LEFT JOIN LATERAL (
				SELECT h.free FROM host_free h
				WHERE (h.ip, h.hardware_generation, h.gpu_mem, h.cpu_mem, h.source, h.fabric) =
					(t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric)
				LIMIT 1
			) b ON true`

// queueRankFabrics queues the ranking of the fabrics by the number of
// hosts with a class of PerHost free matching nodes: those with Hosts()
// or more first, fewest first; then the others, most first (the first row
// is then the most one fabric has, which the conflict reports). It reads
// fabric_free (migration 00021: the counts as last folded, a few rows per
// fabric) and moves the classes with deltas not folded yet from their
// folded count to their count now. A host of several classes counts once
// per class that fits (the lookup then finds it once).
func (h *hostsClaim) queueRankFabrics(b *pgx.Batch) {
	if h.c.Filter.IP != nil {
		h.queueRankFabricsByHost(b) // fabric_free does not know addresses
		return
	}
	var q query
	q.classWhere("t", h.c.Filter)
	q.add("t.fabric <> ''")
	cond := q.cond()
	per, hosts := q.arg(h.c.PerHost), q.arg(h.c.Hosts())
	h.queueRank(b, `
		WITH `+pendingClasses+`, moved AS (
			SELECT t.fabric, coalesce(b.free, 0) AS was, coalesce(b.free, 0) + t.delta AS now
			FROM p t `+foldedFree+`
			WHERE `+cond+`
		), fit AS (
			SELECT fabric, sum(hosts) AS hosts FROM (
				SELECT t.fabric, t.hosts FROM fabric_free t WHERE t.free >= `+per+` AND `+cond+`
				UNION ALL
				SELECT fabric, -1 FROM moved WHERE was >= `+per+`
				UNION ALL
				SELECT fabric, 1 FROM moved WHERE now >= `+per+`
			) x GROUP BY fabric
		)`, hosts, q.args)
}

// queueRankFabricsByHost ranks as queueRankFabrics does, from the hosts'
// counts: for a filter by address.
func (h *hostsClaim) queueRankFabricsByHost(b *pgx.Batch) {
	var q query
	q.hostWhere("t", h.c.Filter, []string{})
	q.add("t.fabric <> ''")
	per, hosts := q.arg(h.c.PerHost), q.arg(h.c.Hosts())
	h.queueRank(b, `
		WITH `+freeClasses(q.cond())+`, fit AS (
			SELECT fabric, count(DISTINCT ip) AS hosts FROM c WHERE free >= `+per+` GROUP BY fabric
		)`, hosts, q.args)
}

// queueRank queues the ranking whose CTEs (with, ending in fit: fabric,
// hosts) count the hosts that fit per fabric; hosts is the placeholder of
// Hosts().
func (h *hostsClaim) queueRank(b *pgx.Batch, with, hosts string, args []any) {
	b.Queue(with+`
		SELECT fabric, hosts FROM fit WHERE hosts > 0
		ORDER BY hosts >= `+hosts+` DESC, CASE WHEN hosts >= `+hosts+` THEN hosts ELSE -hosts END, random()
		LIMIT `+strconv.Itoa(fabricsRanked), args...).Query(func(rows pgx.Rows) error {
		var f fabricFit
		_, err := pgx.ForEachRow(rows, []any{&f.name, &f.hosts}, func() error {
			h.most = max(h.most, f.hosts)
			if f.hosts >= h.c.Hosts() {
				h.fabrics = append(h.fabrics, f)
			}
			return nil
		})
		return err
	})
}

// place tries hosts until a try keeps its nodes, b being the next round
// trip's batch; it returns the batch that follows.
func (h *hostsClaim) place(ctx context.Context, tx *pipeTx, b *pgx.Batch) (*pgx.Batch, error) {
	want := h.c.Hosts()
	passedOver := false // a fabric was passed over for hosts other claimers were trying
	waits := 0
	for tries := 0; tries < maxHostsTried; tries++ {
		if h.caller.Err() != nil {
			return nil, errGroupCancelled
		}
		var fabric *string
		if h.c.SameFabric {
			if len(h.fabrics) == 0 && passedOver {
				// Every fabric that fits had hosts other claimers were
				// trying: rank again once some of them are done.
				waits = h.wait(waits)
				passedOver = false
				h.fabrics, h.most = nil, 0
				h.queueRankFabrics(b)
				if err := tx.send(ctx, b); err != nil {
					return nil, err
				}
				b = tx.batch()
			}
			if len(h.fabrics) == 0 {
				return nil, h.noFabric()
			}
			fabric = &h.fabrics[0].name
		}
		// The lookup's advisory locks are taken in the savepoint too: a
		// lookup that found too few hosts gives back those it locked, so
		// that they do not stay out of the other claimers' reach.
		// In a fabric (a few hundred hosts at most), the count of the
		// hosts that could hold a group, locked or not, comes with it.
		var classes []hostClass
		var fitting int
		b.Queue("savepoint host_try")
		if fabric != nil {
			h.queueFitting(b, fabric, &fitting)
		}
		h.queueHosts(b, fabric, want, &classes)
		if err := tx.send(ctx, b); err != nil {
			return nil, err
		}
		b = tx.batch()
		if len(classes) < want {
			// Too few hosts that no one else is trying: if there are
			// enough, locked or not, other claimers hold some and may
			// give them back; if not (hosts tried already), there are not.
			b.Queue("rollback to savepoint host_try")
			if fabric == nil { // counted now: the whole fleet's hosts, rarely
				h.queueFitting(b, nil, &fitting)
				if err := tx.send(ctx, b); err != nil {
					return nil, err
				}
				b = tx.batch()
			}
			others := fitting >= want
			switch {
			case fabric != nil:
				h.fabrics = h.fabrics[1:] // the next best, for now
				passedOver = passedOver || others
			case !others:
				return nil, h.notEnoughHosts()
			default:
				waits = h.wait(waits)
			}
			continue
		}
		var short []string
		h.queueTry(b, classes, &short)
		if err := tx.send(ctx, b); err != nil {
			return nil, err
		}
		b = tx.batch()
		if len(h.nodes) == h.c.Count {
			return b, nil
		}
		h.nodes, h.before = nil, nil
		b.Queue("rollback to savepoint host_try")
		if len(short) == 0 { // every group was whole, yet the claim took nothing: try others
			for _, c := range classes {
				short = append(short, c.ip)
			}
		}
		h.tried = append(h.tried, short...)
	}
	if h.c.SameFabric {
		return nil, h.noFabric()
	}
	return nil, h.notEnoughHosts()
}

// wait pauses before the next look when other claimers hold the hosts a
// claim could take: 1 ms, twice as long each time up to 64 ms (theirs
// take a few round trips). It answers the number of waits so far.
func (h *hostsClaim) wait(waits int) int {
	d := time.Millisecond << min(waits, 6)
	select {
	case <-time.After(d):
	case <-h.caller.Done():
	}
	return waits + 1
}

// queueFitting queues the count of the hosts (of fabric, when not nil)
// not tried yet that could hold a group, locked by other claimers or not:
// when a lookup finds too few and this says there are enough, it met
// other claimers, which may give hosts back.
func (h *hostsClaim) queueFitting(b *pgx.Batch, fabric *string, hosts *int) {
	var q query
	f := h.c.Filter
	if fabric != nil {
		f.Fabric = fabric
	}
	q.hostWhere("t", f, append([]string{}, h.tried...))
	b.Queue(`WITH `+freeClasses(q.cond())+` SELECT count(DISTINCT ip) FROM c WHERE free >= `+q.arg(h.c.PerHost), q.args...).
		QueryRow(func(row pgx.Row) error { return row.Scan(hosts) })
}

func (h *hostsClaim) noFabric() error {
	return registry.Coded(registry.ErrConflict, registry.CodeNoFabricFit,
		"no fabric has %d hosts with %d free matching node(s) that are not being claimed right now; the most in one fabric is %d",
		h.c.Hosts(), h.c.PerHost, h.most)
}

func (h *hostsClaim) notEnoughHosts() error {
	return registry.Coded(registry.ErrConflict, registry.CodeNotEnoughHosts,
		"fewer than %d hosts have %d free matching node(s) each that are not being claimed right now", h.c.Hosts(), h.c.PerHost)
}

// queueHosts queues the lookup of up to n classes (of fabric, when not
// nil) with PerHost or more free matching nodes, on distinct hosts not
// tried yet that no concurrent claimer is trying, fewest free first; it
// takes each returned host's advisory lock (hostLockClass). They are
// appended to out.
func (h *hostsClaim) queueHosts(b *pgx.Batch, fabric *string, n int, out *[]hostClass) {
	var q query
	f := h.c.Filter
	if fabric != nil {
		f.Fabric = fabric
	}
	q.hostWhere("t", f, append([]string{}, h.tried...)) // never a NULL array
	per := q.arg(h.c.PerHost)
	// Enough candidates to pass over the hosts other claimers hold: each
	// tries few at a time.
	candidates := strconv.Itoa(n + 4*hostCandidates)
	b.Queue(`
		WITH `+freeClasses(q.cond())+`
		SELECT host(ip), hardware_generation, gpu_mem, cpu_mem, source, fabric FROM (
			SELECT * FROM (
				SELECT DISTINCT ON (ip) * FROM (
					SELECT * FROM c WHERE free >= `+per+` ORDER BY free, ip LIMIT `+candidates+`
				) best ORDER BY ip, free
			) d ORDER BY free, ip
		) o
		-- In that order, and only until n are locked: a host another
		-- claimer holds is passed over, the rest are not locked.
		WHERE pg_try_advisory_xact_lock(`+strconv.Itoa(hostLockClass)+`, hashtext(host(ip)))
		LIMIT `+q.arg(n), q.args...).Query(func(rows pgx.Rows) error {
		var c hostClass
		_, err := pgx.ForEachRow(rows, []any{&c.ip, &c.hw, &c.gpuMem, &c.cpuMem, &c.source, &c.fabric}, func() error {
			*out = append(*out, c)
			return nil
		})
		return err
	})
}

// queueTry queues the claim of PerHost nodes of each class, all or none:
// per class, the lowest pks that match every filter and no one else is
// locking; the nodes are updated only when every class gave PerHost. A
// look ahead of it locks each class's group and appends to short the
// hosts whose class gave fewer (a node taken or cordoned since the
// lookup, or nodes that fail a filter the counts do not know, such as a
// selector): only those are not tried again.
func (h *hostsClaim) queueTry(b *pgx.Batch, classes []hostClass, short *[]string) {
	var q query
	with, pick := h.groups(&q, classes)
	b.Queue(`WITH `+with+`
		SELECT host(cls.c_ip) FROM cls LEFT JOIN LATERAL (`+pick+`) g ON true
		GROUP BY cls.c_ip HAVING count(g.pk) < `+q.arg(h.c.PerHost), q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*short, err = pgx.AppendRows(*short, rows, pgx.RowTo[string])
		return err
	})
	queueClaim(b, h.c, h.owner, func(q *query) string {
		with, pick := h.groups(q, classes)
		// The claim's pick (ORDER BY pk LIMIT count) takes the groups
		// the look locked: this transaction's own locks do not skip.
		q.add(`pk = ANY(ARRAY(SELECT g.pk FROM cls CROSS JOIN LATERAL (` + pick + `) g))`)
		return with
	}, &h.nodes, &h.before)
}

// groups is the CTE cls of the classes (c_ip, c_hw, c_gpu, c_cpu,
// c_source, c_fabric) and the statement that locks a class's group (for
// a LATERAL on cls), their arguments added to q.
func (h *hostsClaim) groups(q *query, classes []hostClass) (with, pick string) {
	ips := make([]string, len(classes))
	hws := make([]int64, len(classes))
	gpus := make([]int64, len(classes))
	cpus := make([]int64, len(classes))
	sources := make([]string, len(classes))
	fabrics := make([]string, len(classes))
	for i, c := range classes {
		ips[i], hws[i], gpus[i], cpus[i], sources[i], fabrics[i] = c.ip, c.hw, c.gpuMem, c.cpuMem, c.source, c.fabric
	}
	with = `cls AS (SELECT * FROM unnest(` + q.arg(ips) + `::inet[], ` + q.arg(hws) + `::bigint[], ` + q.arg(gpus) + `::bigint[], ` +
		q.arg(cpus) + `::bigint[], ` + q.arg(sources) + `::text[], ` + q.arg(fabrics) + `::text[])
		AS cls(c_ip, c_hw, c_gpu, c_cpu, c_source, c_fabric))`
	per := q.arg(h.c.PerHost)
	inner := query{args: q.args} // the same placeholders
	inner.where(h.c.Filter)
	inner.add("ip = cls.c_ip AND coalesce(hardware_generation, 0) = cls.c_hw AND coalesce(gpu_mem, -1) = cls.c_gpu" +
		" AND cpu_mem = cls.c_cpu AND source = cls.c_source AND coalesce(fabric, '') = cls.c_fabric")
	q.args = inner.args
	return with, `SELECT pk FROM nodes WHERE ` + inner.cond() + ` ORDER BY pk LIMIT ` + per + ` FOR UPDATE SKIP LOCKED`
}
