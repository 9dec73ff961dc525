package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// Notification channels. Writers notify ChangesChannel when they commit
// change rows; the sequencer notifies EventsChannel when it has stamped
// new events.
const (
	ChangesChannel = "registryd_changes"
	EventsChannel  = "registryd_events"
	// LivenessChannel carries every heartbeat flush (TouchNodes), as
	// registry.FormatLiveness encodes it.
	LivenessChannel = "registryd_liveness"
)

// maxPayload keeps notification payloads under PostgreSQL's 8000 bytes.
const maxPayload = 7900

// sequencerLockID keys the advisory lock that makes one sequencing pass at
// a time, whichever replica runs it.
const sequencerLockID = 0x7265676973747200

// nodeDoc is a whole node as the change log and the audit log keep it:
// the node's one document (registry.Node's JSON, "version" included, what
// clients see).
type nodeDoc struct {
	registry.Node
}

// MarshalJSON writes the node's document as encoding/json would, without
// its reflection: every write encodes a document or two per node (change
// log, audit log).
func (d nodeDoc) MarshalJSON() ([]byte, error) {
	return d.appendJSON(make([]byte, 0, 640)), nil
}

// appendJSON appends the document as MarshalJSON writes it to b.
func (d nodeDoc) appendJSON(b []byte) []byte {
	return d.AppendJSON(b)
}

func (d nodeDoc) node() registry.Node {
	return d.Node.UTC()
}

// docOfNode is n's document; its state is derived again, so a node edited
// in memory (as audit's "before" of a claim is) shows the state it had.
func docOfNode(n registry.Node) nodeDoc {
	n.State = n.DeriveState()
	return nodeDoc{Node: n.UTC()}
}

// recordChanges appends the change rows of nodes in the current
// transaction (changeRows: one row per up to maxEventWidth nodes, an
// event each) and asks for a notification at commit.
func (s *Store) recordChanges(ctx context.Context, kind string, nodes ...registry.Node) error {
	pks := make([]int64, len(nodes))
	docs := make([]string, len(nodes))
	buf := make([]byte, 0, 1024)
	for i, n := range nodes {
		buf = docOfNode(n).appendJSON(buf[:0])
		pks[i], docs[i] = n.PK, string(buf)
	}
	_, err := s.db.Exec(ctx, `
		WITH u AS MATERIALIZED (
			SELECT * FROM unnest($2::bigint[], $3::jsonb[]) WITH ORDINALITY AS u(pk, doc, ord)
		), ins AS (
			INSERT INTO node_changes (kind, node_pk, doc, width) `+changeRows("$1")+`
		)
		SELECT pg_notify($4, '')`, kind, pks, docs, ChangesChannel)
	if err != nil {
		return fmt.Errorf("store: record %s: %w", kind, translate(err))
	}
	return nil
}

// maxEventWidth is the most events one change row stands for (the
// column's check, migration 00022): a reader parses a row whole, so a
// row stays a few hundred KiB at most.
const maxEventWidth = 256

// changeRows selects, from the CTE u (pk, doc, ord: the nodes in order),
// the change rows of kind (an SQL expression) as node_changes takes them
// (kind, node_pk, doc, width): one row per maxEventWidth nodes, in order,
// whose doc is the array of their documents (the document itself for a
// row of one) and node_pk the first node's. Nothing when u is empty.
func changeRows(kind string) string {
	group := "(ord - 1) / " + strconv.Itoa(maxEventWidth)
	return `SELECT ` + kind + `, (array_agg(pk ORDER BY ord))[1],
				CASE WHEN count(*) = 1 THEN (array_agg(doc))[1] ELSE jsonb_agg(doc ORDER BY ord) END, count(*)
			FROM u GROUP BY ` + group + ` ORDER BY ` + group
}

// recordRenewal appends the one change row of a renewal of nodes (by pk,
// at least one): kind renewed, node_pk the first node's, doc the array of
// their documents; and asks for a notification at commit.
func (s *Store) recordRenewal(ctx context.Context, nodes []registry.Node) error {
	b := append(make([]byte, 0, 640*len(nodes)), '[')
	for i, n := range nodes {
		if i > 0 {
			b = append(b, ',')
		}
		b = docOfNode(n).appendJSON(b)
	}
	b = append(b, ']')
	_, err := s.db.Exec(ctx, `
		WITH ins AS (
			INSERT INTO node_changes (kind, node_pk, doc) VALUES ($1, $2, $3::jsonb)
		)
		SELECT pg_notify($4, '')`, registry.EventRenewed, nodes[0].PK, string(b), ChangesChannel)
	if err != nil {
		return fmt.Errorf("store: record renewal: %w", translate(err))
	}
	return nil
}

