-- selector page: 100 free nodes whose labels match team=t3,rack!=r13
-- after a random pk, as POST /v1/nodes/list reads them from PostgreSQL
-- (store.query.requirement's SQL).
\set after random(0, :maxpk - 1)
SELECT n.*, (SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = n.pk) FROM nodes n
WHERE n.pk > :after AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
  AND labels ->> 'team' = 't3' AND (labels ->> 'rack') IS DISTINCT FROM 'r13'
ORDER BY n.pk LIMIT 100;
