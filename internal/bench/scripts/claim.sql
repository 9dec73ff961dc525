-- claim 1 + release: the statements of POST /v1/nodes/claim (pick with SKIP
-- LOCKED, update, change-log row, NOTIFY, audit row, commit) and of
-- POST /v1/nodes/release with the node listed, on copies of the tables
-- (bench_nodes, bench_node_changes, bench_audit_log) so the running server
-- sees none of it. One pgbench transaction = one claim and its release.
\set job random(1000000000, 9000000000)
BEGIN;
SELECT pk FROM bench_nodes WHERE pk > 0 AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
  ORDER BY pk LIMIT 1 FOR UPDATE SKIP LOCKED \gset
UPDATE bench_nodes SET current_job = :job, expired_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = :pk RETURNING *;
INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'claimed', pk, to_jsonb(n) FROM bench_nodes n WHERE pk = :pk;
SELECT pg_notify('registryd_bench', '');
INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
  SELECT 'bench-scheduler', 'scheduler', 'node.claim', 'node', pk, to_jsonb(n), to_jsonb(n) FROM bench_nodes n WHERE pk = :pk;
COMMIT;
BEGIN;
SELECT pk, current_job, expired_job FROM bench_nodes WHERE pk = ANY(ARRAY[:pk]::bigint[]) ORDER BY pk FOR UPDATE;
UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = :pk RETURNING *;
INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'released', pk, to_jsonb(n) FROM bench_nodes n WHERE pk = :pk;
SELECT pg_notify('registryd_bench', '');
INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
  SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', pk, to_jsonb(n), to_jsonb(n) FROM bench_nodes n WHERE pk = :pk;
COMMIT;
