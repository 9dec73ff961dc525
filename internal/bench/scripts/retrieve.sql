-- retrieve: the node by pk, with its last_seen, as GET /v1/nodes/{pk} reads it.
\set pk random(:minpk, :maxpk)
SELECT n.*, (SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = n.pk) FROM nodes n WHERE n.pk = :pk;
