-- +goose Up
-- The audit list filters by action and by role. Both columns have been
-- NOT NULL and written with every entry since the audit log began
-- (00002_owner_audit), so every existing row can be filtered and there is
-- nothing to backfill: role is the writer's role at the time it wrote
-- (admin, scheduler, agent, reader, or system for the sync worker and the
-- command line). Each index keeps a filtered page a walk in id order over
-- the matching entries, however many others the log holds.
CREATE INDEX audit_log_action_idx ON audit_log (action, id);
CREATE INDEX audit_log_role_idx ON audit_log (role, id);

-- +goose Down
DROP INDEX audit_log_role_idx;
DROP INDEX audit_log_action_idx;
