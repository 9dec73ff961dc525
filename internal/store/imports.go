package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// importLocks key the per-provider advisory locks that serialize applies
// of one provider's inventory, whichever replica runs them.
var importLocks = map[string]int64{"scp": 0x7265676973740001, "e2e": 0x7265676973740002}

// importChunk is how many nodes one statement of an import pass writes
// (and how many the pass holds in memory at once beyond the inventory).
const importChunk = 10_000

type importChunkKey struct{}

// chunkOf is the chunk size of the pass running under ctx: importChunk,
// or a test's own (export_test.go).
func chunkOf(ctx context.Context) int {
	if n, ok := ctx.Value(importChunkKey{}).(int); ok && n > 0 {
		return n
	}
	return importChunk
}

// ApplyImport makes the nodes of provider source match an inventory, in one
// transaction:
//
//   - a pair the provider reports and nobody has: inserted (no owner, empty
//     driver_version, schedulable while the host runs);
//   - a pair that exists, registered through the API or imported by this
//     provider: what the provider knows (memory, hardware generation, state,
//     external id) is updated; what agents report (driver_version, last_seen,
//     owner) and what schedulers hold (current_job) is never touched;
//   - a pair another provider imported: left alone and reported as a conflict;
//   - a node of this provider the inventory no longer has: deleted when free;
//     kept, unschedulable and marked gone while it holds a job, and deleted
//     by the first pass after its release;
//   - unless its external id is one of skipped (a host the provider still
//     reports but this pass could not map) or under one ("cluster" covers
//     "cluster/worker"): then it is left as it is;
//   - and unless ctx carries a mass-removal guard (registry.WithRemovalGuard) that
//     the pass's removals exceed: then every node the inventory no longer
//     names is left as it is, counted in ImportResult.Withheld.
//
// Every change is audited under actor and appears on the watch feed.
//
// A pass costs what it changes, not what the fleet holds: only the pairs
// to insert and the nodes that may need a write come back from the
// comparison, and the writes go in chunks of importChunk nodes, so the
// memory a pass takes beyond the inventory stays bounded (docs/design.md).
func (s *Store) ApplyImport(ctx context.Context, actor registry.Actor, source string, nodes []registry.ImportedNode, skipped []string) (registry.ImportResult, error) {
	var res registry.ImportResult
	if _, ok := importLocks[source]; !ok {
		return res, registry.Invalidf("unknown import source %q", source)
	}
	chunk := chunkOf(ctx)
	// A pass over a large inventory may take its statements long; it is
	// bounded as a whole by the caller (REGISTRY_SYNC_TIMEOUT).
	ctx = withoutStatementTimeout(ctx)
	var folded int64
	err := s.WithTx(ctx, func(tx *Store) error {
		res = registry.ImportResult{}
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, importLocks[source]); err != nil {
			return err
		}
		hw, err := tx.ensureHardware(ctx, actor, nodes, &res)
		if err != nil {
			return err
		}
		want := dedupImport(nodes) // indexes into nodes, first of each pair
		sets := labelSetsOf(nodes)
		if err := tx.stageImport(ctx, nodes, want, hw, sets); err != nil {
			return err
		}
		inserts, candidates, err := tx.compareImport(ctx, source)
		if err != nil {
			return err
		}
		// What the comparison did not return holds what the provider says.
		res.Unchanged = len(want) - len(inserts)
		for _, c := range candidates {
			if c.seq >= 0 {
				res.Unchanged--
			}
		}
		guard, guarded := registry.RemovalGuardOf(ctx)
		if guarded { // the provider's nodes before the pass adds any
			if err := tx.db.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE source = $1`, source).Scan(&res.Total); err != nil {
				return err
			}
		}
		for c := range slices.Chunk(inserts, chunk) {
			if err := tx.importInsert(ctx, actor, source, hw, sets, nodes, c, &res); err != nil {
				return err
			}
		}
		p := registry.ImportPlan{Source: source, Skipped: skipped, HW: hw}
		if guarded {
			away, err := tx.removals(ctx, p, candidates, chunk)
			if err != nil {
				return err
			}
			if p.HoldRemovals = guard.Holds(away, res.Total); p.HoldRemovals {
				doc := map[string]any{"provider": source, "would_take_away": away, "of": res.Total,
					"max_percent": guard.MaxPercent, "pass": guard.Pass(away), "passes": guard.Passes}
				b, _ := json.Marshal(doc)
				if _, err := tx.db.Exec(ctx, `
					INSERT INTO audit_log (principal, role, action, target_type, target_pk, after)
					VALUES ($1, $2, $3, 'provider', NULL, $4)`, actor.Sub, string(actor.Role), registry.ActionSyncRemovalsHeld, string(b)); err != nil {
					return err
				}
			}
		}
		for c := range slices.Chunk(candidates, chunk) {
			if err := tx.importChanges(ctx, actor, p, nodes, c, &res); err != nil {
				return err
			}
		}
		// What the pass wrote is made ready for the claims before anyone
		// sees it: its free counts folded (else every gang claim sums the
		// pass's one delta a host until the sweeper has folded them).
		folded, err = tx.foldAllDeltas(ctx)
		return err
	})
	if err != nil {
		if _, ok := err.(*registry.Error); ok {
			return res, err
		}
		return res, fmt.Errorf("store: import %s: %w", source, translate(err))
	}
	// The space of the folded deltas is the sweeper's to reclaim when this
	// fails (a role that does not own the table): the pass itself is done.
	_ = s.vacuumDeltas(ctx, folded)
	if written := res.Added + res.Updated + res.Removed; written >= chunk && !s.inTx {
		// A pass that wrote a chunk's worth of nodes has the nodes table's
		// statistics taken again at once (else the planner plans for the
		// fleet before it until autovacuum's analyze, a minute or more
		// later). After the commit: ANALYZE's figures are not undone by a
		// rollback, and it may wait for a vacuum of the table. Best effort.
		_, _ = s.db.Exec(ctx, `ANALYZE nodes`)
		// A pass that wrote a fifth of the fleet or more (a first import)
		// has the nodes table vacuumed now rather than by autovacuum a
		// minute or more later, throttled: until then the first read of
		// each page sets its rows' hint bits, and the reads that write
		// those pages back take up to a second at a million nodes
		// (docs/benchmarks-history.md). Best effort, as above.
		var rows float64
		if err := s.db.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'nodes'::regclass`).Scan(&rows); err == nil && float64(written)*5 >= rows {
			_, _ = s.db.Exec(ctx, `VACUUM nodes`)
		}
	}
	return res, nil
}

