package store

import "context"

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
