-- +goose Up
-- The principal (token sub) of the agent that registered a node; only it,
-- or an admin, may act as the node. NULL for nodes an admin created.
ALTER TABLE nodes ADD COLUMN owner text;

CREATE TABLE audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text NOT NULL,
    role        text NOT NULL,
    acting_node bigint,
    action      text NOT NULL,
    target_type text NOT NULL,
    target_pk   bigint,
    before      jsonb,
    after       jsonb,
    request_id  text
);
CREATE INDEX audit_log_target_idx ON audit_log (target_type, target_pk, id);
CREATE INDEX audit_log_principal_idx ON audit_log (principal, id);
CREATE INDEX audit_log_at_idx ON audit_log (at);

-- The audit log is append-only: the API never changes or removes a row, and
-- this trigger makes sure nothing that goes through SQL does by accident.
-- +goose StatementBegin
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

-- +goose Down
DROP TABLE audit_log;
DROP FUNCTION audit_log_append_only();
ALTER TABLE nodes DROP COLUMN owner;
