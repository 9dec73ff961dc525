-- gang: claim 8 free nodes of one host and release them, the statements
-- of POST /v1/nodes/claim (same_host) and /v1/nodes/release in the round
-- trips registryd sends them (store.pipeTx), the host given: that of a
-- random node, its class (hardware, memory, source) read with it, on
-- copies of the tables like claim.sql. It does not search for a host with
-- 8 free nodes (registryd's claim statement looks it up in host_free
-- itself); that search is what registryd has to make cheap. A host with
-- fewer than 8 free nodes claims nothing, as registryd's try would.
-- pgbench has no pks to list in the release (it cannot \gset inside a
-- pipeline), so it finds the job's nodes by current_job, and the
-- released ones for their rows as the nodes of the host this transaction
-- updated (updated_at = now()).
\set job random(1000000000, 9000000000)
\set p random(:minpk, :maxpk)
SELECT host(ip) AS ip, coalesce(hardware_generation, 0) AS hw, coalesce(gpu_mem, -1) AS gm, cpu_mem AS cm, source AS src
  FROM bench_nodes WHERE pk = :p \gset
\startpipeline
BEGIN;
SAVEPOINT host_try;
WITH picked AS MATERIALIZED (
  SELECT pk FROM bench_nodes WHERE pk > 0 AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
    AND ip = :ip::inet AND coalesce(hardware_generation, 0) = :hw AND coalesce(gpu_mem, -1) = :gm AND cpu_mem = :cm AND source = :src
  ORDER BY pk LIMIT 8 FOR UPDATE SKIP LOCKED)
UPDATE bench_nodes SET current_job = :job, expired_job = NULL, lease_expires_at = now() + NULL::bigint * interval '1 second',
  updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = 8 RETURNING *;
\endpipeline
\startpipeline
WITH u AS MATERIALIZED (SELECT n.pk, to_jsonb(n) AS doc, to_jsonb(n) AS before FROM bench_nodes n WHERE current_job = :job),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc, width)
    SELECT 'claimed', min(u.pk), jsonb_agg(u.doc ORDER BY u.pk), count(*) FROM u HAVING count(*) > 0),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.claim', 'node', u.pk, u.before, u.doc FROM u)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
\startpipeline
BEGIN;
SELECT pk, current_job, expired_job FROM bench_nodes WHERE pk = ANY(ARRAY(SELECT pk FROM bench_nodes WHERE current_job = :job)) ORDER BY pk FOR UPDATE;
UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM bench_nodes WHERE current_job = :job)) AND current_job = :job RETURNING *;
\endpipeline
\startpipeline
WITH u AS MATERIALIZED (SELECT n.pk, to_jsonb(n) AS doc, to_jsonb(n) AS before FROM bench_nodes n
    WHERE ip = :ip::inet AND updated_at = now() AND current_job IS NULL),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc, width)
    SELECT 'released', min(u.pk), jsonb_agg(u.doc ORDER BY u.pk), count(*) FROM u HAVING count(*) > 0),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', u.pk, u.before, u.doc FROM u)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
