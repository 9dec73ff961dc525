package store

import (
	"context"
	"fmt"
)

// FeedPosition returns, read in one snapshot, the feed's position — the
// newest event id handed out in the current epoch (never below the
// epoch's start or the pruning horizon) — and whether committed changes
// are waiting to be sequenced.
//
// It is what a consistent read proves itself against: every change
// committed before the call began is either sequenced, with an id of at
// most latest, or pending. When pending is false, a reader that has
// applied every event up to latest has every such change.
//
// When the database is not the one the feed last stamped ids in (see
// feedVerdictSQL), the ids a reader applied may be lost: latest is then
// at most the start of the epoch the sequencer's next pass begins and
// above every id handed out before, and pending is true. So no reader
// proves itself current with ids of a database that lost them until it
// has followed the feed into the new epoch. seen is the newest id the
// caller read from the feed before the call: a database that never
// handed it out (it lost it) gets the same answer, even before anything
// else betrays it.
func (s *Store) FeedPosition(ctx context.Context, seen int64) (latest int64, pending bool, err error) {
	var reason *string
	var nextEpoch int64
	err = s.db.QueryRow(ctx, `
		WITH v AS (`+feedVerdictSQL+`)
		SELECT greatest(v.log_max, v.high, v.epoch << 40, (SELECT pruned_through FROM node_changes_horizon)),
		       EXISTS (SELECT 1 FROM node_changes WHERE event_id IS NULL), v.reason, v.next_epoch
		FROM v`, seen).Scan(&latest, &pending, &reason, &nextEpoch)
	if err != nil {
		return 0, false, fmt.Errorf("store: feed position: %w", translate(err))
	}
	if reason != nil {
		return nextEpoch << EpochBits, true, nil
	}
	return latest, pending, nil
}
