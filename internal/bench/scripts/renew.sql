-- renew: POST /v1/nodes/renew of one of 32 jobs holding 8 leased nodes
-- each, the statements of store.RenewLeases one round trip each, as
-- registryd sends them (a transaction of single statements), on copies of
-- the tables (bench_jobs, bench_nodes, bench_node_changes,
-- bench_audit_log) whose jobs pgbenchTables made. One pgbench transaction
-- = one renewal: the job's row locked, its nodes locked and read, the
-- leases moved, one change-log row listing the nodes (with NOTIFY), an
-- audit entry per node. The documents registryd makes from the rows, and
-- the "before" it keeps from the read, pgbench makes with to_jsonb.
\set job 4000000001 + random(0, 31)
BEGIN;
INSERT INTO bench_jobs AS j (job, owner) VALUES (:job, 'bench-scheduler') ON CONFLICT (job) DO UPDATE SET owner = j.owner WHERE false;
SELECT owner FROM bench_jobs WHERE job = :job;
SELECT *, lease_expires_at IS NOT NULL AND lease_expires_at <= now() FROM bench_nodes WHERE current_job = :job ORDER BY pk FOR UPDATE;
SELECT pk FROM bench_nodes WHERE expired_job = :job;
UPDATE bench_nodes SET lease_expires_at = now() + 600 * interval '1 second', updated_at = now(), version = version + 1
  WHERE current_job = :job AND lease_expires_at > now() RETURNING *;
WITH ins AS (
  INSERT INTO bench_node_changes (kind, node_pk, doc)
  SELECT 'renewed', min(n.pk), jsonb_agg(to_jsonb(n) ORDER BY n.pk) FROM bench_nodes n WHERE current_job = :job)
SELECT pg_notify('registryd_bench', '');
INSERT INTO bench_audit_log (principal, role, acting_node, action, target_type, target_pk, before, after, request_id, client_request_id)
  SELECT 'bench-scheduler', 'scheduler', NULL, 'node.renew', 'node', n.pk, to_jsonb(n), to_jsonb(n), NULL, NULL FROM bench_nodes n WHERE current_job = :job;
COMMIT;