// SequenceEvents stamps every committed, unstamped change row with the next
// event ids, in row order, and returns where the feed stands. Passes of all
// replicas serialize on an advisory lock, so stamps become visible in
// increasing order: a watcher that has seen event N never later finds an
// event below N.
//
// Before it stamps, a pass checks that the database is the one it last
// stamped ids in (feedVerdictSQL); seen is the highest id the caller has
// seen. When not, it begins a new epoch whose ids are above every id
// issued before (Feed.NewEpoch says why), so no id is ever issued twice.
//
// A pass is one round trip (see pipeTx): BEGIN, the lock, the check, the
// stamping (with the notification when it stamped anything) and COMMIT.
func (s *Store) SequenceEvents(ctx context.Context, seen int64) (feed registry.Feed, err error) {
	err = s.pipelined(ctx, func(tx *pipeTx) error {
		b := tx.batch()
		b.Queue(`SELECT pg_advisory_xact_lock($1)`, int64(sequencerLockID))
		// This sequencer stamps rows of several events as blocks
		// (migration 00022's trigger refuses older ones).
		b.Queue(`SELECT set_config('registryd.event_blocks', 'on', true)`)
		b.Queue(newEpochSQL, seen).QueryRow(func(row pgx.Row) error {
			var reason *string
			var seq *int64
			if err := row.Scan(&reason, &seq); err != nil {
				return err
			}
			if reason != nil {
				feed.NewEpoch = *reason
			}
			return nil
		})
		// The stamps are not visible to the rest of the statement (one
		// snapshot), so the latest id is the greatest of the stamped ones,
		// those before and the epoch's start. The witness's highest id
		// moves with the stamps, in their transaction.
		b.Queue(`
			WITH todo AS MATERIALIZED (
				SELECT row_id, width, sum(width) OVER (ORDER BY row_id) AS upto FROM node_changes WHERE event_id IS NULL
			), block AS MATERIALIZED (
				-- n consecutive ids from the sequence, the first one's answered.
				SELECT setval('node_event_seq', nextval('node_event_seq') + t.n - 1) - t.n + 1 AS first
				FROM (SELECT sum(width) AS n FROM todo) t WHERE t.n > 0
			), stamps AS (
				SELECT todo.row_id, block.first + todo.upto - todo.width AS event_id FROM todo, block
			), upd AS (
				UPDATE node_changes c SET event_id = stamps.event_id FROM stamps
				WHERE c.row_id = stamps.row_id RETURNING c.event_id + c.width - 1 AS last
			), witness AS (
				UPDATE node_feed SET high = greatest(high, (SELECT max(last) FROM upd)), wal_lsn = pg_current_wal_lsn()
				WHERE EXISTS (SELECT 1 FROM upd)
			), latest AS (
				SELECT greatest((SELECT max(last) FROM upd), `+logMaxSQL+`, (SELECT epoch << 40 FROM node_feed)) AS id,
					EXISTS (SELECT 1 FROM upd) AS stamped
			)
			SELECT l.id, (SELECT epoch << 40 FROM node_feed), (SELECT pruned_through FROM node_changes_horizon),
				(SELECT count(*) FROM (SELECT pg_notify($1, l.id::text) WHERE l.stamped) n) FROM latest l`,
			EventsChannel).QueryRow(func(row pgx.Row) error {
			var notified int64
			return row.Scan(&feed.Latest, &feed.Epoch, &feed.Pruned, &notified)
		})
		return tx.commit(ctx, b)
	})
	if err != nil {
		return registry.Feed{}, fmt.Errorf("store: sequence events: %w", translate(err))
	}
	feed.Latest = max(feed.Latest, feed.Pruned)
	return feed, nil
}

