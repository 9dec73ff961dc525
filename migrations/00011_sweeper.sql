-- +goose Up
-- The lifecycle sweeper (README "Node states"). What it reads every second
-- is indexed so a pass over 100,000 nodes costs milliseconds:
--   * heartbeats older than the TTL, by time (a range scan that returns
--     only the silent nodes);
--   * agent-owned nodes that never heartbeated, by their last write;
--   * lost nodes (a handful), to find them again;
--   * leases, by expiry (nodes_lease_idx, migration 00010).
CREATE INDEX node_liveness_last_seen_idx ON node_liveness (last_seen, node_pk);
CREATE INDEX nodes_owned_live_idx ON nodes (updated_at, pk) WHERE owner IS NOT NULL AND NOT lost;
CREATE INDEX nodes_lost_idx ON nodes (pk) WHERE lost;

-- A lease that runs out ends the claim; the node keeps the job whose lease
-- expired until its next claim, so that job's release can be told why the
-- node is no longer its own (claims clear it).
ALTER TABLE nodes ADD COLUMN expired_job bigint;
CREATE INDEX nodes_expired_job_idx ON nodes (expired_job) WHERE expired_job IS NOT NULL;

-- +goose Down
DROP INDEX nodes_expired_job_idx;
ALTER TABLE nodes DROP COLUMN expired_job;
DROP INDEX nodes_lost_idx;
DROP INDEX nodes_owned_live_idx;
DROP INDEX node_liveness_last_seen_idx;
