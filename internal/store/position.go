package store

import (
	"context"
	"fmt"
)

// FeedPosition returns, read in one snapshot, the newest sequenced event
// id (never below the pruning horizon) and whether committed changes are
// waiting to be sequenced.
//
// It is what a consistent read proves itself against: every change
// committed before the call began is either sequenced, with an id of at
// most latest, or pending. When pending is false, a reader that has
// applied every event up to latest has every such change.
func (s *Store) FeedPosition(ctx context.Context) (latest int64, pending bool, err error) {
	// The pending check uses node_changes_unsequenced_idx; max(event_id)
	// the unique index on event_id.
	err = s.db.QueryRow(ctx, `
		SELECT greatest(coalesce((SELECT max(event_id) FROM node_changes), 0),
		                (SELECT pruned_through FROM node_changes_horizon)),
		       EXISTS (SELECT 1 FROM node_changes WHERE event_id IS NULL)`).Scan(&latest, &pending)
	if err != nil {
		return 0, false, fmt.Errorf("store: feed position: %w", translate(err))
	}
	return latest, pending, nil
}
