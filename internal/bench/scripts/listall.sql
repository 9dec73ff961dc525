-- listall: every node with its last_seen, in pk order, with the columns
-- POST /v1/nodes/list writes. Not a pgbench script: the harness runs it
-- through pgx once per full read and discards the rows, for PostgreSQL's
-- own time to hand over the whole fleet.
SELECT n.pk, host(n.ip), n.gpu_index, n.cpu_mem, n.driver_version, n.hardware_generation, n.gpu_mem,
	(SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = n.pk),
	n.current_job, n.lease_expires_at, n.owner, n.source, n.schedulable, n.lost, n.cordon_reason,
	n.external_id, n.provider_state, n.created_at, n.updated_at, n.version
FROM nodes n ORDER BY n.pk
