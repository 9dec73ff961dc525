-- claim 1 + release: the statements of POST /v1/nodes/claim and of
-- POST /v1/nodes/release with the node listed, in the round trips registryd
-- sends them (store.pipeTx), on copies of the tables (bench_nodes,
-- bench_node_changes, bench_audit_log) so the running server sees none of
-- it. One pgbench transaction = one claim and its release.
--
-- claim: BEGIN and the pick-and-update; then the change-log and audit rows
-- with NOTIFY (one statement) and COMMIT. pgbench cannot \gset inside a
-- pipeline, so its BEGIN goes alone: one round trip more than registryd's.
-- The documents registryd makes from the update's rows and sends, pgbench
-- makes with to_jsonb.
-- release: BEGIN, the lock and the update; then the rows and COMMIT.
\set job random(1000000000, 9000000000)
BEGIN;
WITH picked AS MATERIALIZED (
  SELECT pk FROM bench_nodes WHERE pk > 0 AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
  ORDER BY pk LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE bench_nodes SET current_job = :job, expired_job = NULL, lease_expires_at = now() + NULL::bigint * interval '1 second',
  updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY(SELECT pk FROM picked)) AND (SELECT count(*) FROM picked) = 1 RETURNING * \gset
\startpipeline
WITH u AS MATERIALIZED (SELECT n.pk, to_jsonb(n) AS doc, to_jsonb(n) AS before FROM bench_nodes n WHERE pk = ANY(ARRAY[:pk]::bigint[])),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'claimed', u.pk, u.doc FROM u),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.claim', 'node', u.pk, u.before, u.doc FROM u)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
\startpipeline
BEGIN;
SELECT pk, current_job, expired_job FROM bench_nodes WHERE pk = ANY(ARRAY[:pk]::bigint[]) ORDER BY pk FOR UPDATE;
UPDATE bench_nodes SET current_job = NULL, lease_expires_at = NULL, updated_at = now(), version = version + 1
  WHERE pk = ANY(ARRAY[:pk]::bigint[]) AND current_job = :job RETURNING *;
\endpipeline
\startpipeline
WITH u AS MATERIALIZED (SELECT n.pk, to_jsonb(n) AS doc, to_jsonb(n) AS before FROM bench_nodes n WHERE pk = ANY(ARRAY[:pk]::bigint[])),
  changes AS (INSERT INTO bench_node_changes (kind, node_pk, doc) SELECT 'released', u.pk, u.doc FROM u),
  audit AS (INSERT INTO bench_audit_log (principal, role, action, target_type, target_pk, before, after)
    SELECT 'bench-scheduler', 'scheduler', 'node.release', 'node', u.pk, u.before, u.doc FROM u)
SELECT pg_notify('registryd_bench', '');
COMMIT;
\endpipeline
