-- +goose Up
-- Jobs and their owners. A job belongs to the principal (token subject)
-- that claimed it while it holds nodes; once it holds none, the next
-- principal to claim it owns it. Claims, renewals and releases of a job
-- lock its row first, so the database orders them whichever replica they
-- reach: a release waits for a claim of the same job under way anywhere.
-- The jobs holding nodes now belong to the principal whose claim the audit
-- log shows took their lowest node; owner NULL when it does not say (anyone
-- may act on such a job; the next claim takes it).
CREATE TABLE jobs (
    job        bigint PRIMARY KEY,
    owner      text,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
-- The sweeper deletes the rows of old jobs that hold nothing (a job's next
-- claimer owns it anyway), oldest first.
CREATE INDEX jobs_claimed_at_idx ON jobs (claimed_at);
INSERT INTO jobs (job, owner)
SELECT DISTINCT ON (n.current_job) n.current_job,
    (SELECT a.principal FROM audit_log a
     WHERE a.target_type = 'node' AND a.target_pk = n.pk AND a.action = 'node.claim'
     ORDER BY a.id DESC LIMIT 1)
FROM nodes n WHERE n.current_job IS NOT NULL
ORDER BY n.current_job, n.pk;

-- +goose Down
DROP TABLE jobs;
