-- +goose Up
-- Tokens stopped before they expire, without rotating the signing keys.
-- A row revokes either every token of a subject issued before
-- revoked_before (and every token of it without "iat"), or the one token
-- whose "jti" is jti. Each replica keeps the whole table in memory and
-- reloads it on NOTIFY registry_token_revocations, so checking a token
-- costs no query. A jti row may be pruned once the token has expired
-- anyway (until); until is NULL when its expiry is unknown, and the row is
-- then kept for the longest token lifetime registryd accepts.
CREATE TABLE token_revocations (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sub            text CONSTRAINT token_revocations_sub_key UNIQUE,
    revoked_before timestamptz,
    jti            text CONSTRAINT token_revocations_jti_key UNIQUE,
    until          timestamptz,
    revoked_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((sub IS NULL) <> (jti IS NULL)),
    CHECK ((sub IS NULL) = (revoked_before IS NULL)),
    CHECK (sub IS NULL OR until IS NULL)
);

-- +goose Down
DROP TABLE token_revocations;
