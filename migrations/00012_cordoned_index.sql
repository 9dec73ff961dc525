-- +goose Up
-- The cordoned and draining nodes, the ones an admin lists during
-- maintenance (state cordoned or draining), are few among many: a partial
-- index finds them without reading the fleet.
CREATE INDEX nodes_cordoned_idx ON nodes (pk) WHERE cordon_reason IS NOT NULL;

-- +goose Down
DROP INDEX nodes_cordoned_idx;
