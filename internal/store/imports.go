package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// importLocks key the per-provider advisory locks that serialize applies
// of one provider's inventory, whichever replica runs them.
var importLocks = map[string]int64{"scp": 0x7265676973740001, "e2e": 0x7265676973740002}

// ApplyImport makes the nodes of provider source match an inventory, in one
// transaction, with batch statements rather than a round trip per node:
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
//     "cluster/worker"): then it is left as it is.
//
// Every change is audited under actor and appears on the watch feed.
func (s *Store) ApplyImport(ctx context.Context, actor registry.Actor, source string, nodes []registry.ImportedNode, skipped []string) (registry.ImportResult, error) {
	var res registry.ImportResult
	if _, ok := importLocks[source]; !ok {
		return res, registry.Invalidf("unknown import source %q", source)
	}
	// A pass over a large inventory may take its statements long; it is
	// bounded as a whole by the caller (REGISTRY_SYNC_TIMEOUT).
	ctx = withoutStatementTimeout(ctx)
	err := s.WithTx(ctx, func(tx *Store) error {
		res = registry.ImportResult{}
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, importLocks[source]); err != nil {
			return err
		}
		hw, err := tx.ensureHardware(ctx, actor, nodes, &res)
		if err != nil {
			return err
		}
		want := make(map[registry.ImportKey]registry.ImportedNode, len(nodes))
		ips := make([]string, 0, len(nodes))
		idxs := make([]int32, 0, len(nodes))
		for _, n := range nodes {
			k := registry.ImportKey{IP: n.IP, Index: n.Index}
			if _, dup := want[k]; dup {
				continue // a provider listing a host twice must not double a GPU
			}
			want[k] = n
			ips = append(ips, n.IP)
			idxs = append(idxs, int32(n.Index))
		}
		// Read without locks, so a pass never holds up claims on rows it
		// leaves alone; then lock just the rows it will write, in pk order
		// (the order claims and releases lock in), and decide again from
		// what they hold now.
		rows, _ := tx.db.Query(ctx, `
			SELECT `+withLiveness("nodes")+` FROM nodes LEFT JOIN node_liveness l ON l.node_pk = nodes.pk
			WHERE source = $1
			   OR (ip, gpu_index) IN (SELECT u.ip, u.idx FROM unnest($2::inet[], $3::int[]) AS u(ip, idx))
			ORDER BY pk`, source, ips, idxs)
		existing, err := pgx.CollectRows(rows, scanNode)
		if err != nil {
			return err
		}
		p := registry.ImportPlan{Source: source, Want: want, Skipped: skipped, HW: hw}
		have := make(map[registry.ImportKey]bool, len(existing))
		var candidates []int64
		for _, n := range existing {
			have[registry.ImportKey{IP: n.IP, Index: n.Index}] = true
			if d := p.Decide(n); d.Writes() {
				candidates = append(candidates, n.PK)
			} else {
				d.Count(&res)
			}
		}
		var inserts []registry.ImportedNode
		for _, k := range slices.SortedFunc(mapsKeys(want), comparePairs) {
			if !have[k] {
				inserts = append(inserts, want[k])
			}
		}
		if err := tx.importInsert(ctx, actor, source, hw, inserts, &res); err != nil {
			return err
		}

		rows, _ = tx.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE pk = ANY($1) ORDER BY pk FOR UPDATE`, candidates)
		locked, err := pgx.CollectRows(rows, scanNode)
		if err != nil {
			return err
		}
		var updates []registry.ImportUpdate
		var gone, remove []int64
		before := make(map[int64]registry.Node, len(locked))
		for _, n := range locked {
			before[n.PK] = n
			d := p.Decide(n)
			d.Count(&res)
			switch d.Kind {
			case registry.ImportUpdateNode:
				updates = append(updates, d.Update)
			case registry.ImportMarkGone:
				gone = append(gone, n.PK)
			case registry.ImportRemove:
				remove = append(remove, n.PK)
			}
		}
		if err := tx.importUpdate(ctx, actor, source, updates, before, &res); err != nil {
			return err
		}
		if err := tx.importGone(ctx, actor, gone, before); err != nil {
			return err
		}
		return tx.importRemove(ctx, actor, remove, before, &res)
	})
	if err != nil {
		if _, ok := err.(*registry.Error); ok {
			return res, err
		}
		return res, fmt.Errorf("store: import %s: %w", source, translate(err))
	}
	return res, nil
}

func mapsKeys[K comparable, V any](m map[K]V) func(yield func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func comparePairs(a, b registry.ImportKey) int {
	if c := cmp.Compare(a.IP, b.IP); c != 0 {
		return c
	}
	return cmp.Compare(a.Index, b.Index)
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
	rows, _ := s.db.Query(ctx, `
		INSERT INTO hardware_generations AS h (name) SELECT unnest($1::text[])
		ON CONFLICT (name) DO NOTHING RETURNING `+hardwareColumns, names)
	created, err := pgx.CollectRows(rows, scanHardware)
	if err != nil {
		return nil, err
	}
	for _, h := range created {
		res.HardwareAdded = append(res.HardwareAdded, h.Name)
		if err := s.audit(ctx, actor, registry.ActionHardwareCreate, "hardware", h.PK, nil, docOfHardware(h)); err != nil {
			return nil, err
		}
	}
	rows, _ = s.db.Query(ctx, `SELECT pk, name FROM hardware_generations WHERE name = ANY($1)`, names)
	var pk int64
	var name string
	if _, err := pgx.ForEachRow(rows, []any{&pk, &name}, func() error { hw[name] = pk; return nil }); err != nil {
		return nil, err
	}
	return hw, nil
}

func (s *Store) importInsert(ctx context.Context, actor registry.Actor, source string, hw map[string]int64, in []registry.ImportedNode, res *registry.ImportResult) error {
	if len(in) == 0 {
		return nil
	}
	ips := make([]string, len(in))
	idxs := make([]int32, len(in))
	cpu := make([]int64, len(in))
	gpu := make([]*int64, len(in))
	hws := make([]*int64, len(in))
	run := make([]bool, len(in))
	state := make([]string, len(in))
	ext := make([]string, len(in))
	for i, n := range in {
		ips[i], idxs[i], cpu[i], gpu[i], hws[i] = n.IP, int32(n.Index), n.CPUMem, n.GPUMem, registry.HardwareOf(hw, n.GPUModel)
		run[i], state[i], ext[i] = n.Running, n.State, n.ExternalID
	}
	rows, _ := s.db.Query(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem,
			source, schedulable, provider_state, external_id)
		SELECT u.ip, u.idx, u.cpu, '', u.hw, u.gpu, $1, u.run, u.state, u.ext
		FROM unnest($2::inet[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bool[], $8::text[], $9::text[])
			AS u(ip, idx, cpu, hw, gpu, run, state, ext)
		ON CONFLICT (ip, gpu_index) DO NOTHING -- registered a moment ago: the next pass merges it
		RETURNING `+nodeColumns, source, ips, idxs, cpu, hws, gpu, run, state, ext)
	added, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return err
	}
	res.Added += len(added)
	if err := s.recordChanges(ctx, "created", added...); err != nil {
		return err
	}
	return s.auditEach(ctx, actor, registry.ActionNodeCreate, added, nil)
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
	for i, u := range ups {
		pks[i], cpu[i], gpu[i], hws[i], run[i], state[i], ext[i] = u.PK, u.CPUMem, u.GPUMem, u.HW, u.Schedulable, u.State, u.ExternalID
	}
	// The rows are locked (ApplyImport); the update is in pk order too.
	rows, _ := s.db.Query(ctx, `
		UPDATE nodes n SET cpu_mem = u.cpu, gpu_mem = u.gpu, hardware_generation = u.hw, schedulable = u.run,
			provider_state = u.state, external_id = u.ext, source = $1, updated_at = now(), version = n.version + 1
		FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bool[], $7::text[], $8::text[])
			AS u(pk, cpu, gpu, hw, run, state, ext)
		WHERE n.pk = u.pk
		RETURNING `+qualified("n"), source, pks, cpu, gpu, hws, run, state, ext)
	updated, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return err
	}
	res.Updated += len(updated)
	if err := s.recordChanges(ctx, "updated", updated...); err != nil {
		return err
	}
	return s.auditEach(ctx, actor, registry.ActionNodeUpdate, updated, before)
}

