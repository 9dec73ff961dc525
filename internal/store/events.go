package store

import (
	"context"
	"encoding/json"
	"fmt"
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

// recordChanges appends change rows for nodes in the current transaction
// and asks for a notification at commit.
func (s *Store) recordChanges(ctx context.Context, kind string, nodes ...registry.Node) error {
	pks := make([]int64, len(nodes))
	docs := make([]string, len(nodes))
	for i, n := range nodes {
		b, err := json.Marshal(docOfNode(n))
		if err != nil {
			return err
		}
		pks[i], docs[i] = n.PK, string(b)
	}
	_, err := s.db.Exec(ctx, `
		WITH ins AS (
			INSERT INTO node_changes (kind, node_pk, doc)
			SELECT $1, u.pk, u.doc FROM unnest($2::bigint[], $3::jsonb[]) AS u(pk, doc)
		)
		SELECT pg_notify($4, '')`, kind, pks, docs, ChangesChannel)
	if err != nil {
		return fmt.Errorf("store: record %s: %w", kind, translate(err))
	}
	return nil
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
			WITH todo AS (
				SELECT row_id FROM node_changes WHERE event_id IS NULL ORDER BY row_id
			), stamps AS (
				SELECT row_id, nextval('node_event_seq') AS event_id FROM todo
			), upd AS (
				UPDATE node_changes c SET event_id = stamps.event_id FROM stamps
				WHERE c.row_id = stamps.row_id RETURNING c.event_id
			), witness AS (
				UPDATE node_feed SET high = greatest(high, (SELECT max(event_id) FROM upd)), wal_lsn = pg_current_wal_lsn()
				WHERE EXISTS (SELECT 1 FROM upd)
			), latest AS (
				SELECT greatest((SELECT max(event_id) FROM upd), (SELECT coalesce(max(event_id), 0) FROM node_changes), (SELECT epoch << 40 FROM node_feed)) AS id,
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

// NodeEventsAfter returns up to limit events with ids above after, in order.
func (s *Store) NodeEventsAfter(ctx context.Context, after int64, limit int) ([]registry.NodeEvent, error) {
	events, err := collectRows(ctx, s.db, scanNodeEvent, `
		SELECT event_id, kind, at, doc FROM node_changes
		WHERE event_id > $1 ORDER BY event_id LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: node events: %w", translate(err))
	}
	return events, nil
}

// scanNodeEvent reads a row of event_id, kind, at and doc.
func scanNodeEvent(row pgx.CollectableRow) (registry.NodeEvent, error) {
	var e registry.NodeEvent
	var doc []byte
	if err := row.Scan(&e.ID, &e.Kind, &e.At, &doc); err != nil {
		return e, err
	}
	if e.Kind == registry.EventRenewed {
		var ds []nodeDoc
		if err := json.Unmarshal(doc, &ds); err != nil {
			return e, err
		}
		if len(ds) == 0 {
			return e, fmt.Errorf("store: renewed event %d lists no node", e.ID)
		}
		e.Nodes = make([]registry.Node, len(ds))
		for i, d := range ds {
			e.Nodes[i] = d.node()
		}
		e.Node = e.Nodes[0]
		return e, nil
	}
	var d nodeDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		return e, err
	}
	e.Node = d.node()
	return e, nil
}

// EventHorizon returns where the feed stands: its epoch, the highest
// pruned event id (resuming below it misses events) and the latest
// stamped one. Feed.NewEpoch is always "".
func (s *Store) EventHorizon(ctx context.Context) (registry.Feed, error) {
	var f registry.Feed
	err := s.db.QueryRow(ctx, `
		SELECT (SELECT epoch << 40 FROM node_feed), (SELECT pruned_through FROM node_changes_horizon),
		       coalesce((SELECT max(event_id) FROM node_changes), 0)`).Scan(&f.Epoch, &f.Pruned, &f.Latest)
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
				RETURNING event_id
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
const recordNodesSQL = `
		WITH u AS MATERIALIZED (
			SELECT * FROM unnest($1::bigint[], $2::jsonb[], $3::jsonb[]) AS u(pk, doc, before)
		), changes AS (
			INSERT INTO node_changes (kind, node_pk, doc) SELECT $4, u.pk, u.doc FROM u
		), audit AS (
			INSERT INTO audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id, client_request_id)
			SELECT $5, $6, $7, $8, 'node', u.pk,
				CASE WHEN $9 THEN u.doc ELSE u.before END, CASE WHEN $9 THEN NULL ELSE u.doc END,
				nullif($10, ''), nullif($11, '')
			FROM u
		)
		SELECT pg_notify($12, '')`
