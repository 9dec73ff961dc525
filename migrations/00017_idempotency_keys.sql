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

-- registryd_hold_key runs last in the transaction of a request sent with a
-- key, before its COMMIT: it fails the transaction (SQLSTATE RK001) unless
-- the key is still that request's and its lease has not run out, and keeps
-- the key's row share-locked until the COMMIT, so a retry's take-over waits
-- for it and then sees what it committed.
-- +goose StatementBegin
CREATE FUNCTION registryd_hold_key(p text, k text, rid text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM idempotency_keys
    WHERE principal = p AND key = k AND request_id = rid AND running_until > now()
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the Idempotency-Key was taken over by a retry' USING ERRCODE = 'RK001';
    END IF;
END $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION registryd_hold_key(text, text, text);
DROP TABLE idempotency_keys;
