-- +goose Up
-- A change row may stand for several events: a claim, a release, an
-- import chunk or any write of many nodes of one kind appends one row of
-- width n (at most 256) whose doc is the JSON array of the n nodes'
-- documents, in order. The sequencer stamps it with the first of n
-- consecutive event ids; the i-th document (from 0) is event
-- event_id + i. A row of width 1 is one event as before (a renewed row's
-- doc is an array of every renewed node, and it is one event). Fewer rows
-- to insert, stamp and prune: a gang of 32 was 32 rows.
--
-- The column's default makes adding it instant; its check is NOT VALID
-- (every existing row has the default), so adding it scans nothing.
ALTER TABLE node_changes ADD COLUMN width integer NOT NULL DEFAULT 1;
ALTER TABLE node_changes ADD CONSTRAINT node_changes_width_check CHECK (width BETWEEN 1 AND 256) NOT VALID;

-- A sequencer of a release before this migration (a replica not yet
-- rolled) would stamp a row of several events with one id and the next
-- row with the id after it, handing ids out twice. Only a sequencer that
-- says it knows rows of several events (registryd.event_blocks = on, set
-- for its transaction) may stamp one; an older one's pass fails and
-- stamps nothing, and the new replicas' sequencers do the stamping.
-- +goose StatementBegin
CREATE FUNCTION node_changes_stamp_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.width > 1 AND OLD.event_id IS NULL AND NEW.event_id IS NOT NULL
       AND current_setting('registryd.event_blocks', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'a change row of % events can be stamped only by a sequencer of migration 00022 or later', NEW.width
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER node_changes_stamp BEFORE UPDATE OF event_id ON node_changes
    FOR EACH ROW EXECUTE FUNCTION node_changes_stamp_check();

-- node_change_events is the log one event a row, as readers see it (ord
-- numbers a row's events from 1): for operators and tests; the server
-- expands rows itself.
CREATE VIEW node_change_events AS
    SELECT c.row_id, e.i AS ord, c.event_id + e.i - 1 AS event_id, c.at, c.kind,
           CASE WHEN c.width = 1 THEN c.node_pk ELSE (c.doc -> (e.i - 1) ->> 'pk')::bigint END AS node_pk,
           CASE WHEN c.width = 1 THEN c.doc ELSE c.doc -> (e.i - 1) END AS doc
    FROM node_changes c CROSS JOIN LATERAL generate_series(1, c.width) AS e(i);

-- +goose Down
-- Rows of several events become a row per event, with the ids they were
-- handed out under (unstamped ones stay unstamped, in their order), so
-- that no event is lost to a watcher resuming across the downgrade.
CREATE TEMP TABLE node_change_rows ON COMMIT DROP AS
    SELECT row_number() OVER (ORDER BY v.row_id, v.ord) AS n, v.event_id, v.at, v.kind, v.node_pk, v.doc
    FROM node_change_events v JOIN node_changes c ON c.row_id = v.row_id WHERE c.width > 1;
DELETE FROM node_changes WHERE width > 1;
INSERT INTO node_changes (event_id, at, kind, node_pk, doc)
    SELECT event_id, at, kind, node_pk, doc FROM node_change_rows ORDER BY n;
DROP VIEW node_change_events;
DROP TRIGGER node_changes_stamp ON node_changes;
DROP FUNCTION node_changes_stamp_check();
ALTER TABLE node_changes DROP COLUMN width;
