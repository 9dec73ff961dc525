package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// WithFoldChunk makes the folds of host_free_delta run under ctx move n
// deltas a transaction.
func WithFoldChunk(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, foldChunkKey{}, n)
}

// WithFoldObserver has each transaction of the folds run under ctx call
// f once it has committed.
func WithFoldObserver(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, foldObserverKey{}, f)
}

// FoldLockID is the advisory lock every fold of host_free_delta holds.
const FoldLockID = foldLockID

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
	queueClaim(b, c, "", on, new([]registry.Node), nil)
	return b.QueuedQueries[0].SQL, b.QueuedQueries[0].Arguments
}

// ScanBothWays reads every node with the store's select list and returns
// each row decoded from its bytes (rawscan.go) and scanned through pgx,
// and whether the rows' shape is one decodeNode reads.
func ScanBothWays(ctx context.Context, db *pgxpool.Pool) (decoded, scanned []registry.Node, raw bool, err error) {
	rows, err := db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY pk`)
	if err != nil {
		return nil, nil, false, err
	}
	defer rows.Close()
	raw = rawDecodable(rows.FieldDescriptions())
	var dec nodeDecoder
	var n registry.Node
	dests := nodeDests(&n)
	for rows.Next() {
		var d registry.Node
		if err := dec.decodeNode(rows.RawValues(), &d); err != nil {
			return nil, nil, raw, err
		}
		d.State = d.DeriveState()
		n = registry.Node{}
		if err := rows.Scan(dests...); err != nil {
			return nil, nil, raw, err
		}
		n.State = n.DeriveState()
		decoded, scanned = append(decoded, d), append(scanned, n.UTC())
	}
	return decoded, scanned, raw, rows.Err()
}

// ListDecodable reports whether the rows of ListNodes' statement for f are
// decoded from their bytes.
func ListDecodable(ctx context.Context, db *pgxpool.Pool, f registry.NodeFilter) (bool, error) {
	if err := f.Normalize(); err != nil {
		return false, err
	}
	sql, args := listQuery(f)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	return rawDecodable(rows.FieldDescriptions()), nil
}

// HoldGroups makes claims and releases queue, none running, until the
// function it returns lets the queue go as groups: it takes every runner,
// and gives them back. Nothing may be running when it is called (a runner
// under way would go on to the queue).
func HoldGroups(s *Store) (release func()) {
	g := s.group
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running != 0 || len(g.queue) != 0 {
		panic(fmt.Sprintf("HoldGroups: %d runners busy, %d queued", g.running, len(g.queue)))
	}
	g.running += g.runners
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.running -= g.runners
		g.startRunners()
	}
}

// GroupQueued is the number of claims and releases waiting for a group.
func GroupQueued(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// LentPages is the number of pages ListPage has out and tracks.
func LentPages(s *Store) int {
	s.pages.mu.Lock()
	defer s.pages.mu.Unlock()
	return len(s.pages.lent)
}

// MaxLent is how many lent pages are tracked at most.
const MaxLent = maxLent

// GroupRunners is how many claim and release transactions s runs at once.
func GroupRunners(s *Store) int { return s.group.runners }

// ShortClaim exposes the conflict of a claim that found too few nodes.
var ShortClaim = shortClaim

// FreezeLease stops l's renewals, as a frozen process stops renewing.
func FreezeLease(l *Lease) { l.stop() }

// RunClaimThenRelease runs, as one group, a claim c (under claimCtx) and
// then a release r, in that order, as a group's queue holds them when the
// release queued just before the claim of its job started (after
// jobClaims let it go), and each op marked alone after. It answers each
// one's error and nodes.
func RunClaimThenRelease(s *Store, claimCtx context.Context, ca registry.Actor, c registry.Claim, ra registry.Actor, r registry.Release) (claimErr error, claimed []registry.Node, releaseErr error, released []registry.Node) {
	if err := c.Normalize(); err != nil {
		panic(err)
	}
	if err := r.Normalize(); err != nil {
		panic(err)
	}
	free := true
	c.Filter.Free = &free
	cl := &claiming{c: c, owner: ca.Sub, caller: claimCtx}
	rl := &releasing{r: r, by: ra.Sub, admin: ra.Role == registry.RoleAdmin}
	ops := []*groupOp{
		{txOp: cl, ctx: claimCtx, actor: ca, done: make(chan struct{})},
		{txOp: rl, ctx: context.Background(), actor: ra, done: make(chan struct{})},
	}
	s.group.runGroup(ops)
	for _, op := range ops {
		if op.alone {
			s.runAlone(op)
		}
	}
	return ops[0].err, cl.nodes, ops[1].err, rl.released
}
