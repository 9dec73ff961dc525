-- fabric gang: claim 4 whole hosts of 8 free nodes in one fabric and
-- release them, the statements of POST /v1/nodes/claim (per_host 8,
-- same_fabric) and /v1/nodes/release (store.hostsClaim): the ranking of
-- the fabrics from fabric_free with the pending deltas and the lookup of
-- the best fabric's hosts in host_free taking their advisory locks, read
-- as registryd reads them (this script writes only the copies, so the
-- counting tables stay as seeded; one round trip each: pgbench cannot
-- \gset inside a pipeline); then the writes of the claim, the change row
-- (one for the gang, as registryd writes it) and the audit rows, and of
-- the release. The writes go to a gang of the client's own (hosts 8k to
-- 8k+3 of the seeded fleet, all free and in one fabric; k differs between
-- clients in a fleet of 2,048 nodes or more), not to the hosts the lookup found: no two clients ever meet,
-- so this is what the database does for the same statements without the
-- contention, the retries and the waits that registryd's claimers meet.
-- An upper bound, then, and gangs that were not whole are counted apart.
\set job random(1000000000, 9000000000)
\set k (:client_id + 16 * random(0, greatest(0, :maxpk / 1024 - 2))) % greatest(1, :maxpk / 64 - 2)
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
WITH picked AS MATERIALIZED (
  SELECT pk FROM bench_nodes WHERE pk BETWEEN 64 * :k + 1 AND 64 * :k + 32 AND current_job IS NULL AND schedulable AND NOT lost
    AND cordon_reason IS NULL ORDER BY pk FOR UPDATE SKIP LOCKED)
UPDATE bench_nodes SET current_job = :job, expired_job = NULL, lease_expires_at = now() + NULL::bigint * interval '1 second',
  updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = 32 RETURNING *;
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
WITH r AS (UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM bench_nodes WHERE current_job = :job)) AND current_job = :job RETURNING *),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc, width)
    SELECT 'released', min(r.pk), jsonb_agg(to_jsonb(r) ORDER BY r.pk), count(*) FROM r HAVING count(*) > 0),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', r.pk, to_jsonb(r), to_jsonb(r) FROM r)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
