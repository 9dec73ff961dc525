-- +goose Up
-- A change row may stand for several events: a claim, a release, an
-- import chunk or any write of many nodes of one kind appends one row of
-- width n (at most 256) whose doc is the JSON array of the n nodes'
-- documents, in order. The sequencer stamps it with the first of n
-- consecutive event ids; the i-th document (from 0) is event
-- event_id + i. A row of width 1 is one event as before (a renewed row's
-- doc is an array of every renewed node, and it is one event). Fewer rows
-- to insert, stamp and prune: a gang of 32 was 32 rows.
ALTER TABLE node_changes ADD COLUMN width integer NOT NULL DEFAULT 1
    CONSTRAINT node_changes_width_check CHECK (width BETWEEN 1 AND 256);

-- node_change_events is the log one event a row, as readers see it (ord
-- numbers a row's events from 1): for operators and tests; the server
-- expands rows itself.
CREATE VIEW node_change_events AS
    SELECT c.row_id, e.i AS ord, c.event_id + e.i - 1 AS event_id, c.at, c.kind,
           CASE WHEN c.width = 1 THEN c.node_pk ELSE (c.doc -> (e.i - 1) ->> 'pk')::bigint END AS node_pk,
           CASE WHEN c.width = 1 THEN c.doc ELSE c.doc -> (e.i - 1) END AS doc
    FROM node_changes c CROSS JOIN LATERAL generate_series(1, c.width) AS e(i);

-- +goose Down
-- Rows of several events cannot be kept: they go, and a replica that saw
-- them finds the log short of what it handed out (a new epoch).
DROP VIEW node_change_events;
DELETE FROM node_changes WHERE width > 1;
ALTER TABLE node_changes DROP COLUMN width;
