-- +goose Up
-- Jobs and their owners. A job belongs to the principal (token subject)
-- that claimed it while it holds nodes; once it holds none, the next
-- principal to claim it owns it. Claims, renewals and releases of a job
-- lock its row first, so the database orders them whichever replica they
-- reach: a release waits for a claim of the same job under way anywhere.
-- owner NULL: claimed before owners were kept (anyone may act on it; the
-- next claim takes it).
CREATE TABLE jobs (
    job        bigint PRIMARY KEY,
    owner      text,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO jobs (job)
SELECT DISTINCT current_job FROM nodes WHERE current_job IS NOT NULL;

-- +goose Down
DROP TABLE jobs;
