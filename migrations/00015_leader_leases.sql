-- +goose Up
-- Leadership of the background work that one replica does at a time (the
-- sweeper, sync): a lease with an expiry in the database's clock, renewed
-- by its holder while it lives. A replica that freezes stops renewing, its
-- lease runs out and another takes it over, whatever its sessions do (an
-- advisory lock lasted as long as a frozen replica's open session).
-- token counts the leaderships of name: it grows at every takeover, and a
-- leader's transactions commit only while the row still carries its token
-- and an expiry in the future (fencing).
CREATE TABLE leader_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    token      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE leader_leases;
