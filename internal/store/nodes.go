package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/registryd/registryd/internal/registry"
)

// nodeColumns is the select list scanNode reads, in order, for queries
// whose node table is named nodes. last_seen lives in node_liveness (see
// migration 00006).
var nodeColumns = qualified("nodes")

// qualified is the select list for a node table named alias; last_seen
// comes from a subquery, cheap for the few rows most statements touch.
func qualified(alias string) string {
	return columns(alias, "(SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = "+alias+".pk)")
}

// withLiveness is the select list for a query that joins node_liveness as
// l: bulk reads, where a join beats a subquery per row.
func withLiveness(alias string) string { return columns(alias, "l.last_seen") }

// nodeFields is a node as the store reads it: each select-list
// expression ({t} is the node table's alias, {last_seen} where last_seen
// comes from), in order, with the field scanNode reads it into. One list,
// so a new column is one line.
var nodeFields = [...]struct {
	expr string
	oid  uint32 // its type, as decodeNode reads it
	dest func(n *registry.Node) any
}{
	{"{t}.pk", pgtype.Int8OID, func(n *registry.Node) any { return &n.PK }},
	{"host({t}.ip)", pgtype.TextOID, func(n *registry.Node) any { return &n.IP }},
	{"{t}.gpu_index", pgtype.Int4OID, func(n *registry.Node) any { return &n.Index }},
	{"{t}.cpu_mem", pgtype.Int8OID, func(n *registry.Node) any { return &n.CPUMem }},
	{"{t}.driver_version", pgtype.TextOID, func(n *registry.Node) any { return &n.DriverVersion }},
	{"{t}.hardware_generation", pgtype.Int8OID, func(n *registry.Node) any { return &n.HardwareGeneration }},
	{"{t}.gpu_mem", pgtype.Int8OID, func(n *registry.Node) any { return &n.GPUMem }},
	{"{last_seen}", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.LastSeen }},
	{"{t}.current_job", pgtype.Int8OID, func(n *registry.Node) any { return &n.CurrentJob }},
	{"{t}.lease_expires_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.LeaseExpiresAt }},
	{"{t}.owner", pgtype.TextOID, func(n *registry.Node) any { return &n.Owner }},
	{"{t}.source", pgtype.TextOID, func(n *registry.Node) any { return &n.Source }},
	{"{t}.schedulable", pgtype.BoolOID, func(n *registry.Node) any { return &n.Schedulable }},
	{"{t}.lost", pgtype.BoolOID, func(n *registry.Node) any { return &n.Lost }},
	{"{t}.cordon_reason", pgtype.TextOID, func(n *registry.Node) any { return &n.CordonReason }},
	{"{t}.external_id", pgtype.TextOID, func(n *registry.Node) any { return &n.ExternalID }},
	{"{t}.provider_state", pgtype.TextOID, func(n *registry.Node) any { return &n.ProviderState }},
	{"{t}.created_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.CreatedAt }},
	{"{t}.updated_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.UpdatedAt }},
	{"{t}.version", pgtype.Int8OID, func(n *registry.Node) any { return &n.Version }},
}

func columns(alias, lastSeen string) string {
	r := strings.NewReplacer("{t}", alias, "{last_seen}", lastSeen)
	exprs := make([]string, len(nodeFields))
	for i, f := range nodeFields {
		exprs[i] = r.Replace(f.expr)
	}
	return strings.Join(exprs, ", ")
}

// scanNode reads a row of nodeFields, times in UTC, its state derived.
func scanNode(row pgx.CollectableRow) (registry.Node, error) {
	var n registry.Node
	err := row.Scan(nodeDests(&n)...)
	n.State = n.DeriveState()
	return n.UTC(), err
}

// nodeDests are the scan destinations of nodeFields in n, in order.
func nodeDests(n *registry.Node) []any {
	dests := make([]any, len(nodeFields), len(nodeFields)+1)
	for i, f := range nodeFields {
		dests[i] = f.dest(n)
	}
	return dests
}

// freeSQL is registry.StateFree in SQL, spelled exactly as the partial
// free indexes' predicate (migration 00010) so the planner uses them.
const freeSQL = "current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL"

// CreateNode stores a new node and audits it. An agent that creates a node
// becomes its owner. An agent registering a node the sync worker imported
// (same ip and index, no owner yet) adopts that row instead: it becomes the
// owner, its driver_version is kept, and adopted is true. It returns an
// ErrInvalid error when spec is invalid or names a missing hardware
// generation, and an ErrConflict error (with ExistingPK) when (ip, index)
// is taken otherwise.
func (s *Store) CreateNode(ctx context.Context, actor registry.Actor, spec registry.NodeSpec) (n registry.Node, adopted bool, err error) {
	if err := spec.Normalize(); err != nil {
		return registry.Node{}, false, err
	}
	var owner *string
	if actor.Role == registry.RoleAgent {
		owner = &actor.Sub
	}
	err = s.WithTx(ctx, func(tx *Store) error {
		if owner != nil {
			cur, err := tx.adoptable(ctx, spec)
			if err != nil {
				return err
			}
			if cur != nil {
				adopted = true
				return tx.adopt(ctx, actor, *cur, spec, &n)
			}
		}
		rows, _ := tx.db.Query(ctx, `
			INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, owner)
			VALUES ($1::inet, $2, $3, $4, $5, $6, $7)
			RETURNING `+nodeColumns,
			spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem, owner)
		var err error
		if n, err = pgx.CollectExactlyOneRow(rows, scanNode); err != nil {
			return err
		}
		if err := tx.recordChanges(ctx, "created", n); err != nil {
			return err
		}
		if err := tx.expectHeartbeats(ctx, n); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeCreate, "node", n.PK, nil, docOfNode(n))
	})
	if err != nil {
		return registry.Node{}, false, fmt.Errorf("store: create node: %w", s.nodeWriteError(ctx, err, spec))
	}
	return n, adopted, nil
}

// adoptable returns the imported, ownerless node at spec's (ip, index),
// locked, or nil.
func (s *Store) adoptable(ctx context.Context, spec registry.NodeSpec) (*registry.Node, error) {
	rows, _ := s.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE ip = $1::inet AND gpu_index = $2 AND source <> 'api' AND owner IS NULL FOR UPDATE`, spec.IP, spec.Index)
	n, err := pgx.CollectExactlyOneRow(rows, scanNode)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// adopt makes the registering agent the owner of an imported node. What the
// provider knows (memory, hardware) stays; the agent's driver_version wins.
func (s *Store) adopt(ctx context.Context, actor registry.Actor, cur registry.Node, spec registry.NodeSpec, out *registry.Node) error {
	// The body's hardware generation is not used, but bad input is still
	// refused rather than ignored.
	if spec.HardwareGeneration != nil {
		var exists bool
		if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM hardware_generations WHERE pk = $1)`, *spec.HardwareGeneration).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			var fe registry.FieldErrors
			fe.Add("hardware_generation", "hardware generation %d does not exist", *spec.HardwareGeneration)
			return fe.Err()
		}
	}
	rows, _ := s.db.Query(ctx, `
		UPDATE nodes SET owner = $2, driver_version = $3, updated_at = now(), version = version + 1
		WHERE pk = $1 RETURNING `+nodeColumns, cur.PK, actor.Sub, spec.DriverVersion)
	n, err := pgx.CollectExactlyOneRow(rows, scanNode)
	if err != nil {
		return err
	}
	*out = n
	if err := s.recordChanges(ctx, "updated", n); err != nil {
		return err
	}
	if err := s.expectHeartbeats(ctx, n); err != nil {
		return err
	}
	return s.audit(ctx, actor, registry.ActionNodeAdopt, "node", n.PK, docOfNode(cur), docOfNode(n))
}

