-- +goose Up
-- Heartbeats get a table of their own. An UPDATE of nodes.last_seen locks
-- the node row, and claims (SELECT … FOR UPDATE SKIP LOCKED) skip locked
-- rows: every heartbeat flush made the nodes it touched unclaimable for a
-- moment, and a claim could get a 409 although nodes were free. Writing
-- liveness elsewhere never locks a node row, and keeps the nodes table free
-- of the churn of thousands of updates a second.
CREATE TABLE node_liveness (
    node_pk   bigint PRIMARY KEY,
    last_seen timestamptz NOT NULL
);
INSERT INTO node_liveness (node_pk, last_seen) SELECT pk, last_seen FROM nodes WHERE last_seen IS NOT NULL;
ALTER TABLE nodes DROP COLUMN last_seen;

-- +goose Down
ALTER TABLE nodes ADD COLUMN last_seen timestamptz;
UPDATE nodes n SET last_seen = l.last_seen FROM node_liveness l WHERE l.node_pk = n.pk;
DROP TABLE node_liveness;
