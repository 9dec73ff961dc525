-- +goose Up
-- A renewal of a job's leases is one change-log row (kind 'renewed'),
-- however many nodes the job holds: its node_pk is the job's lowest
-- renewed node and its doc a JSON array of every renewed node's document.
ALTER TABLE node_changes DROP CONSTRAINT node_changes_kind_check;
ALTER TABLE node_changes ADD CONSTRAINT node_changes_kind_check CHECK (kind IN
    ('created', 'updated', 'deleted', 'claimed', 'released', 'lost', 'found', 'cordoned', 'uncordoned', 'expired', 'renewed'));

-- +goose Down
ALTER TABLE node_changes DROP CONSTRAINT node_changes_kind_check;
DELETE FROM node_changes WHERE kind = 'renewed';
ALTER TABLE node_changes ADD CONSTRAINT node_changes_kind_check CHECK (kind IN
    ('created', 'updated', 'deleted', 'claimed', 'released', 'lost', 'found', 'cordoned', 'uncordoned', 'expired'));