// nodeWriteError explains a failed insert or update of spec: a taken
// (ip, index) pair names the node that holds it; a missing hardware
// generation is a field error. Inside a transaction the lookup cannot run (the
// transaction is aborted), so it goes to the pool.
func (s *Store) nodeWriteError(ctx context.Context, err error, spec registry.NodeSpec) error {
	switch code, constraint := pgCode(err); {
	case code == codeUniqueViolation && constraint == "nodes_ip_index_key":
		var pk int64
		lookupErr := s.pool.QueryRow(ctx, `SELECT pk FROM nodes WHERE ip = $1::inet AND gpu_index = $2`,
			spec.IP, spec.Index).Scan(&pk)
		if lookupErr != nil {
			// Deleted since: the pair is free now, but this write failed.
			return registry.Conflictf("a node with ip %s and index %d was being written at the same time; retry", spec.IP, spec.Index)
		}
		return &registry.Error{
			Kind:       registry.ErrConflict,
			Message:    fmt.Sprintf("node %d already has ip %s and index %d", pk, spec.IP, spec.Index),
			ExistingPK: pk,
		}
	case code == codeForeignKeyViolation && constraint == "nodes_hardware_generation_fkey":
		var fe registry.FieldErrors
		fe.Add("hardware_generation", "hardware generation %d does not exist", deref(spec.HardwareGeneration))
		return fe.Err()
	}
	if _, ok := errors.AsType[*registry.Error](err); ok {
		return err
	}
	return translate(err)
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// GetNode returns the node with the given pk, or an ErrNotFound error.
func (s *Store) GetNode(ctx context.Context, pk int64) (registry.Node, error) {
	return s.getNode(ctx, pk, "")
}

func (s *Store) getNode(ctx context.Context, pk int64, lock string) (registry.Node, error) {
	rows, _ := s.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE pk = $1 `+lock, pk)
	n, err := pgx.CollectExactlyOneRow(rows, scanNode)
	if errors.Is(err, pgx.ErrNoRows) {
		return registry.Node{}, registry.NotFoundf("node %d does not exist", pk)
	}
	if err != nil {
		return registry.Node{}, fmt.Errorf("store: get node %d: %w", pk, translate(err))
	}
	return n, nil
}

// UpdateNode locks node pk, asks fn for its new writable fields given the
// current node, and stores and audits them, all in one transaction. fn's
// error aborts the update and is returned as is. A spec equal to the current
// one changes nothing (no version bump, no audit entry). Errors as
// CreateNode, plus ErrNotFound.
func (s *Store) UpdateNode(ctx context.Context, actor registry.Actor, pk int64, fn func(cur registry.Node) (registry.NodeSpec, error)) (registry.Node, error) {
	var out registry.Node
	var spec registry.NodeSpec
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getNode(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		spec, err = fn(cur)
		if err != nil {
			return err
		}
		if err := spec.Normalize(); err != nil {
			return err
		}
		if sameSpec(spec, cur.Spec()) {
			out = cur
			return nil
		}
		rows, _ := tx.db.Query(ctx, `
			UPDATE nodes SET ip = $2::inet, gpu_index = $3, cpu_mem = $4, driver_version = $5,
				hardware_generation = $6, gpu_mem = $7, updated_at = now(), version = version + 1
			WHERE pk = $1
			RETURNING `+nodeColumns,
			pk, spec.IP, spec.Index, spec.CPUMem, spec.DriverVersion, spec.HardwareGeneration, spec.GPUMem)
		if out, err = pgx.CollectExactlyOneRow(rows, scanNode); err != nil {
			return err
		}
		if err := tx.recordChanges(ctx, "updated", out); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeUpdate, "node", pk, docOfNode(cur), docOfNode(out))
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return registry.Node{}, err
		}
		return registry.Node{}, fmt.Errorf("store: update node %d: %w", pk, s.nodeWriteError(ctx, err, spec))
	}
	return out, nil
}

func sameSpec(a, b registry.NodeSpec) bool {
	return a.IP == b.IP && a.Index == b.Index && a.CPUMem == b.CPUMem &&
		a.DriverVersion == b.DriverVersion &&
		sameInt(a.HardwareGeneration, b.HardwareGeneration) && sameInt(a.GPUMem, b.GPUMem)
}

func sameInt(a, b *int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// DeleteNode removes node pk, audits it and returns it as it was. check,
// when not nil, sees the locked node first and may refuse. A node that
// holds a job is kept (ErrConflict) unless force is set. A missing node:
// ErrNotFound.
func (s *Store) DeleteNode(ctx context.Context, actor registry.Actor, pk int64, force bool, check func(cur registry.Node) error) (registry.Node, error) {
	var out registry.Node
	err := s.WithTx(ctx, func(tx *Store) error {
		cur, err := tx.getNode(ctx, pk, "FOR UPDATE")
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(cur); err != nil {
				return err
			}
		}
		if cur.CurrentJob != nil && !force {
			return registry.Conflictf("node %d holds job %d; release it before deleting the node", pk, *cur.CurrentJob)
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM nodes WHERE pk = $1`, pk); err != nil {
			return fmt.Errorf("store: delete node %d: %w", pk, translate(err))
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM node_liveness WHERE node_pk = $1`, pk); err != nil {
			return fmt.Errorf("store: delete node %d: %w", pk, translate(err))
		}
		out = cur
		if err := tx.recordChanges(ctx, "deleted", cur); err != nil {
			return err
		}
		return tx.audit(ctx, actor, registry.ActionNodeDelete, "node", pk, docOfNode(cur), nil)
	})
	return out, err
}

// ListNodes returns the nodes matching f, ordered by pk. Callers that want
// every node page through with f.After and f.Limit so that no single query
// holds a connection for a slow reader.
func (s *Store) ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	// The slice sized for the page: a page of 100 is the free list
	// schedulers read all day.
	return s.listInto(ctx, f, make([]registry.Node, 0, min(max(f.Limit, 16), 1000)), nil)
}

// listInto is ListNodes for a normalized filter, appending to nodes and
// decoding what their pointer fields point at into backings, then into
// chunks of its own once they are used up.
func (s *Store) listInto(ctx context.Context, f registry.NodeFilter, nodes []registry.Node, backings []nodeBacking) ([]registry.Node, error) {
	sql, args := listQuery(f)
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", translate(err))
	}
	defer rows.Close()
	// Rows decoded from their bytes (rawscan.go), with one set of scan
	// destinations for any row left to pgx.
	var n registry.Node
	dests := nodeDests(&n)
	dec := nodeDecoder{backings: backings}
	raw := rawDecodable(rows.FieldDescriptions())
	for rows.Next() {
		if err := dec.scanNodeRow(rows, raw, &n, dests); err != nil {
			return nil, fmt.Errorf("store: list nodes: %w", translate(err))
		}
		nodes = append(nodes, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", translate(err))
	}
	return nodes, nil
}

// listQuery is the statement ListNodes runs for a normalized filter.
func listQuery(f registry.NodeFilter) (string, []any) {
	var q query
	q.where(f)
	sql := `SELECT ` + nodeColumns + ` FROM nodes WHERE ` + q.cond() + ` ORDER BY pk`
	if f.Limit > 0 {
		sql += " LIMIT " + q.arg(f.Limit)
	}
	return sql, q.args
}

// query builds a WHERE clause from a filter, values always as placeholders.
type query struct {
	conds []string
	args  []any
}

func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

func (q *query) add(cond string) { q.conds = append(q.conds, cond) }

func (q *query) cond() string { return strings.Join(q.conds, " AND ") }

func (q *query) where(f registry.NodeFilter) {
	q.add("pk > " + q.arg(f.After))
	if f.Free != nil {
		// Spelled exactly as the partial indexes' predicate so the planner
		// can use them.
		if *f.Free {
			q.add(freeSQL)
		} else {
			q.add("NOT (" + freeSQL + ")")
		}
	}
	if len(f.State) > 0 {
		q.add(statesSQL(f.State))
	}
	if f.Source != nil {
		q.add("source = " + q.arg(*f.Source))
	}
	if f.CurrentJob != nil {
		q.add("current_job = " + q.arg(*f.CurrentJob))
	}
	if f.HardwareGeneration != nil {
		q.add("hardware_generation = " + q.arg(*f.HardwareGeneration))
	}
	if f.MinGPUMem != nil {
		q.add("gpu_mem >= " + q.arg(*f.MinGPUMem))
	}
	if f.MinCPUMem != nil {
		q.add("cpu_mem >= " + q.arg(*f.MinCPUMem))
	}
	if f.IP != nil {
		q.add("ip = " + q.arg(*f.IP) + "::inet")
	}
	if f.Index != nil {
		q.add("gpu_index = " + q.arg(*f.Index))
	}
	if f.PK != nil {
		q.add("pk = " + q.arg(*f.PK))
	}
	if f.SeenWithin != nil {
		q.add("EXISTS (SELECT 1 FROM node_liveness l WHERE l.node_pk = nodes.pk AND l.last_seen >= now() - " + q.arg(*f.SeenWithin) + "::interval)")
	}
}

// maxHostsTried bounds how many candidate hosts a same-host claim tries
// before it gives up with a conflict.
const maxHostsTried = 32

// ClaimNodes gives c.Count free, schedulable nodes matching c.Filter to
// c.Job, all or nothing, in one transaction. Rows other claimers are
// taking are skipped (FOR UPDATE SKIP LOCKED), never waited for, and the
// row lock re-checks that a node is still free, so no node is ever given
// to two jobs. Fewer matches than asked: ErrConflict, nothing held.
//
// The transaction is two round trips (see pipeTx): BEGIN with the
// statement that picks and updates the nodes, then their change-log and
// audit rows (one statement, documents made here from what the update
// returned) with COMMIT. A gang claim adds a round trip per host it tries.
//
// Claims of nodes from anywhere (not SameHost) that arrive while others
// are under way go together (see group): their statements share one
// transaction, each claim still all or nothing.
func (s *Store) ClaimNodes(ctx context.Context, actor registry.Actor, c registry.Claim) ([]registry.Node, error) {
	if err := c.Normalize(); err != nil {
		return nil, err
	}
	free := true
	c.Filter.Free = &free
	if s.group != nil {
		s.group.claimStarts(c.Job) // a release of the job waits for it
		defer s.group.claimEnds(c.Job)
		if !c.SameHost {
			op := &groupOp{ctx: ctx, actor: actor, claim: c}
			s.group.do(op, func() { op.nodes, op.err = s.claimAlone(ctx, actor, c) })
			return op.nodes, op.err
		}
	}
	return s.claimAlone(ctx, actor, c)
}

// claimAlone is ClaimNodes in a transaction of its own.
func (s *Store) claimAlone(ctx context.Context, actor registry.Actor, c registry.Claim) ([]registry.Node, error) {
	var out []registry.Node
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		var b *pgx.Batch
		var err error
		if c.SameHost {
			out, b, err = tx.claimOneHost(ctx, c)
		} else {
			out, b, err = tx.claimAny(ctx, c)
		}
		if err != nil {
			return err
		}
		slices.SortFunc(out, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
		queueClaimRecord(b, actor, out)
		return tx.commit(ctx, b)
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, err
		}
		return nil, fmt.Errorf("store: claim: %w", translate(err))
	}
	return out, nil
}

// queueClaimRecord queues the change-log and audit rows of nodes a claim
// took (see queueRecord).
func queueClaimRecord(b *pgx.Batch, actor registry.Actor, nodes []registry.Node) {
	queueRecord(b, actor, "claimed", registry.ActionNodeClaim, nodes, func(n registry.Node) nodeDoc {
		n.CurrentJob, n.LeaseExpiresAt = nil, nil
		return docOfNode(n)
	})
}

// claimAny claims c.Count nodes matching c.Filter, lowest pk first, in
// one round trip, and returns them with the batch for the next one.
func (tx *pipeTx) claimAny(ctx context.Context, c registry.Claim) ([]registry.Node, *pgx.Batch, error) {
	b := tx.batch()
	var out []registry.Node
	queueClaim(b, c, nil, &out)
	if err := tx.send(ctx, b); err != nil {
		return nil, nil, err
	}
	if len(out) == c.Count {
		return out, tx.batch(), nil
	}
	// Too few: say how many there are. The pick ran in this transaction,
	// so it finds the rows it locked again (SKIP LOCKED skips only other
	// transactions' locks).
	b = tx.batch()
	var pks []int64
	queuePick(b, c.Filter, nil, c.Count, &pks)
	if err := tx.send(ctx, b); err != nil {
		return nil, nil, err
	}
	return nil, nil, shortClaim(len(pks), c.Count)
}

// shortClaim is the conflict of a claim of requested nodes whose pick
// found too few; found is what a second look, a moment later, counted.
// That look sees what other claims gave back or committed meanwhile, so it
// can count as many as were asked: the message then says so rather than
// "only 4 … 4 requested".
func shortClaim(found, requested int) error {
	if found < requested {
		return registry.Conflictf("only %d free node(s) match and are not being claimed right now; %d requested", found, requested)
	}
	return registry.Conflictf("fewer than %d free node(s) matched that no other claim was taking at that moment; try again", requested)
}

// queueClaim queues the statement that picks c.Count free nodes matching
// c.Filter (on, when not nil, narrows the match: to one host, or to one
// class of a host, and may return CTEs its conditions read) and gives
// them to c.Job; they are appended to out. It
// locks up to c.Count rows that no one else is locking, lowest pk first,
// and updates them only when it locked c.Count: with fewer, it updates and
// returns nothing, and the rows it locked stay locked until the
// transaction (or its savepoint) is rolled back.
func queueClaim(b *pgx.Batch, c registry.Claim, on func(*query) string, out *[]registry.Node) {
	var q query
	q.where(c.Filter)
	with := ""
	if on != nil {
		if w := on(&q); w != "" {
			with = w + ", "
		}
	}
	n := q.arg(c.Count)
	// pk = ANY(ARRAY(...)) rather than pk IN (...): an index lookup per
	// picked pk whatever the planner guesses of the pick's size (a generic
	// plan does not know the LIMIT).
	sql := `
		WITH ` + with + `picked AS MATERIALIZED (
			SELECT pk FROM nodes WHERE ` + q.cond() + ` ORDER BY pk LIMIT ` + n + ` FOR UPDATE SKIP LOCKED
		)
		UPDATE nodes SET current_job = ` + q.arg(c.Job) + `, expired_job = NULL,
			lease_expires_at = now() + ` + q.arg(leaseSeconds(c.Lease)) + `::bigint * interval '1 second',
			updated_at = now(), version = version + 1
		WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = ` + n + `
		RETURNING ` + nodeColumns
	b.Queue(sql, q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.AppendRows(*out, rows, scanNode)
		return err
	})
}

// queuePick queues the statement that locks up to n free matching nodes
// that no one else is locking, lowest pk first (on as for queueClaim);
// their pks are appended to out.
func queuePick(b *pgx.Batch, f registry.NodeFilter, on func(*query), n int, out *[]int64) {
	var q query
	q.where(f)
	if on != nil {
		on(&q)
	}
	b.Queue(`SELECT pk FROM nodes WHERE `+q.cond()+` ORDER BY pk LIMIT `+q.arg(n)+` FOR UPDATE SKIP LOCKED`, q.args...).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.AppendRows(*out, rows, pgx.RowTo[int64])
		return err
	})
}

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

// FoldHostFree folds the committed deltas of host_free_delta into host_free
// (migration 00013), keeping the claims' read of the counts short. The
// lifecycle sweeper calls it on every pass; it is safe at any time, also
// concurrently (a delta is deleted, and so added, once). A count that falls
// below zero means a write bypassed the triggers: an error.
func (s *Store) FoldHostFree(ctx context.Context) error {
	var moved int64
	err := s.WithTx(ctx, func(tx *Store) error {
		var lowest *int64
		err := tx.db.QueryRow(ctx, `
			WITH moved AS (
				DELETE FROM host_free_delta RETURNING ip, hardware_generation, gpu_mem, cpu_mem, source, delta
			), sums AS (
				SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, sum(delta)::integer AS delta
				FROM moved GROUP BY 1, 2, 3, 4, 5 HAVING sum(delta) <> 0
			), folded AS (
				INSERT INTO host_free AS h (ip, hardware_generation, gpu_mem, cpu_mem, source, free)
				SELECT * FROM sums ORDER BY 1, 2, 3, 4, 5
				ON CONFLICT (ip, hardware_generation, gpu_mem, cpu_mem, source) DO UPDATE SET free = h.free + excluded.free
				RETURNING free
			)
			SELECT (SELECT min(free) FROM folded), (SELECT count(*) FROM moved)`).Scan(&lowest, &moved)
		if err != nil {
			return err
		}
		if lowest == nil || *lowest > 0 {
			return nil
		}
		if *lowest < 0 {
			return errors.New("a free count fell below zero: a write to nodes bypassed host_free's triggers")
		}
		_, err = tx.db.Exec(ctx, `DELETE FROM host_free WHERE free <= 0`)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: fold host_free: %w", translate(err))
	}
	if s.inTx || s.unvacuumed == nil {
		return nil // VACUUM cannot run in a transaction block
	}
	// Every gang claim reads the whole of host_free_delta's file for the
	// pending deltas, dead rows and empty pages included, so what the
	// folds leave behind is vacuumed here rather than left to autovacuum,
	// which looks at a table once a minute at most: at a million nodes,
	// gang claims after 15 s of single claims (tens of thousands of dead
	// deltas) had a p99 of 55 ms, and 44 ms with this vacuum. A plain
	// VACUUM is safe for every snapshot (unlike TRUNCATE, which a backup's
	// snapshot would see empty beside counts not yet folded). It needs the
	// table's owner; any other role gets a warning and nothing is done.
	unvacuumed := s.unvacuumed.Add(moved)
	var vacuum string
	switch {
	case moved >= deltaVacuumRows:
		// An import's worth: the emptied file is cut down as well (after a
		// million nodes were imported it was 1,000 empty pages, 1.3 ms of a
		// core per gang claim). The cut waits for a moment without writers
		// to the table (at most 5 s, PostgreSQL's own bound), so only
		// large folds ask for it.
		vacuum = `VACUUM host_free_delta`
	case unvacuumed >= deltaReuseRows:
		// The steady claims' deltas: their space is made reusable, so the
		// file stops growing, without the cut and its wait.
		vacuum = `VACUUM (TRUNCATE false) host_free_delta`
	default:
		return nil
	}
	s.unvacuumed.Add(-unvacuumed)
	if _, err := s.db.Exec(ctx, vacuum); err != nil {
		return fmt.Errorf("store: vacuum host_free_delta: %w", translate(err))
	}
	return nil
}

// deltaVacuumRows is how many deltas one fold must move before it has
// the table vacuumed and its file cut down, and deltaReuseRows how many
// folds must have moved since the last vacuum before one has the space
// made reusable (see FoldHostFree).
const (
	deltaVacuumRows = 10_000
	deltaReuseRows  = 2_000
)

// ReleaseNodes takes nodes back from r.Job: the listed ones, or all it
// holds. Listed nodes the job does not hold are reported, not failed.
//
// Like a claim, it is two round trips (see pipeTx): BEGIN, the lock of the
// nodes and their update; then their change-log and audit rows with
// COMMIT. The update re-states on the locked rows what is decided here
// from them (held by r.Job), and the two are checked to agree.
//
// Releases that arrive while others are under way go together with them
// and with claims (see group). A release first waits for the claims of
// its job under way on this replica (see group.waitClaims).
func (s *Store) ReleaseNodes(ctx context.Context, actor registry.Actor, r registry.Release) ([]registry.Node, []registry.NotReleased, error) {
	if err := r.Normalize(); err != nil {
		return nil, nil, err
	}
	if s.group != nil {
		op := &groupOp{ctx: ctx, actor: actor, release: &releasing{r: r}}
		if err := s.group.waitClaims(ctx, r.Job); err != nil {
			return nil, nil, fmt.Errorf("store: release: %w", translate(err))
		}
		s.group.do(op, func() { op.nodes, op.release.notReleased, op.err = s.releaseAlone(ctx, actor, r) })
		return op.nodes, op.release.notReleased, op.err
	}
	return s.releaseAlone(ctx, actor, r)
}

// releaseAlone is ReleaseNodes in a transaction of its own.
func (s *Store) releaseAlone(ctx context.Context, actor registry.Actor, r registry.Release) ([]registry.Node, []registry.NotReleased, error) {
	rl := &releasing{r: r}
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		b := tx.batch()
		rl.queue(b)
		if err := tx.send(ctx, b); err != nil {
			return err
		}
		if err := rl.settle(); err != nil {
			return err
		}
		if len(rl.released) == 0 {
			return nil // nothing changed; the transaction is rolled back
		}
		b = tx.batch()
		rl.record(b, actor)
		return tx.commit(ctx, b)
	})
	if err != nil {
		if _, ok := errors.AsType[*registry.Error](err); ok {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("store: release: %w", translate(err))
	}
	return rl.released, rl.notReleased, nil
}

// releasing is one release under way: queue sends its lock and update,
// settle decides from what they returned, record writes its rows.
type releasing struct {
	r           registry.Release
	released    []registry.Node
	notReleased []registry.NotReleased
	// Listed nodes (r.Nodes set): the pks asked for, sorted, and what the
	// lock found each held by.
	want          []int64
	held, expired map[int64]*int64
}

// queue queues the statements that lock the nodes to release and take
// them back from the job.
func (rl *releasing) queue(b *pgx.Batch) {
	r := rl.r
	if r.Nodes == nil {
		b.Queue(`
			WITH held AS MATERIALIZED (
				SELECT pk FROM nodes WHERE current_job = $1 ORDER BY pk FOR UPDATE
			)
			UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
			WHERE pk = ANY(ARRAY(SELECT pk FROM held)) AND current_job = $1
			RETURNING `+nodeColumns, r.Job).Query(func(rows pgx.Rows) error {
			var err error
			rl.released, err = pgx.AppendRows(rl.released, rows, scanNode)
			return err
		})
		// The nodes whose lease of this job ran out: the job thinks it
		// holds them, and is told it does not.
		b.Queue(`SELECT pk FROM nodes WHERE expired_job = $1 ORDER BY pk`, r.Job).Query(func(rows pgx.Rows) error {
			lapsed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			for _, pk := range lapsed {
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: registry.LeaseExpiredReason(r.Job)})
			}
			return err
		})
		return
	}
	rl.want = slices.Compact(slices.Sorted(slices.Values(r.Nodes)))
	rl.held, rl.expired = map[int64]*int64{}, map[int64]*int64{}
	b.Queue(`SELECT pk, current_job, expired_job FROM nodes WHERE pk = ANY($1) ORDER BY pk FOR UPDATE`, rl.want).Query(func(rows pgx.Rows) error {
		var pk int64
		var job, expiredJob *int64
		_, err := pgx.ForEachRow(rows, []any{&pk, &job, &expiredJob}, func() error {
			rl.held[pk], rl.expired[pk] = job, expiredJob
			return nil
		})
		return err
	})
	b.Queue(`
		UPDATE nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
		WHERE pk = ANY($1) AND current_job = $2
		RETURNING `+nodeColumns, rl.want, r.Job).Query(func(rows pgx.Rows) error {
		var err error
		rl.released, err = pgx.AppendRows(rl.released, rows, scanNode)
		return err
	})
}

// settle decides, from what the queued statements returned, which listed
// nodes were not released and why, and checks that the update took
// exactly the nodes the lock found held by the job. The update re-states
// on the locked rows what is decided here from them; the two must agree.
func (rl *releasing) settle() error {
	r := rl.r
	var pks []int64 // the nodes to release, as decided here
	if r.Nodes == nil {
		for _, n := range rl.released {
			pks = append(pks, n.PK)
		}
	} else {
		for _, pk := range rl.want {
			job, ok := rl.held[pk]
			switch {
			case !ok:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: "no such node"})
			case job == nil && rl.expired[pk] != nil && *rl.expired[pk] == r.Job:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: registry.LeaseExpiredReason(r.Job)})
			case job == nil:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: "not held by any job"})
			case *job != r.Job:
				rl.notReleased = append(rl.notReleased, registry.NotReleased{PK: pk, Reason: fmt.Sprintf("held by job %d", *job)})
			default:
				pks = append(pks, pk)
			}
		}
	}
	slices.Sort(pks)
	slices.SortFunc(rl.released, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
	if !slices.EqualFunc(pks, rl.released, func(pk int64, n registry.Node) bool { return pk == n.PK }) {
		// The rows were locked before they were updated: this cannot
		// happen unless the statements disagree.
		return fmt.Errorf("job %d holds %d of the nodes, %d were updated", r.Job, len(pks), len(rl.released))
	}
	return nil
}

// record queues the change-log and audit rows of the released nodes.
func (rl *releasing) record(b *pgx.Batch, actor registry.Actor) {
	job := rl.r.Job
	queueRecord(b, actor, "released", registry.ActionNodeRelease, rl.released, func(n registry.Node) nodeDoc {
		n.CurrentJob = &job
		return docOfNode(n)
	})
}

// expectHeartbeats notes that an agent now owns node n and is expected to
// heartbeat: a liveness row with no last_seen, which the lifecycle sweeper
// times from the node's last write until the first heartbeat (see
// registry.Node.Silent). Nodes without an owner get none.
func (s *Store) expectHeartbeats(ctx context.Context, n registry.Node) error {
	if n.Owner == nil {
		return nil
	}
	_, err := s.db.Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, NULL) ON CONFLICT (node_pk) DO NOTHING`, n.PK)
	return err
}