// removals returns how many nodes the pass would take away (remove, or
// mark gone): the candidates the inventory no longer names, decided as
// the pass would.
func (s *Store) removals(ctx context.Context, p registry.ImportPlan, cands []importCandidate, chunk int) (int, error) {
	var vanished []int64
	for _, c := range cands {
		if c.seq < 0 {
			vanished = append(vanished, c.pk)
		}
	}
	away := 0
	for pks := range slices.Chunk(vanished, chunk) {
		nodes, err := collectRows(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE pk = ANY($1)`, pks)
		if err != nil {
			return 0, err
		}
		for _, n := range nodes {
			if k := p.Decide(n).Kind; k == registry.ImportRemove || k == registry.ImportMarkGone {
				away++
			}
		}
	}
	return away, nil
}

// dedupImport returns the positions in nodes of the first node of each
// (ip, index) pair: a provider listing a host twice must not double a GPU.
func dedupImport(nodes []registry.ImportedNode) []int32 {
	out := make([]int32, 0, len(nodes))
	// A host's GPUs are a handful of small indexes: one bit each per
	// address keeps the set small at a million nodes.
	low := make(map[string]uint64, len(nodes)/8+1)
	var high map[registry.ImportKey]bool
	for i, n := range nodes {
		if n.Index >= 0 && n.Index < 64 {
			bit := uint64(1) << n.Index
			if low[n.IP]&bit != 0 {
				continue
			}
			low[n.IP] |= bit
		} else {
			k := registry.ImportKey{IP: n.IP, Index: n.Index}
			if high[k] {
				continue
			}
			if high == nil {
				high = map[registry.ImportKey]bool{}
			}
			high[k] = true
		}
		out = append(out, int32(i))
	}
	return out
}

// importLabels are the distinct label sets of an inventory, numbered
// from 0: a provider labels a pool or a fabric alike, so a million nodes
// carry a few hundred sets, staged once each (import_labels) rather than
// once per node.
type importLabels struct {
	sets []registry.Labels
	ids  map[registry.Labels]int32
}

// labelSetsOf numbers the provider's (reserved) labels of nodes.
func labelSetsOf(nodes []registry.ImportedNode) *importLabels {
	l := &importLabels{ids: map[registry.Labels]int32{}}
	for _, n := range nodes {
		l.id(n.Labels)
	}
	return l
}

// id is the number of labels' reserved part.
func (l *importLabels) id(labels registry.Labels) int32 {
	labels = registry.Labels{}.WithReserved(labels)
	id, ok := l.ids[labels]
	if !ok {
		id = int32(len(l.sets))
		l.ids[labels] = id
		l.sets = append(l.sets, labels)
	}
	return id
}

// stageImport copies the inventory's nodes at positions want into the
// temporary table import_want, and its label sets into import_labels,
// both dropped at the end of the transaction.
func (s *Store) stageImport(ctx context.Context, nodes []registry.ImportedNode, want []int32, hw map[string]int64, sets *importLabels) error {
	if _, err := s.db.Exec(ctx, `
		CREATE TEMPORARY TABLE import_want (
			seq integer NOT NULL, ip inet NOT NULL, idx integer NOT NULL, cpu bigint NOT NULL, gpu bigint, hw bigint,
			run boolean NOT NULL, state text NOT NULL, ext text NOT NULL,
			model text, fab text, lid integer NOT NULL
		) ON COMMIT DROP`); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, `
		CREATE TEMPORARY TABLE import_labels (id integer PRIMARY KEY, labels jsonb NOT NULL, nres integer NOT NULL) ON COMMIT DROP`); err != nil {
		return err
	}
	texts := make([]string, len(sets.sets))
	counts := make([]int32, len(sets.sets))
	for i, l := range sets.sets {
		texts[i], counts[i] = l.String(), int32(l.Len())
	}
	if _, err := s.db.Exec(ctx, `INSERT INTO import_labels (id, labels, nres)
		SELECT i - 1, l, n FROM unnest($1::jsonb[], $2::int[]) WITH ORDINALITY AS u(l, n, i)`, texts, counts); err != nil {
		return err
	}
	i := -1
	var ip netip.Addr
	lastIP := ""
	_, err := s.db.CopyFrom(ctx, pgx.Identifier{"import_want"},
		[]string{"seq", "ip", "idx", "cpu", "gpu", "hw", "run", "state", "ext", "model", "fab", "lid"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i++; i == len(want) {
				return nil, nil
			}
			n := nodes[want[i]]
			if n.IP != lastIP { // a host's GPUs share their address
				var err error
				if ip, err = netip.ParseAddr(n.IP); err != nil {
					return nil, registry.Invalidf("import: address %q: %v", n.IP, err)
				}
				lastIP = n.IP
			}
			return []any{want[i], ip, int32(n.Index), n.CPUMem, n.GPUMem, registry.HardwareOf(hw, n.GPUModel),
				n.Running, n.State, n.ExternalID, nonEmpty(n.GPUModel), nonEmpty(n.Fabric), sets.id(n.Labels)}, nil
		}))
	if err != nil {
		return err
	}
	// Temporary tables are never analyzed on their own; the comparison's
	// plan needs to know the inventory's size.
	_, err = s.db.Exec(ctx, `ANALYZE import_want`)
	return err
}

// nonEmpty is s, or nil for "".
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// compareImport returns the inventory's pairs no node holds (positions in
// the inventory, in its order) and the nodes a pass may have to write, in
// pk order: the provider's nodes the inventory no longer has, and the
// nodes at its pairs that do not hold what it says (or belong to another
// source). With each candidate comes its position in the inventory, -1
// when the inventory does not name it. What makes a node "hold what the
// provider says" is registry.ImportUpdate.Same, spelled in SQL; the plan
// decides again on every candidate, so this only has to keep every node
// Same would call different (TestApplyImportNoticesEveryField).
func (s *Store) compareImport(ctx context.Context, source string) (inserts []int32, candidates []importCandidate, err error) {
	rows, err := s.db.Query(ctx, `
		SELECT w.seq, n.pk FROM import_want w JOIN import_labels il ON il.id = w.lid
		LEFT JOIN nodes n ON n.ip = w.ip AND n.gpu_index = w.idx
		WHERE n.pk IS NULL
		   OR (n.source = $1 AND n.cpu_mem = w.cpu AND n.gpu_mem IS NOT DISTINCT FROM w.gpu
		       AND n.hardware_generation IS NOT DISTINCT FROM w.hw AND n.schedulable = w.run
		       AND n.provider_state = w.state AND n.external_id = w.ext
		       AND (n.fabric = w.fab OR w.fab IS NULL AND (n.fabric IS NULL OR n.owner IS NOT NULL))
		       AND (w.model IS NULL OR n.gpu_model = w.model OR n.owner IS NOT NULL AND n.gpu_model IS NOT NULL)
		       -- The provider's labels and no other reserved ones: every
		       -- reserved key has registryd.io/ in it (a few own ones may
		       -- too, which only makes the node a candidate).
		       AND (n.labels = il.labels OR n.labels @> il.labels AND il.nres =
		            (SELECT count(*) FROM jsonb_object_keys(n.labels) k WHERE k LIKE '%registryd.io/%'))) IS NOT TRUE
		UNION ALL
		SELECT -1, n.pk FROM nodes n
		WHERE n.source = $1 AND NOT EXISTS (SELECT FROM import_want w WHERE w.ip = n.ip AND w.idx = n.gpu_index)`, source)
	if err != nil {
		return nil, nil, err
	}
	var seq int32
	var pk *int64
	_, err = pgx.ForEachRow(rows, []any{&seq, &pk}, func() error {
		if pk == nil {
			inserts = append(inserts, seq)
		} else {
			candidates = append(candidates, importCandidate{pk: *pk, seq: seq})
		}
		return nil
	})
	slices.Sort(inserts)
	slices.SortFunc(candidates, func(a, b importCandidate) int { return cmp.Compare(a.pk, b.pk) })
	return inserts, candidates, err
}

// importCandidate is a node an import pass may write: its pk, and the
// position in the inventory of what the provider says about it (-1: the
// inventory does not name it).
type importCandidate struct {
	pk  int64
	seq int32
}

// importChanges decides on and writes one chunk of candidates. It reads
// them without locks, so a pass never holds up claims on rows it leaves
// alone; then it locks just the rows it will write, in pk order (the order
// claims and releases lock in; chunks come in pk order too), and decides
// again from what they hold now.
func (s *Store) importChanges(ctx context.Context, actor registry.Actor, p registry.ImportPlan, nodes []registry.ImportedNode, cands []importCandidate, res *registry.ImportResult) error {
	pks := make([]int64, len(cands))
	p.Want = make(map[registry.ImportKey]registry.ImportedNode, len(cands))
	for i, c := range cands {
		pks[i] = c.pk
		if c.seq >= 0 {
			n := nodes[c.seq]
			p.Want[registry.ImportKey{IP: n.IP, Index: n.Index}] = n
		}
	}
	existing, err := collectRows(ctx, s.db, scanNode, `
		SELECT `+withLiveness("nodes")+` FROM nodes LEFT JOIN node_liveness l ON l.node_pk = nodes.pk
		WHERE pk = ANY($1) ORDER BY pk`, pks)
	if err != nil {
		return err
	}
	var writers []int64
	for _, n := range existing {
		if d := p.Decide(n); d.Writes() {
			writers = append(writers, n.PK)
		} else {
			d.Count(res)
		}
	}
	// A candidate whose node vanished since the comparison (an admin
	// deleted it) is no longer there to count.
	if len(writers) == 0 {
		return nil
	}
	locked, err := collectRows(ctx, s.db, scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE pk = ANY($1) ORDER BY pk FOR UPDATE`, writers)
	if err != nil {
		return err
	}
	var updates []registry.ImportUpdate
	var gone, remove []int64
	before := make(map[int64]registry.Node, len(locked))
	for _, n := range locked {
		before[n.PK] = n
		d := p.Decide(n)
		d.Count(res)
		switch d.Kind {
		case registry.ImportUpdateNode:
			updates = append(updates, d.Update)
		case registry.ImportMarkGone:
			gone = append(gone, n.PK)
		case registry.ImportRemove:
			remove = append(remove, n.PK)
		}
	}
	if err := s.importUpdate(ctx, actor, p.Source, updates, before, res); err != nil {
		return err
	}
	if err := s.importGone(ctx, actor, gone, before); err != nil {
		return err
	}
	return s.importRemove(ctx, actor, remove, before, res)
}

// ensureHardware creates a hardware generation for every GPU model that has
// none yet and returns name → pk for all of them.
func (s *Store) ensureHardware(ctx context.Context, actor registry.Actor, nodes []registry.ImportedNode, res *registry.ImportResult) (map[string]int64, error) {
	var names []string
	for _, n := range nodes {
		if n.GPUModel != "" && !slices.Contains(names, n.GPUModel) {
			names = append(names, n.GPUModel)
		}
	}
	hw := map[string]int64{}
	if len(names) == 0 {
		return hw, nil
	}
	slices.Sort(names)
	created, err := collectRows(ctx, s.db, scanHardware, `
		INSERT INTO hardware_generations AS h (name) SELECT unnest($1::text[])
		ON CONFLICT (name) DO NOTHING RETURNING `+hardwareColumns, names)
	if err != nil {
		return nil, err
	}
	for _, h := range created {
		res.HardwareAdded = append(res.HardwareAdded, h.Name)
		if err := s.audit(ctx, actor, registry.ActionHardwareCreate, "hardware", h.PK, nil, docOfHardware(h)); err != nil {
			return nil, err
		}
	}
	rows, err := s.db.Query(ctx, `SELECT pk, name FROM hardware_generations WHERE name = ANY($1)`, names)
	if err != nil {
		return nil, err
	}
	var pk int64
	var name string
	if _, err := pgx.ForEachRow(rows, []any{&pk, &name}, func() error { hw[name] = pk; return nil }); err != nil {
		return nil, err
	}
	return hw, nil
}

// newNodeColumns is the select list of nodes just inserted: a new pk has
// no liveness row yet, so last_seen is NULL without a look.
var newNodeColumns = columns("nodes", "NULL::timestamptz")

func (s *Store) importInsert(ctx context.Context, actor registry.Actor, source string, hw map[string]int64, sets *importLabels, nodes []registry.ImportedNode, at []int32, res *registry.ImportResult) error {
	if len(at) == 0 {
		return nil
	}
	ips := make([]string, len(at))
	idxs := make([]int32, len(at))
	cpu := make([]int64, len(at))
	gpu := make([]*int64, len(at))
	hws := make([]*int64, len(at))
	run := make([]bool, len(at))
	state := make([]string, len(at))
	ext := make([]string, len(at))
	model := make([]*string, len(at))
	fab := make([]*string, len(at))
	lids := make([]int32, len(at))
	for i, j := range at {
		n := nodes[j]
		ips[i], idxs[i], cpu[i], gpu[i], hws[i] = n.IP, int32(n.Index), n.CPUMem, n.GPUMem, registry.HardwareOf(hw, n.GPUModel)
		run[i], state[i], ext[i] = n.Running, n.State, n.ExternalID
		model[i], fab[i], lids[i] = nonEmpty(n.GPUModel), nonEmpty(n.Fabric), sets.id(n.Labels)
	}
	// A pair registered through the API since the comparison conflicts;
	// the next pass merges it. Such a race is rare, and an INSERT that may
	// meet a conflict costs a third more than one that may not (an extra
	// probe of the unique index and a confirmation in the WAL per row): the
	// chunk is tried plainly in a savepoint first, and again with ON
	// CONFLICT only when a pair turned out to be taken.
	insert := `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem,
			source, schedulable, provider_state, external_id, gpu_model, fabric, labels)
		SELECT u.ip, u.idx, u.cpu, '', u.hw, u.gpu, $1, u.run, u.state, u.ext, u.model, u.fab, il.labels
		FROM unnest($2::inet[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bool[], $8::text[], $9::text[],
			$10::text[], $11::text[], $12::int[])
			AS u(ip, idx, cpu, hw, gpu, run, state, ext, model, fab, lid)
			JOIN import_labels il ON il.id = u.lid
		%s RETURNING ` + newNodeColumns
	args := []any{source, ips, idxs, cpu, hws, gpu, run, state, ext, model, fab, lids}
	if _, err := s.db.Exec(ctx, `SAVEPOINT import_insert`); err != nil {
		return err
	}
	added, err := collectRows(ctx, s.db, scanNode, fmt.Sprintf(insert, ""), args...)
	if code, constraint := pgCode(err); code == codeUniqueViolation && constraint == "nodes_ip_index_key" {
		if _, err := s.db.Exec(ctx, `ROLLBACK TO SAVEPOINT import_insert`); err != nil {
			return err
		}
		added, err = collectRows(ctx, s.db, scanNode, fmt.Sprintf(insert, "ON CONFLICT (ip, gpu_index) DO NOTHING"), args...)
	}
	if err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, `RELEASE SAVEPOINT import_insert`); err != nil {
		return err
	}
	res.Added += len(added)
	return s.recordImported(ctx, actor, "created", registry.ActionNodeCreate, added, nil)
}

