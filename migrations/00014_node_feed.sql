-- +goose Up
-- The change feed's epoch (docs/design.md, "A feed that never goes
-- backwards"). Event ids come from node_event_seq; the feed's epoch E owns
-- the ids above E << 40. When the sequencer finds that the database is not
-- the one it last stamped ids in (another cluster, another database such
-- as a dump restored beside the original, a new timeline after a failover
-- or a point-in-time restore), that the sequence or the log went
-- back below ids already handed out, or that a replica has seen ids this
-- database never handed out, it starts a new epoch: it moves the sequence
-- to the new epoch's start, so every id from then on is above every id
-- issued before, and replicas drop what they built on the old ids.
--
-- The row is the witness the sequencer compares with: the database's
-- identity when it last stamped ids (NULL until the first pass records
-- it), and the highest id handed out in the current epoch (or the epoch's
-- start, E << 40, when none is yet).
CREATE TABLE node_feed (
    only_row          boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    epoch             bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0 AND epoch < 8388608),
    system_identifier bigint,
    database_oid      bigint,
    timeline          bigint,
    wal_lsn           pg_lsn,
    high              bigint NOT NULL DEFAULT 0
);
INSERT INTO node_feed (high) SELECT coalesce(max(event_id), 0) FROM node_changes;

-- +goose Down
DROP TABLE node_feed;
