-- +goose Up
-- The node lifecycle (docs/scheduling.md, "Node states"). A node's state is derived, by
-- precedence, from what is kept here: schedulable (its provider's word),
-- lost (the lifecycle sweeper's), cordon_reason (an admin's) and
-- current_job (a claim's); lease_expires_at ends a leased claim.
ALTER TABLE nodes ADD COLUMN lost boolean NOT NULL DEFAULT false;
ALTER TABLE nodes ADD COLUMN cordon_reason text
    CONSTRAINT nodes_cordon_reason_check CHECK (cordon_reason <> '' AND length(cordon_reason) <= 200);
ALTER TABLE nodes ADD COLUMN lease_expires_at timestamptz;
-- A lease belongs to a claim.
ALTER TABLE nodes ADD CONSTRAINT nodes_lease_needs_job CHECK (lease_expires_at IS NULL OR current_job IS NOT NULL);

-- Free now means none of the other states: the free indexes hold exactly
-- the nodes claims may take (the store spells the same predicate).
DROP INDEX nodes_free_idx;
DROP INDEX nodes_free_hw_idx;
CREATE INDEX nodes_free_idx ON nodes (pk)
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL;
CREATE INDEX nodes_free_hw_idx ON nodes (hardware_generation, pk)
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL;
-- The sweeper's question "which leases have run out" walks only leased nodes.
CREATE INDEX nodes_lease_idx ON nodes (lease_expires_at) WHERE lease_expires_at IS NOT NULL;

-- The lifecycle's transitions are change-log events like the others.
ALTER TABLE node_changes DROP CONSTRAINT node_changes_kind_check;
ALTER TABLE node_changes ADD CONSTRAINT node_changes_kind_check CHECK (kind IN
    ('created', 'updated', 'deleted', 'claimed', 'released', 'lost', 'found', 'cordoned', 'uncordoned', 'expired'));

-- +goose Down
ALTER TABLE node_changes DROP CONSTRAINT node_changes_kind_check;
DELETE FROM node_changes WHERE kind IN ('lost', 'found', 'cordoned', 'uncordoned', 'expired');
ALTER TABLE node_changes ADD CONSTRAINT node_changes_kind_check CHECK (kind IN
    ('created', 'updated', 'deleted', 'claimed', 'released'));
DROP INDEX nodes_lease_idx;
DROP INDEX nodes_free_hw_idx;
DROP INDEX nodes_free_idx;
CREATE INDEX nodes_free_idx ON nodes (pk) WHERE current_job IS NULL AND schedulable;
CREATE INDEX nodes_free_hw_idx ON nodes (hardware_generation, pk) WHERE current_job IS NULL AND schedulable;
ALTER TABLE nodes DROP CONSTRAINT nodes_lease_needs_job;
ALTER TABLE nodes DROP COLUMN lease_expires_at;
ALTER TABLE nodes DROP COLUMN cordon_reason;
ALTER TABLE nodes DROP COLUMN lost;
