-- +goose Up
-- The lifecycle sweeper (docs/scheduling.md, "Node states"). What it reads every second
-- is indexed so a pass over 100,000 nodes costs milliseconds:
--   * heartbeats older than the TTL, by time (a range scan that returns
--     only the silent nodes);
--   * agent-owned nodes that never heartbeated (a liveness row with no
--     last_seen, written when an agent registers or adopts the node), timed
--     from the node's last write;
--   * lost nodes (a handful), to find them again;
--   * leases, by expiry (nodes_lease_idx, migration 00010).
CREATE INDEX node_liveness_last_seen_idx ON node_liveness (last_seen, node_pk);
ALTER TABLE node_liveness ALTER COLUMN last_seen DROP NOT NULL;
INSERT INTO node_liveness (node_pk, last_seen)
    SELECT pk, NULL FROM nodes WHERE owner IS NOT NULL
    ON CONFLICT (node_pk) DO NOTHING;
CREATE INDEX node_liveness_unseen_idx ON node_liveness (node_pk) WHERE last_seen IS NULL;
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
DROP INDEX node_liveness_unseen_idx;
DELETE FROM node_liveness WHERE last_seen IS NULL;
ALTER TABLE node_liveness ALTER COLUMN last_seen SET NOT NULL;
DROP INDEX node_liveness_last_seen_idx;
