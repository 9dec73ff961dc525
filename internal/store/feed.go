package store

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
	SELECT f.epoch, f.high, n.sysid, n.dboid, n.tli, n.lsn, n.log_max, f.system_identifier IS NULL AS unwitnessed,
		CASE
		WHEN f.system_identifier <> n.sysid THEN 'the database is another cluster (its system identifier changed)'
		WHEN f.database_oid <> n.dboid THEN 'the database is another database (a restored dump?)'
		WHEN f.timeline <> n.tli THEN 'the database is on a new timeline (a failover or a point-in-time restore)'
		WHEN n.lsn < f.wal_lsn THEN 'the database''s WAL position went backwards'
		WHEN n.log_max < f.high AND f.high > f.epoch << 40 THEN 'the change log lost events it had handed out'
		WHEN $1 > greatest(f.high, n.log_max) THEN 'a replica has seen event ids this database never handed out'
		WHEN n.next_id <= greatest(f.high, n.log_max) THEN 'the event sequence went backwards'
		END AS reason,
		greatest(f.epoch + 1, (greatest(f.high, n.log_max, $1, n.next_id - 1) >> 40) + 1) AS next_epoch
	FROM node_feed f, (
		SELECT (SELECT system_identifier FROM pg_control_system()) AS sysid,
			(SELECT oid::bigint FROM pg_database WHERE datname = current_database()) AS dboid,
			('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int::bigint AS tli,
			pg_current_wal_lsn() AS lsn,
			(SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM node_event_seq) AS next_id,
			` + logMaxSQL + ` AS log_max
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
			system_identifier = v.sysid, database_oid = v.dboid, timeline = v.tli, wal_lsn = v.lsn
		FROM v WHERE v.reason IS NOT NULL OR v.unwitnessed
	)
	SELECT v.reason, CASE WHEN v.reason IS NOT NULL THEN setval('node_event_seq', v.next_epoch << 40) END FROM v`