// TouchNodes records heartbeats: each node's last_seen becomes the given
// time unless it already holds a later one. Missing nodes are skipped. It
// writes node_liveness only, so it never locks a node row a claim wants.
// Rows are written in pk order so that replicas flushing overlapping
// batches cannot deadlock. The same statement notifies LivenessChannel
// with the batch (registry.FormatLiveness), so that every replica's node
// cache learns the new times exactly when they commit.
func (s *Store) TouchNodes(ctx context.Context, pks []int64, seen []time.Time) error {
	_, err := s.db.Exec(ctx, `
		WITH touch AS (
			INSERT INTO node_liveness (node_pk, last_seen)
			SELECT u.pk, u.t FROM unnest($1::bigint[], $2::timestamptz[]) AS u(pk, t)
			WHERE EXISTS (SELECT 1 FROM nodes n WHERE n.pk = u.pk)
			ORDER BY u.pk
			ON CONFLICT (node_pk) DO UPDATE SET last_seen = excluded.last_seen
			WHERE node_liveness.last_seen IS NULL OR node_liveness.last_seen < excluded.last_seen
		)
		SELECT pg_notify($3, p) FROM unnest($4::text[]) AS p`,
		pks, seen, LivenessChannel, registry.FormatLiveness(pks, seen, maxPayload))
	if err != nil {
		return fmt.Errorf("store: touch nodes: %w", translate(err))
	}
	return nil
}

// queueRecord queues, for nodes a claim or release changed, their
// change-log rows (kind) and their audit entries (action) with the
// change notification, in one statement: the change log's document is
// the node as it is now, which is also the entry's "after"; the entry's
// "before" is what beforeOf reconstructs. The documents are what
// recordChanges and auditNodes write.
func queueRecord(b *pgx.Batch, actor registry.Actor, kind, action string, nodes []registry.Node, beforeOf func(registry.Node) nodeDoc) {
	pks := make([]int64, len(nodes))
	docs := make([]string, len(nodes))
	befores := make([]string, len(nodes))
	buf := make([]byte, 0, 1024)
	for i, n := range nodes {
		pks[i] = n.PK
		buf = docOfNode(n).appendJSON(buf[:0])
		docs[i] = string(buf)
		buf = beforeOf(n).appendJSON(buf[:0])
		befores[i] = string(buf)
	}
	b.Queue(recordNodesSQL,
		pks, docs, befores, kind, actor.Sub, string(actor.Role), actor.ActingNode, action, false,
		actor.RequestID, actor.ClientRequestID, ChangesChannel)
}
