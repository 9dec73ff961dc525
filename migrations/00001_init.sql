-- +goose Up
CREATE TABLE hardware_generations (
    pk         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL CONSTRAINT hardware_generations_name_key UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    version    bigint NOT NULL DEFAULT 1,
    CONSTRAINT hardware_generations_name_check CHECK (name <> '' AND length(name) <= 100)
);

CREATE TABLE nodes (
    pk                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ip                  inet NOT NULL,
    gpu_index           integer NOT NULL CHECK (gpu_index >= 0),
    cpu_mem             bigint NOT NULL CHECK (cpu_mem >= 0),
    driver_version      text NOT NULL,
    hardware_generation bigint
        CONSTRAINT nodes_hardware_generation_fkey REFERENCES hardware_generations (pk) ON DELETE RESTRICT,
    gpu_mem             bigint CHECK (gpu_mem >= 0),
    last_seen           timestamptz,
    current_job         bigint,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    version             bigint NOT NULL DEFAULT 1,
    -- A host address names a host, never a network.
    CONSTRAINT nodes_ip_host CHECK (masklen(ip) = CASE family(ip) WHEN 4 THEN 32 ELSE 128 END),
    CONSTRAINT nodes_ip_index_key UNIQUE (ip, gpu_index)
);

-- Deleting a hardware generation must find its users without a scan.
CREATE INDEX nodes_hardware_generation_idx ON nodes (hardware_generation) WHERE hardware_generation IS NOT NULL;

-- +goose Down
DROP TABLE nodes;
DROP TABLE hardware_generations;
