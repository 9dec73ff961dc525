-- +goose Up
-- Idempotency-Key: the first request of a principal with a key runs; a
-- retry with the same key and fingerprint (path and body) gets its answer,
-- on any replica, until keep_until. While the first runs (request_id, with
-- its lease running_until), retries wait; once the lease runs out the
-- runner is taken for dead, and the audit log says whether its request
-- changed anything (its entries carry request_id).
CREATE TABLE idempotency_keys (
    principal     text NOT NULL,
    key           text NOT NULL,
    fingerprint   bytea NOT NULL,
    request_id    text NOT NULL,
    running_until timestamptz,          -- NULL: done
    status        int,
    content_type  text,
    body          bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    keep_until    timestamptz NOT NULL,
    PRIMARY KEY (principal, key)
);
CREATE INDEX idempotency_keys_keep_until_idx ON idempotency_keys (keep_until);

-- +goose Down
DROP TABLE idempotency_keys;