func (s *Store) importUpdate(ctx context.Context, actor registry.Actor, source string, ups []registry.ImportUpdate, before map[int64]registry.Node, res *registry.ImportResult) error {
	if len(ups) == 0 {
		return nil
	}
	pks := make([]int64, len(ups))
	cpu := make([]int64, len(ups))
	gpu := make([]*int64, len(ups))
	hws := make([]*int64, len(ups))
	run := make([]bool, len(ups))
	state := make([]string, len(ups))
	ext := make([]string, len(ups))
	model := make([]*string, len(ups))
	fab := make([]*string, len(ups))
	labels := make([]string, len(ups))
	for i, u := range ups {
		pks[i], cpu[i], gpu[i], hws[i], run[i], state[i], ext[i] = u.PK, u.CPUMem, u.GPUMem, u.HW, u.Schedulable, u.State, u.ExternalID
		model[i], fab[i], labels[i] = u.GPUModel, u.Fabric, u.Labels.String()
	}
	// The rows are locked (importChanges); the update is in pk order too.
	updated, err := collectRows(ctx, s.db, scanNode, `
		UPDATE nodes n SET cpu_mem = u.cpu, gpu_mem = u.gpu, hardware_generation = u.hw, schedulable = u.run,
			provider_state = u.state, external_id = u.ext, source = $1, gpu_model = u.model, fabric = u.fab,
			labels = u.labels, updated_at = now(), version = n.version + 1
		FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bool[], $7::text[], $8::text[],
			$9::text[], $10::text[], $11::jsonb[])
			AS u(pk, cpu, gpu, hw, run, state, ext, model, fab, labels)
		WHERE n.pk = u.pk
		RETURNING `+qualified("n"), source, pks, cpu, gpu, hws, run, state, ext, model, fab, labels)
	if err != nil {
		return err
	}
	res.Updated += len(updated)
	return s.recordImported(ctx, actor, "updated", registry.ActionNodeUpdate, updated, before)
}

