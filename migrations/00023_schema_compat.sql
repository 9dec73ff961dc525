-- +goose Up
-- registryd:compatible-from 22
-- Which releases may keep serving on a schema newer than their own. A
-- migration says so in its own file, in a line like the one above: the
-- oldest schema version whose replicas still serve correctly once it is
-- applied (an expand step: a new table, a nullable column, an index, a
-- constraint NOT VALID). `registryd migrate up` records it here for every
-- migration it knows; a replica whose newest known migration is V serves
-- a schema at version N > V only if every migration after V is recorded
-- with compatible_from <= V. A migration that says nothing, or a row that
-- is missing, allows none: that replica goes unready as before.
CREATE TABLE schema_compat (
    version         bigint PRIMARY KEY,
    compatible_from bigint NOT NULL CHECK (compatible_from <= version)
);

-- +goose Down
DROP TABLE schema_compat;
