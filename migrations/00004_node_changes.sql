-- +goose Up
-- The change log behind GET /v1/nodes/watch. Writers append a row in the
-- same transaction as the change. Row ids are handed out in insertion
-- order, which is not commit order, so a watcher reading "id > last" could
-- miss a row that commits late. Instead a sequencer (one at a time, across
-- replicas, under an advisory lock) stamps committed rows with event_id in
-- the order it finds them; watchers resume from event_id, which only ever
-- grows as rows become visible.
CREATE TABLE node_changes (
    row_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id bigint CONSTRAINT node_changes_event_id_key UNIQUE,
    at       timestamptz NOT NULL DEFAULT now(),
    kind     text NOT NULL CHECK (kind IN ('created', 'updated', 'deleted', 'claimed', 'released')),
    node_pk  bigint NOT NULL,
    doc      jsonb NOT NULL
);
CREATE INDEX node_changes_unsequenced_idx ON node_changes (row_id) WHERE event_id IS NULL;
CREATE INDEX node_changes_at_idx ON node_changes (at);
CREATE SEQUENCE node_event_seq;

-- The highest event id pruned by retention: a watcher resuming from below
-- it has missed events and must re-list.
CREATE TABLE node_changes_horizon (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    pruned_through bigint NOT NULL DEFAULT 0
);
INSERT INTO node_changes_horizon DEFAULT VALUES;

-- +goose Down
DROP TABLE node_changes_horizon;
DROP SEQUENCE node_event_seq;
DROP TABLE node_changes;
