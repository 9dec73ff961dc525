-- +goose Up
-- fabric_free counts, per fabric and class attributes (migration 00013),
-- how many classes of host_free have each free count: in a fleet of alike
-- GPUs a host is one class, so this is how many hosts of a fabric have 1,
-- 2, … free nodes. A claim of whole hosts in one fabric ranks the fabrics
-- from it (a few rows per fabric) rather than from the hosts. FoldHostFree
-- keeps it in the transaction that moves host_free, so the two always
-- agree; a claim adds what the deltas not folded yet change. Only counts
-- above zero are kept; fabric '' (no fabric) is not.
CREATE TABLE fabric_free (
    fabric              text NOT NULL,
    hardware_generation bigint NOT NULL,
    gpu_mem             bigint NOT NULL,
    cpu_mem             bigint NOT NULL,
    source              text NOT NULL,
    free                integer NOT NULL,
    hosts               integer NOT NULL,
    PRIMARY KEY (fabric, hardware_generation, gpu_mem, cpu_mem, source, free)
);
INSERT INTO fabric_free (fabric, hardware_generation, gpu_mem, cpu_mem, source, free, hosts)
SELECT fabric, hardware_generation, gpu_mem, cpu_mem, source, free, count(*) FROM host_free
WHERE fabric <> '' AND free > 0
GROUP BY 1, 2, 3, 4, 5, 6;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE host_free, host_free_delta, fabric_free;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION host_free_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE host_free, host_free_delta;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
DROP TABLE fabric_free;
