package store

// Translate exposes translate to the external tests, which cannot live in
// package store (they import pgtest, which imports store).
var Translate = translate

// AuditQuery exposes the statement ListAudit runs, for plans.
var AuditQuery = auditQuery

// SweepCandidates exposes the sweeper's candidate query, for plans.
var SweepCandidates = sweepCandidates

// HostCandidatesQuery exposes the statement a gang claim's try runs, for
// plans.
var HostCandidatesQuery = hostCandidatesQuery
