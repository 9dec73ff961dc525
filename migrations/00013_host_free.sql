-- +goose Up
-- Gang claims (count n, same_host) ask "which host has n free nodes that
-- match?". Counting free nodes per host on every claim reads the whole free
-- fleet; these tables keep the count instead. A count is kept per class of
-- nodes on a host: the host and every node attribute a claim filters on by
-- value (hardware generation, gpu and cpu memory, source), so a filtered
-- claim finds matching hosts through the counts alone. In a real fleet a
-- host's GPUs are alike and the host is one class. "Free" is the store's
-- freeSQL, the free indexes' predicate. NULL attributes are stored as
-- values no filter matches (hardware generation 0, gpu_mem -1), so that the
-- key is plain columns.
--
-- The count of a class is host_free.free plus the sum of its rows in
-- host_free_delta, exactly, at any snapshot:
--   * statement-level triggers with transition tables append, in the
--     transaction of every change to nodes (claims, releases, the
--     sweeper's lost/found/expired, cordons, imports, creates, edits,
--     deletes), one row per class whose count the statement changed. An
--     append takes no lock a concurrent writer waits for: a claim never
--     waits for another claim, a release or a sweep because they touch the
--     same host's count, and nothing can deadlock on it. A bulk import of
--     a million nodes appends one row per class.
--   * the lifecycle sweeper (one replica at a time, every pass) folds the
--     committed deltas into host_free; claims read host_free through an
--     index and add the few deltas not folded yet.
CREATE TABLE host_free (
    ip                  inet NOT NULL,
    hardware_generation bigint NOT NULL,
    gpu_mem             bigint NOT NULL,
    cpu_mem             bigint NOT NULL,
    source              text NOT NULL,
    free                integer NOT NULL,
    PRIMARY KEY (ip, hardware_generation, gpu_mem, cpu_mem, source)
);
-- A gang claim walks classes by free count from n up (best fit first), with
-- or without a hardware generation.
CREATE INDEX host_free_free_idx ON host_free (free);
CREATE INDEX host_free_hw_idx ON host_free (hardware_generation, free);

CREATE TABLE host_free_delta (
    ip                  inet NOT NULL,
    hardware_generation bigint NOT NULL,
    gpu_mem             bigint NOT NULL,
    cpu_mem             bigint NOT NULL,
    source              text NOT NULL,
    delta               integer NOT NULL
);

INSERT INTO host_free (ip, hardware_generation, gpu_mem, cpu_mem, source, free)
SELECT ip, coalesce(hardware_generation, 0), coalesce(gpu_mem, -1), cpu_mem, source, count(*) FROM nodes
WHERE current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
GROUP BY 1, 2, 3, 4, 5;

-- +goose StatementBegin
CREATE FUNCTION host_free_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE FUNCTION host_free_delete() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE FUNCTION host_free_update() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- No code truncates nodes; a hand at psql that does must not leave counts
-- of nodes that are gone.
-- +goose StatementBegin
CREATE FUNCTION host_free_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE host_free, host_free_delta;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER host_free_insert AFTER INSERT ON nodes
    REFERENCING NEW TABLE AS new_nodes FOR EACH STATEMENT EXECUTE FUNCTION host_free_insert();
CREATE TRIGGER host_free_delete AFTER DELETE ON nodes
    REFERENCING OLD TABLE AS old_nodes FOR EACH STATEMENT EXECUTE FUNCTION host_free_delete();
CREATE TRIGGER host_free_update AFTER UPDATE ON nodes
    REFERENCING OLD TABLE AS old_nodes NEW TABLE AS new_nodes FOR EACH STATEMENT EXECUTE FUNCTION host_free_update();
CREATE TRIGGER host_free_truncate AFTER TRUNCATE ON nodes
    FOR EACH STATEMENT EXECUTE FUNCTION host_free_truncate();

-- +goose Down
DROP TRIGGER host_free_truncate ON nodes;
DROP TRIGGER host_free_update ON nodes;
DROP TRIGGER host_free_delete ON nodes;
DROP TRIGGER host_free_insert ON nodes;
DROP FUNCTION host_free_truncate();
DROP FUNCTION host_free_update();
DROP FUNCTION host_free_delete();
DROP FUNCTION host_free_insert();
DROP TABLE host_free_delta;
DROP TABLE host_free;
