package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/registry"
)

// Translate exposes translate to the external tests, which cannot live in
// package store (they import pgtest, which imports store).
var Translate = translate

// AuditQuery exposes the statement ListAudit runs, for plans.
var AuditQuery = auditQuery

// SweepCandidates exposes the sweeper's candidate query, for plans.
var SweepCandidates = sweepCandidates

// WithImportChunk makes the import passes run under ctx write in chunks of
// n nodes, so tests cross chunk boundaries with small fleets.
func WithImportChunk(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, importChunkKey{}, n)
}

// HostCandidatesQuery exposes the statement a gang claim's try runs, for
// plans.
var HostCandidatesQuery = hostCandidatesQuery

// ClaimStatement is the statement a claim's first try runs (for a gang
// claim, with its host lookup), for plans.
func ClaimStatement(c registry.Claim) (string, []any) {
	free := true
	c.Filter.Free = &free
	b := &pgx.Batch{}
	var on func(*query) string
	if c.SameHost {
		on = onFirstCandidate(c.Filter, c.Count)
	}
	queueClaim(b, c, on, new([]registry.Node))
	return b.QueuedQueries[0].SQL, b.QueuedQueries[0].Arguments
}
