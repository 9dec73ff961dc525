package store

import (
	"context"
	"fmt"
)

// EpochBits is how many low bits of an event id count within an epoch:
// epoch E owns the ids above E << EpochBits.
const EpochBits = 40

// feedVerdictSQL judges the database against the feed's witness
// (node_feed, migration 00014), in one row: the witness's epoch and
// highest id, the database's identity now, the highest id in the log, why
// a new epoch must begin (NULL when none need) and the epoch it would be.
// $1 is the highest event id the caller has seen (0 when it has none to
// offer). Every check reads memory or the control file; none scans.
//
// The new epoch is above the witness's and above the epoch of every id
// the database or the caller knows (the log, the sequence, what was
// seen), so its ids are above all of those.
const feedVerdictSQL = `
	SELECT f.epoch, f.high, n.sysid, n.tli, n.lsn, n.log_max, f.system_identifier IS NULL AS unwitnessed,
		CASE
		WHEN f.system_identifier <> n.sysid THEN 'the database is another cluster (its system identifier changed)'
		WHEN f.timeline <> n.tli THEN 'the database is on a new timeline (a failover or a point-in-time restore)'
		WHEN n.lsn < f.wal_lsn THEN 'the database''s WAL position went backwards'
		WHEN n.log_max < f.high AND f.high > f.epoch << 40 THEN 'the change log lost events it had handed out'
		WHEN $1 > greatest(f.high, n.log_max) THEN 'a replica has seen event ids this database never handed out'
		WHEN n.next_id <= greatest(f.high, n.log_max) THEN 'the event sequence went backwards'
		END AS reason,
		greatest(f.epoch + 1, (greatest(f.high, n.log_max, $1, n.next_id - 1) >> 40) + 1) AS next_epoch
	FROM node_feed f, (
		SELECT (SELECT system_identifier FROM pg_control_system()) AS sysid,
			('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int::bigint AS tli,
			pg_current_wal_lsn() AS lsn,
			(SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM node_event_seq) AS next_id,
			coalesce((SELECT max(event_id) FROM node_changes), 0) AS log_max
	) n`

// newEpochSQL is the sequencer's check, run under its lock before it
// stamps: when the verdict asks for a new epoch it records it with the
// database's identity, and moves the sequence to the epoch's start (setval
// is not transactional: if the pass rolls back, the next pass finds the
// sequence ahead of the witness's epoch and begins one above it). The
// first pass on a database records its identity. It answers the reason
// (NULL: the epoch goes on).
const newEpochSQL = `
	WITH v AS (` + feedVerdictSQL + `
	), bump AS (
		UPDATE node_feed f SET
			epoch = CASE WHEN v.reason IS NULL THEN f.epoch ELSE v.next_epoch END,
			high = CASE WHEN v.reason IS NULL THEN f.high ELSE v.next_epoch << 40 END,
			system_identifier = v.sysid, timeline = v.tli, wal_lsn = v.lsn
		FROM v WHERE v.reason IS NOT NULL OR v.unwitnessed
	)
	SELECT v.reason, CASE WHEN v.reason IS NOT NULL THEN setval('node_event_seq', v.next_epoch << 40) END FROM v`

// FeedPosition returns, read in one snapshot, the feed's position — the
// newest event id handed out in the current epoch (never below the
// epoch's start or the pruning horizon) — and whether committed changes
// are waiting to be sequenced.
//
// It is what a consistent read proves itself against: every change
// committed before the call began is either sequenced, with an id of at
// most latest, or pending. When pending is false, a reader that has
// applied every event up to latest has every such change.
//
// When the database is not the one the feed last stamped ids in (see
// feedVerdictSQL), the ids a reader applied may be lost: latest is then
// at most the start of the epoch the sequencer's next pass begins and
// above every id handed out before, and pending is true. So no reader
// proves itself current with ids of a database that lost them until it
// has followed the feed into the new epoch.
func (s *Store) FeedPosition(ctx context.Context) (latest int64, pending bool, err error) {
	var reason *string
	var nextEpoch int64
	err = s.db.QueryRow(ctx, `
		WITH v AS (`+feedVerdictSQL+`)
		SELECT greatest(v.log_max, v.high, v.epoch << 40, (SELECT pruned_through FROM node_changes_horizon)),
		       EXISTS (SELECT 1 FROM node_changes WHERE event_id IS NULL), v.reason, v.next_epoch
		FROM v`, int64(0)).Scan(&latest, &pending, &reason, &nextEpoch)
	if err != nil {
		return 0, false, fmt.Errorf("store: feed position: %w", translate(err))
	}
	if reason != nil {
		return nextEpoch << EpochBits, true, nil
	}
	return latest, pending, nil
}