// importGone marks busy nodes whose host vanished: kept for their job, never
// claimed again.
func (s *Store) importGone(ctx context.Context, actor registry.Actor, pks []int64, before map[int64]registry.Node) error {
	if len(pks) == 0 {
		return nil
	}
	marked, err := collectRows(ctx, s.db, scanNode, `
		UPDATE nodes SET schedulable = false, provider_state = $2, updated_at = now(), version = version + 1
		WHERE pk = ANY($1) RETURNING `+nodeColumns, pks, registry.ProviderGone)
	if err != nil {
		return err
	}
	return s.recordImported(ctx, actor, "updated", registry.ActionNodeUpdate, marked, before)
}

func (s *Store) importRemove(ctx context.Context, actor registry.Actor, pks []int64, before map[int64]registry.Node, res *registry.ImportResult) error {
	if len(pks) == 0 {
		return nil
	}
	// The rows are locked and were found free; the condition repeats it.
	removed, err := collectRows(ctx, s.db, scanNode, `DELETE FROM nodes WHERE pk = ANY($1) AND current_job IS NULL RETURNING `+nodeColumns, pks)
	if err != nil {
		return err
	}
	gonePKs := make([]int64, len(removed))
	for i, n := range removed {
		gonePKs[i] = n.PK
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM node_liveness WHERE node_pk = ANY($1)`, gonePKs); err != nil {
		return err
	}
	res.Removed += len(removed)
	return s.recordImported(ctx, actor, "deleted", registry.ActionNodeDelete, removed, nil)
}

// recordImported writes, for every node an import statement wrote, its
// change-log row (kind) and its audit entry (action) in one statement,
// with one document per node made and sent once: the change log's doc and
// the entry's "after" (for a delete: its "before", the node as it was).
// before holds the nodes as they were before an update.
func (s *Store) recordImported(ctx context.Context, actor registry.Actor, kind, action string, nodes []registry.Node, before map[int64]registry.Node) error {
	if len(nodes) == 0 {
		return nil
	}
	pks := make([]int64, len(nodes))
	docs := make([]string, len(nodes))
	var befores []*string // nil: no "before" (creates, deletes)
	if before != nil {
		befores = make([]*string, len(nodes))
	}
	// The documents as AppendJSON writes them (stored as jsonb, whatever
	// their spelling), without encoding/json's second pass over each.
	buf := make([]byte, 0, 1024)
	encode := func(n registry.Node) string {
		buf = docOfNode(n).appendJSON(buf[:0])
		return string(buf)
	}
	for i, n := range nodes {
		pks[i], docs[i] = n.PK, encode(n)
		if b, ok := before[n.PK]; ok {
			d := encode(b)
			befores[i] = &d
		}
	}
	deleted := kind == "deleted"
	_, err := s.db.Exec(ctx, recordNodesSQL,
		pks, docs, befores, kind, actor.Sub, string(actor.Role), actor.ActingNode, action, deleted,
		actor.RequestID, actor.ClientRequestID, ChangesChannel)
	if err != nil {
		return fmt.Errorf("store: record %s: %w", kind, translate(err))
	}
	return nil
}