// NodeEventsAfter returns up to limit events with ids above after, in
// order: one at least when there are any (fewer than limit says nothing
// of what follows). A row of several events (migration 00022) is read
// whole, from the one that holds after+1 on; the rows read are those
// that can hold ids up to after+limit (their documents are all parsed),
// and the first above after even when it starts higher (a gap).
func (s *Store) NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error) {
	rows, err := s.db.Query(ctx, `
		SELECT event_id, width, kind, at, doc FROM node_changes
		WHERE event_id >= coalesce((SELECT max(event_id) FROM node_changes WHERE event_id <= $1), 0)
		  AND event_id <= greatest($1 + $2, (SELECT min(event_id) FROM node_changes WHERE event_id > $1))
		ORDER BY event_id LIMIT $2 + 1`, after, int64(limit))
	if err != nil {
		return nil, fmt.Errorf("store: node events: %w", translate(err))
	}
	defer rows.Close()
	var events []registry.NodeEvent
	for rows.Next() && len(events) < limit {
		var first int64
		var width int
		var kind string
		var at time.Time
		var doc []byte
		if err := rows.Scan(&first, &width, &kind, &at, &doc); err != nil {
			return nil, fmt.Errorf("store: node events: %w", err)
		}
		if first+int64(width)-1 <= after {
			continue
		}
		row, err := rowEvents(first, width, kind, at, doc)
		if err != nil {
			return nil, fmt.Errorf("store: node events: %w", err)
		}
		for _, e := range row {
			if e.ID > after && len(events) < limit {
				events = append(events, e)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: node events: %w", translate(err))
	}
	return events, nil
}

// rowEvents is the events of a change row: width of them, ids from first
// on, for a row of several (doc the array of their documents); else the
// one event (for renewed, every node of doc's array in Nodes).
func rowEvents(first int64, width int, kind string, at time.Time, doc []byte) ([]registry.NodeEvent, error) {
	if width > 1 {
		var ds []nodeDoc
		if err := json.Unmarshal(doc, &ds); err != nil {
			return nil, err
		}
		if len(ds) != width {
			return nil, fmt.Errorf("change row of event %d holds %d documents, not %d", first, len(ds), width)
		}
		events := make([]registry.NodeEvent, width)
		for i, d := range ds {
			events[i] = registry.NodeEvent{ID: first + int64(i), Kind: kind, At: at, Node: d.node()}
		}
		return events, nil
	}
	e := registry.NodeEvent{ID: first, Kind: kind, At: at}
	if kind == registry.EventRenewed {
		var ds []nodeDoc
		if err := json.Unmarshal(doc, &ds); err != nil {
			return nil, err
		}
		if len(ds) == 0 {
			return nil, fmt.Errorf("renewed event %d lists no node", first)
		}
		e.Nodes = make([]registry.Node, len(ds))
		for i, d := range ds {
			e.Nodes[i] = d.node()
		}
		e.Node = e.Nodes[0]
		return []registry.NodeEvent{e}, nil
	}
	var d nodeDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	e.Node = d.node()
	return []registry.NodeEvent{e}, nil
}

// logMaxSQL is the highest event id in the change log (0 when none): the
// last of the newest stamped row's ids.
const logMaxSQL = `coalesce((SELECT event_id + width - 1 FROM node_changes WHERE event_id IS NOT NULL ORDER BY event_id DESC LIMIT 1), 0)`

// EventHorizon returns where the feed stands: its epoch, the highest
// pruned event id (resuming below it misses events) and the latest
// stamped one. Feed.NewEpoch is always "".
func (s *Store) EventHorizon(ctx context.Context) (registry.Feed, error) {
	var f registry.Feed
	err := s.db.QueryRow(ctx, `
		SELECT (SELECT epoch << 40 FROM node_feed), (SELECT pruned_through FROM node_changes_horizon),
		       `+logMaxSQL).Scan(&f.Epoch, &f.Pruned, &f.Latest)
	if err != nil {
		return registry.Feed{}, fmt.Errorf("store: event horizon: %w", translate(err))
	}
	f.Latest = max(f.Latest, f.Pruned, f.Epoch)
	return f, nil
}

// PruneEvents deletes stamped events older than before, keeping the newest
// one so the latest id survives an idle period, and raises the horizon.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	ctx = withoutStatementTimeout(ctx) // a day of events may take a while to delete
	var n int64
	err := s.WithTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(sequencerLockID)); err != nil {
			return err
		}
		return tx.db.QueryRow(ctx, `
			WITH gone AS (
				DELETE FROM node_changes
				WHERE event_id IS NOT NULL AND at < $1
				  AND event_id < (SELECT max(event_id) FROM node_changes)
				RETURNING event_id + width - 1 AS event_id
			), horizon AS (
				UPDATE node_changes_horizon
				SET pruned_through = greatest(pruned_through, (SELECT max(event_id) FROM gone))
				WHERE EXISTS (SELECT 1 FROM gone)
			)
			SELECT count(*) FROM gone`, before).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("store: prune events: %w", translate(err))
	}
	return n, nil
}

// Listen holds one connection that LISTENs on channels and calls fn for
// every notification until ctx ends or the connection fails.
func (s *Store) Listen(ctx context.Context, channels []string, fn func(channel, payload string)) error {
	pooled, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("store: listen: %w", translate(err))
	}
	// The connection carries LISTEN state: never hand it back to the pool.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("store: listen: %w", translate(err))
		}
	}
	fn("", "") // listening: whatever happened before is now worth a look
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("store: listen: %w", translate(err))
		}
		fn(n.Channel, n.Payload)
	}
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

// recordNodesSQL writes nodes' change-log rows and audit entries and
// notifies the change, in one statement: $1 pks, $2 their documents (the
// change log's, the entries' "after"), $3 their "before" documents, $4 the
// change's kind, $5..$8 the actor (principal, role, acting node) and the
// action, $9 true for a deletion (the entry's before is the document,
// after is null), $10, $11 the request ids, $12 the channel.
var recordNodesSQL = `
		WITH u AS MATERIALIZED (
			SELECT * FROM unnest($1::bigint[], $2::jsonb[], $3::jsonb[]) WITH ORDINALITY AS u(pk, doc, before, ord)
		), changes AS (
			INSERT INTO node_changes (kind, node_pk, doc, width) ` + changeRows("$4::text") + `
		), audit AS (
			INSERT INTO audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id, client_request_id)
			SELECT $5, $6, $7, $8, 'node', u.pk,
				CASE WHEN $9 THEN u.doc ELSE u.before END, CASE WHEN $9 THEN NULL ELSE u.doc END,
				nullif($10, ''), nullif($11, '')
			FROM u ORDER BY u.ord
		)
		SELECT pg_notify($12, '')`
