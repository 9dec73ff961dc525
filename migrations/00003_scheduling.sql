-- +goose Up
-- Where a node came from: registered through the API, or imported from a
-- cloud provider by the sync worker.
ALTER TABLE nodes ADD COLUMN source text NOT NULL DEFAULT 'api'
    CONSTRAINT nodes_source_check CHECK (source IN ('api', 'scp', 'e2e'));
-- Whether schedulers may claim the node (the sync worker clears it for
-- hosts its provider reports stopped or gone).
ALTER TABLE nodes ADD COLUMN schedulable boolean NOT NULL DEFAULT true;

-- The scheduler's question is "a page of free nodes, in pk order, maybe of
-- one hardware generation". Partial indexes hold only free nodes, so the
-- walk never steps over busy ones however full the fleet is.
CREATE INDEX nodes_free_idx ON nodes (pk) WHERE current_job IS NULL AND schedulable;
CREATE INDEX nodes_free_hw_idx ON nodes (hardware_generation, pk) WHERE current_job IS NULL AND schedulable;
-- Release and "what does job J hold" look nodes up by job.
CREATE INDEX nodes_job_idx ON nodes (current_job) WHERE current_job IS NOT NULL;

-- +goose Down
DROP INDEX nodes_job_idx;
DROP INDEX nodes_free_hw_idx;
DROP INDEX nodes_free_idx;
ALTER TABLE nodes DROP COLUMN schedulable;
ALTER TABLE nodes DROP COLUMN source;
