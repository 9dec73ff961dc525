-- free page: 100 free nodes with at least 80 GiB of GPU memory after a
-- random pk, as POST /v1/nodes/list reads them.
\set after random(0, :maxpk - 1)
SELECT n.*, (SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = n.pk) FROM nodes n
WHERE n.pk > :after AND current_job IS NULL AND schedulable AND NOT lost AND cordon_reason IS NULL
  AND gpu_mem >= 85899345920
ORDER BY n.pk LIMIT 100;
