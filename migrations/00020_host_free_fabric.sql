-- +goose Up
-- A class of host_free (migration 00013) is also keyed by the nodes'
-- fabric ('' for none), so that a claim of whole hosts in one fabric finds
-- its fabric's hosts through the counts alone. The counts are recounted
-- from nodes in this transaction, which also takes the pending deltas.
TRUNCATE host_free, host_free_delta;
ALTER TABLE host_free DROP CONSTRAINT host_free_pkey;
ALTER TABLE host_free ADD COLUMN fabric text NOT NULL DEFAULT '';
ALTER TABLE host_free ADD PRIMARY KEY (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric);
ALTER TABLE host_free_delta ADD COLUMN fabric text NOT NULL DEFAULT '';
-- A fabric's hosts by their count, for the claims of whole hosts in one
-- fabric and the capacity of a fabric.
CREATE INDEX host_free_fabric_idx ON host_free (fabric, free) WHERE fabric <> '';

INSERT INTO host_free (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, free)
SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, coalesce(fabric, ''), count(*) FROM nodes
WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
GROUP BY 1, 2, 3, 4, 5, 6;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta)
    SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, coalesce(fabric, ''), count(*)
    FROM new_nodes
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
    GROUP BY 1, 2, 3, 4, 5, 6;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta)
    SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, coalesce(fabric, ''), -count(*)
    FROM old_nodes
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
    GROUP BY 1, 2, 3, 4, 5, 6;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, delta)
    SELECT ip, hw, gpu, cpu, source, fabric, sum(delta)
    FROM (SELECT ip, coalesce(hardware_generation, 0) AS hw, coalesce(gpu_mem, -1) AS gpu, cpu_mem AS cpu, source,
                 coalesce(fabric, '') AS fabric, -1 AS delta
          FROM old_nodes
          WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
          UNION ALL
          SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, coalesce(fabric, ''), 1
          FROM new_nodes
          WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL) c
    GROUP BY 1, 2, 3, 4, 5, 6
    HAVING sum(delta) <> 0;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
TRUNCATE host_free, host_free_delta;
DROP INDEX host_free_fabric_idx;
ALTER TABLE host_free DROP CONSTRAINT host_free_pkey;
ALTER TABLE host_free DROP COLUMN fabric;
ALTER TABLE host_free ADD PRIMARY KEY (ip, hardware_generation, gpu_mem, cpu_mem, source);
ALTER TABLE host_free_delta DROP COLUMN fabric;
INSERT INTO host_free (ip, hardware_generation, gpu_mem, cpu_mem, source, free)
SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, count(*) FROM nodes
WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
GROUP BY 1, 2, 3, 4, 5;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
    SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, count(*)
    FROM new_nodes
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
    GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
    SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, -count(*)
    FROM old_nodes
    WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
    GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_free_delta (ip, hardware_generation, gpu_mem, cpu_mem, source, delta)
    SELECT ip, hw, gpu, cpu, source, sum(delta)
    FROM (SELECT ip, coalesce(hardware_generation, 0) AS hw, coalesce(gpu_mem, -1) AS gpu, cpu_mem AS cpu, source, -1 AS delta
          FROM old_nodes
          WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
          UNION ALL
          SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, 1
          FROM new_nodes
          WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL) c
    GROUP BY 1, 2, 3, 4, 5
    HAVING sum(delta) <> 0;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
