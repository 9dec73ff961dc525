-- +goose Up
-- request_id is the server's own id of the request that wrote, which a
-- client cannot choose. The X-Request-Id a client sent (kept when sane, for
-- following a request through proxies) goes here, apart from it. Rows
-- written before this migration hold whatever id they were given.
ALTER TABLE audit_log ADD COLUMN client_request_id text;

-- +goose Down
ALTER TABLE audit_log DROP COLUMN client_request_id;
