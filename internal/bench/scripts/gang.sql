-- gang: claim up to 8 free nodes of one host and release them, the host
-- given (that of a random node): the cost of a gang claim once a fitting
-- host is found for free, on copies of the tables like claim.sql. It does
-- not search for a host with 8 free nodes; that search is what registryd
-- has to make cheap.
\set job random(1000000000, 9000000000)
\set p random(:minpk, :maxpk)
SELECT host(ip) AS ip FROM bench_nodes WHERE pk = :p \gset
BEGIN;
WITH picked AS (
  SELECT pk FROM bench_nodes WHERE ip = :ip::inet AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
  ORDER BY pk LIMIT 8 FOR UPDATE SKIP LOCKED)
UPDATE bench_nodes n SET current_job = :job, expired_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  FROM picked WHERE n.pk = picked.pk RETURNING n.*;
INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'claimed', pk, to_jsonb(n) FROM bench_nodes n WHERE current_job = :job;
SELECT pg_notify('registryd_bench', '');
INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
  SELECT 'bench-scheduler', 'scheduler', 'node.claim', 'node', pk, to_jsonb(n), to_jsonb(n) FROM bench_nodes n WHERE current_job = :job;
COMMIT;
BEGIN;
SELECT pk FROM bench_nodes WHERE current_job = :job ORDER BY pk FOR UPDATE;
INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'released', pk, to_jsonb(n) FROM bench_nodes n WHERE current_job = :job;
INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
  SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', pk, to_jsonb(n), to_jsonb(n) FROM bench_nodes n WHERE current_job = :job;
UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE current_job = :job RETURNING *;
SELECT pg_notify('registryd_bench', '');
COMMIT;
