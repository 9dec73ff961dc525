-- fabric gang: claim 4 whole hosts of 8 free nodes in one fabric and
-- release them, the statements of POST /v1/nodes/claim (per_host 8,
-- same_fabric) and /v1/nodes/release (store.hostsClaim): the ranking of
-- the fabrics from fabric_free with the pending deltas, the lookup of the
-- best fabric's hosts in host_free taking their advisory locks, and the
-- claim of 8 nodes of each on a copy of nodes like gang.sql. The ranking
-- and the lookup read the registry's own counting tables (this script
-- writes only the copies, so they stay as seeded), one round trip each
-- (pgbench cannot \gset inside a pipeline; registryd sends the ranking
-- with BEGIN and the lookup with its savepoint). A fabric whose hosts
-- other clients hold gives fewer than 4 hosts, and the claim then takes
-- nothing, as registryd's try would before it looks again.
\set job random(1000000000, 9000000000)
BEGIN;
WITH p AS MATERIALIZED (
  SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, sum(delta) AS delta FROM host_free_delta GROUP BY 1, 2, 3, 4, 5, 6
), moved AS (
  SELECT t.fabric, coalesce(b.free, 0) AS was, coalesce(b.free, 0) + t.delta AS now FROM p t
  LEFT JOIN LATERAL (SELECT h.free FROM host_free h WHERE (h.ip, h.hardware_generation, h.gpu_mem, h.cpu_mem, h.source, h.fabric) =
    (t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric) LIMIT 1) b ON true
  WHERE t.fabric <> ''
), fit AS (
  SELECT fabric, sum(hosts) AS hosts FROM (
    SELECT t.fabric, t.hosts FROM fabric_free t WHERE t.free >= 8 AND t.fabric <> ''
    UNION ALL SELECT fabric, -1 FROM moved WHERE was >= 8
    UNION ALL SELECT fabric, 1 FROM moved WHERE now >= 8) x GROUP BY fabric
)
SELECT fabric FROM fit WHERE hosts >= 4 ORDER BY hosts, fabric LIMIT 1 \gset
SAVEPOINT host_try;
WITH p AS MATERIALIZED (
  SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric, sum(delta) AS delta FROM host_free_delta GROUP BY 1, 2, 3, 4, 5, 6
), c AS (
  SELECT t.ip, t.fabric, t.free FROM host_free t WHERE t.fabric = :fabric
    AND (t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric) NOT IN (SELECT ip, hardware_generation, gpu_mem, cpu_mem, source, fabric FROM p)
  UNION ALL
  SELECT t.ip, t.fabric, coalesce(b.free, 0) + t.delta FROM p t
  LEFT JOIN LATERAL (SELECT h.free FROM host_free h WHERE (h.ip, h.hardware_generation, h.gpu_mem, h.cpu_mem, h.source, h.fabric) =
    (t.ip, t.hardware_generation, t.gpu_mem, t.cpu_mem, t.source, t.fabric) LIMIT 1) b ON true
  WHERE t.fabric = :fabric
)
SELECT coalesce(array_agg(ip)::text, '{}') AS ips FROM (
  SELECT host(ip) AS ip FROM (SELECT * FROM (SELECT DISTINCT ON (ip) * FROM (
    SELECT * FROM c WHERE free >= 8 ORDER BY free, ip LIMIT 260) best ORDER BY ip, free) d ORDER BY free, ip) o
  WHERE pg_try_advisory_xact_lock(1752134516, hashtext(host(ip))) LIMIT 4) h \gset
\startpipeline
WITH cls AS (SELECT unnest(:ips::inet[]) AS c_ip),
picked AS MATERIALIZED (
  SELECT g.pk FROM cls CROSS JOIN LATERAL (
    SELECT pk FROM bench_nodes WHERE pk > 0 AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
      AND ip = cls.c_ip ORDER BY pk LIMIT 8 FOR UPDATE SKIP LOCKED) g)
UPDATE bench_nodes SET current_job = :job, expired_job = NULL, lease_expires_at = now() + NULL::bigint * interval '1 second',
  updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = 32 RETURNING *;
WITH u AS MATERIALIZED (SELECT n.pk, to_jsonb(n) AS doc, to_jsonb(n) AS before FROM bench_nodes n WHERE current_job = :job),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'claimed', u.pk, u.doc FROM u),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.claim', 'node', u.pk, u.before, u.doc FROM u)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
\startpipeline
BEGIN;
SELECT pk, current_job, expired_job FROM bench_nodes WHERE pk = ANY(ARRAY(SELECT pk FROM bench_nodes WHERE current_job = :job)) ORDER BY pk FOR UPDATE;
WITH r AS (UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM bench_nodes WHERE current_job = :job)) AND current_job = :job RETURNING *),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'released', r.pk, to_jsonb(r) FROM r),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', r.pk, to_jsonb(r), to_jsonb(r) FROM r)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