// importGone marks busy nodes whose host vanished: kept for their job, never
// claimed again.
func (s *Store) importGone(ctx context.Context, actor registry.Actor, pks []int64, before map[int64]registry.Node) error {
	if len(pks) == 0 {
		return nil
	}
	rows, _ := s.db.Query(ctx, `
		UPDATE nodes SET schedulable = false, provider_state = $2, updated_at = now(), version = version + 1
		WHERE pk = ANY($1) RETURNING `+nodeColumns, pks, registry.ProviderGone)
	marked, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return err
	}
	if err := s.recordChanges(ctx, "updated", marked...); err != nil {
		return err
	}
	return s.auditEach(ctx, actor, registry.ActionNodeUpdate, marked, before)
}

func (s *Store) importRemove(ctx context.Context, actor registry.Actor, pks []int64, before map[int64]registry.Node, res *registry.ImportResult) error {
	if len(pks) == 0 {
		return nil
	}
	// The rows are locked and were found free; the condition repeats it.
	rows, _ := s.db.Query(ctx, `DELETE FROM nodes WHERE pk = ANY($1) AND current_job IS NULL RETURNING `+nodeColumns, pks)
	removed, err := pgx.CollectRows(rows, scanNode)
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
	if err := s.recordChanges(ctx, "deleted", removed...); err != nil {
		return err
	}
	docs := make([]registry.Node, len(removed))
	copy(docs, removed)
	return s.auditEachDelete(ctx, actor, docs)
}

// auditEach writes one entry per node in one statement; before may be nil
// (creates).
func (s *Store) auditEach(ctx context.Context, actor registry.Actor, action string, nodes []registry.Node, before map[int64]registry.Node) error {
	return s.auditNodes(ctx, actor, action, nodes, func(n registry.Node) any {
		if b, ok := before[n.PK]; ok {
			return docOfNode(b)
		}
		return nil
	})
}

func (s *Store) auditEachDelete(ctx context.Context, actor registry.Actor, nodes []registry.Node) error {
	if len(nodes) == 0 {
		return nil
	}
	pks := make([]int64, len(nodes))
	befores := make([]string, len(nodes))
	for i, n := range nodes {
		b, err := json.Marshal(docOfNode(n))
		if err != nil {
			return err
		}
		pks[i], befores[i] = n.PK, string(b)
	}
	_, err := s.db.Exec(ctx, `
		INSERT INTO audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id)
		SELECT $1, $2, NULL, 'node.delete', 'node', u.pk, u.before, NULL, nullif($3, '')
		FROM unnest($4::bigint[], $5::jsonb[]) AS u(pk, before)`,
		actor.Sub, string(actor.Role), actor.RequestID, pks, befores)
	return err
}
