-- +goose Up
-- What the sync worker knows of an imported node: the provider's id of its
-- host and the provider's state (RUNNING, STOPPED, …, or "gone" once the
-- host vanished while the node still held a job).
ALTER TABLE nodes ADD COLUMN external_id text;
ALTER TABLE nodes ADD COLUMN provider_state text;
-- A sync pass reads every node of its provider.
CREATE INDEX nodes_source_idx ON nodes (source) WHERE source <> 'api';

-- +goose Down
DROP INDEX nodes_source_idx;
ALTER TABLE nodes DROP COLUMN provider_state;
ALTER TABLE nodes DROP COLUMN external_id;
