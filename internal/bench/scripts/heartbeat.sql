-- heartbeat: one UPDATE of last_seen per heartbeat on a two-column table
-- (bench_liveness: node_pk, last_seen; one row per node).
\set pk random(:minpk, :maxpk)
UPDATE bench_liveness SET last_seen = now() WHERE node_pk = :pk;
