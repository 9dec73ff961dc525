package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/registryd/registryd/internal/registry"
)

// groupRunners is how many claim and release transactions run at once:
// half the pool's connections, at least minRunners (the pool's default of
// 4 on a small machine: 2, which measured best there, see
// docs/benchmarks.md), so that a larger pool on a larger database runs
// more groups side by side. groupMax is the most operations one group
// carries.
const (
	minRunners = 2
	groupMax   = 64
)

func groupRunners(maxConns int32) int { return max(minRunners, int(maxConns)/2) }

// group runs claims and releases that arrive while others are under way
// together, in one transaction (group commit). A claim and its release
// cost PostgreSQL about as much in transaction overhead (BEGIN, COMMIT
// and its WAL flush, the notification, the round trips) as in their
// statements; a group pays that once for all its operations.
//
// Each operation keeps its own statements, and they run one after
// another in the transaction, each seeing what the earlier ones changed:
// a claim's pick never takes a node an earlier claim of the group took,
// and a release frees what it frees for the claims after it. Each keeps
// its own change-log and audit rows, under its own actor. So a group
// commits exactly what its operations would have committed one by one in
// that order, and every operation is still all or nothing:
//   - a claim that finds too few nodes changes nothing in the group (its
//     update takes all or none) and is run again alone once the group has
//     committed, which answers it as if it had come a moment later;
//   - a group that fails before anything could commit (an error the
//     server reported, which rolls the transaction back, or one before its
//     COMMIT was sent) is run again one operation at a time, alone, so an
//     operation's error is its own; so is a group that waited past
//     groupLockTimeout for a row lock (see there), and one whose caller of
//     an operation gave up before its COMMIT was sent (that operation then
//     fails with its context's error, and commits nothing);
//   - a group whose COMMIT's outcome is unknown (the connection lost on
//     the way) fails each of its operations with that error, as a lone
//     transaction would.
//
// An operation alone (nothing else queued, a runner free) runs in its
// caller's goroutine with its own context, exactly as without grouping,
// so a quiet registry pays nothing for it. Operations queue only while
// runners transactions are under way; the queue then goes as one group
// when a runner is free.
type group struct {
	s       *Store
	runners int                            // groupRunners of the pool
	observe func(committed int, err error) // Options.ObserveGroup

	mu      sync.Mutex
	queue   []*groupOp
	running int // runners (callers running their own operation, or goroutines running groups)
	held    bool
	// claiming counts the claims of each job under way (queued, in a
	// group or alone), and settled is closed (and replaced) whenever one
	// ends: a release of a job waits for its claims (see waitClaims).
	claiming map[int64]int
	settled  chan struct{}

	grouped atomic.Int64 // operations committed in groups of two or more
}

// groupOp is a claim (release nil) or a release waiting in, or carried
// by, a group.
type groupOp struct {
	ctx     context.Context
	actor   registry.Actor
	claim   registry.Claim
	release *releasing

	nodes []registry.Node // claimed or released
	err   error
	alone bool // the caller is to run it alone
	done  chan struct{}
}

// claimStarts notes a claim of job under way; claimEnds its end.
func (g *group) claimStarts(job int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claiming == nil {
		g.claiming, g.settled = map[int64]int{}, make(chan struct{})
	}
	g.claiming[job]++
}

func (g *group) claimEnds(job int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claiming[job]--; g.claiming[job] <= 0 {
		delete(g.claiming, job)
	}
	close(g.settled)
	g.settled = make(chan struct{})
}

// waitClaims waits until no claim of job is under way on this replica (or
// ctx ends). A scheduler whose claim timed out often releases its job at
// once; its claim may still be committing (a COMMIT on its way cannot be
// called back), and a release that read the nodes before that commit
// would find nothing, leaving the claimed nodes held. Waiting for the
// claim's outcome makes the release see them. Across replicas the window
// is the COMMIT's round trip, as for any transaction.
func (g *group) waitClaims(ctx context.Context, job int64) error {
	for {
		g.mu.Lock()
		n, settled := g.claiming[job], g.settled
		g.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-settled:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// do runs op, in a group or alone (alone runs it in a transaction of its
// own, with its own context, and sets its outcome); its outcome is in op.
func (g *group) do(op *groupOp, alone func()) {
	g.mu.Lock()
	if g.running < g.runners && len(g.queue) == 0 && !g.held {
		// Nothing waits: op goes alone, in this goroutine, as a runner. A
		// group that queues meanwhile is started when it is done.
		g.running++
		g.mu.Unlock()
		defer g.next()
		alone()
		return
	}
	op.done = make(chan struct{})
	g.queue = append(g.queue, op)
	g.startRunners()
	g.mu.Unlock()
	select {
	case <-op.done:
	case <-op.ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.queue, op); i >= 0 {
			g.queue = slices.Delete(g.queue, i, i+1)
			g.mu.Unlock()
			op.err = fmt.Errorf("store: %s: %w", op.kind(), translate(op.ctx.Err()))
			return
		}
		g.mu.Unlock()
		// Under way: its outcome is the transaction's, waited for (the
		// statement timeout bounds it) so that what is answered is true.
		<-op.done
	}
	if op.alone {
		alone()
	}
}

// startRunners starts runners for the queue while fewer than g.runners
// run. g.mu is held.
func (g *group) startRunners() {
	for !g.held && len(g.queue) > 0 && g.running < g.runners {
		g.running++
		go g.run()
	}
}

// hold makes every operation queue, and no group start, until unhold:
// tests use it to make groups of the size they want.
func (g *group) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = true
}

// unhold lets the queue go again, as groups.
func (g *group) unhold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = false
	g.startRunners()
}

// queued is the number of operations waiting.
func (g *group) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// next hands a runner that is done over to the queue: a goroutine runs
// groups until the queue is empty, or the runner is given back.
func (g *group) next() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 || g.held {
		g.running--
		return
	}
	go g.run()
}

// run runs queued groups, holding one runner, until the queue is empty.
func (g *group) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 || g.held {
			g.running--
			g.mu.Unlock()
			return
		}
		n := min(len(g.queue), groupMax)
		ops := slices.Clone(g.queue[:n])
		g.queue = slices.Delete(g.queue, 0, n)
		g.mu.Unlock()
		g.runGroup(ops)
	}
}

// runGroup runs ops in one transaction, or hands them back to be run
// alone, and tells each it is done.
func (g *group) runGroup(ops []*groupOp) {
	defer func() {
		// A panic here would end the process (no handler's recovery
		// covers a runner) and leave the callers waiting: each is failed
		// instead, the outcome unknown.
		if p := recover(); p != nil {
			for _, op := range ops {
				op.nodes, op.alone = nil, false
				op.err = fmt.Errorf("store: %s: a shared transaction panicked, its outcome unknown: %v", op.kind(), p)
			}
		}
		for _, op := range ops {
			close(op.done)
		}
	}()
	live := ops[:0:0]
	for _, op := range ops {
		if err := op.ctx.Err(); err != nil {
			op.err = fmt.Errorf("store: %s: %w", op.kind(), translate(err))
			continue
		}
		live = append(live, op)
	}
	if len(live) < 2 {
		for _, op := range live {
			op.alone = true
		}
		return
	}
	committing, err := g.s.commitGroup(live)
	switch {
	case err == nil:
		n := 0
		for _, op := range live {
			if !op.alone {
				n++
			}
		}
		g.grouped.Add(int64(n))
		if g.observe != nil && n > 0 {
			g.observe(n, nil)
		}
	default:
		if g.observe != nil {
			g.observe(0, err)
		}
		again := !committing || rolledBack(err)
		for _, op := range live {
			op.nodes, op.err = nil, nil
			if op.release != nil {
				op.release = &releasing{r: op.release.r}
			}
			if again {
				op.alone = true // alone, a cancelled one fails with its context's error
			} else {
				op.alone, op.err = false, fmt.Errorf("store: %s: %w", op.kind(), translate(err))
			}
		}
	}
}

// rolledBack reports whether err says the transaction did not commit:
// the server reported an error (the rest of the round trip, COMMIT
// included, was skipped and the transaction is rolled back) or refused
// the COMMIT. An error that ended the session (FATAL: the server shutting
// down, the backend terminated) says nothing of a COMMIT it may have
// followed.
func rolledBack(err error) bool {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.SeverityUnlocalized == "ERROR"
	}
	return errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, errGroupCancelled)
}

// errGroupCancelled rolls a group back because the caller of one of its
// operations gave up before the COMMIT was sent: that operation must not
// commit. The others are run again alone.
var errGroupCancelled = errors.New("an operation's caller gave up")

// groupLockTimeout bounds each wait of a group's statements for a row
// lock. Claims never wait (SKIP LOCKED); a release waits for the nodes it
// names. Operations alone lock node rows in pk order, so none can
// deadlock with another; a group's releases, one after another, lock in
// the order the requests came, and a wait behind another transaction
// would hold up every claim of the group. Past this bound the group is
// rolled back (55P03, an ERROR) and each of its operations run again
// alone, where it waits as it always did; the bound is well under
// PostgreSQL's deadlock_timeout (1 s), so a group caught in a deadlock
// gives way before the other transaction is chosen to fail.
const groupLockTimeout = "100ms"

// commitGroup runs ops' statements in one transaction of three round
// trips (see pipeTx): BEGIN and every operation's statements, in order;
// the change-log and audit rows of those that changed something; then
// a COMMIT of its own. A claim that found too few nodes is marked to run
// alone. When the caller of an operation gave up before the COMMIT is
// sent, nothing is committed (errGroupCancelled). It reports whether the
// COMMIT was sent.
func (s *Store) commitGroup(ops []*groupOp) (committing bool, err error) {
	ctx := context.Background() // the group's; the statement timeout bounds each round trip
	err = s.pipelined(ctx, func(tx *pipeTx) error {
		b := tx.batch()
		b.Queue(`SET LOCAL lock_timeout = '` + groupLockTimeout + `'`)
		for _, op := range ops {
			if op.release != nil {
				op.release.queue(b)
			} else {
				queueClaim(b, op.claim, nil, &op.nodes)
			}
		}
		if err := tx.send(ctx, b); err != nil {
			return err
		}
		if cancelled(ops) {
			return errGroupCancelled
		}
		b = tx.batch()
		changed := false
		for _, op := range ops {
			if op.release != nil {
				if err := op.release.settle(); err != nil {
					return err
				}
				op.nodes = op.release.released
				if len(op.nodes) > 0 {
					op.release.record(b, op.actor)
					changed = true
				}
				continue
			}
			if len(op.nodes) < op.claim.Count {
				// Too few: its update changed nothing. Alone, after the
				// group, it says how many there are.
				op.nodes, op.alone = nil, true
				continue
			}
			slices.SortFunc(op.nodes, func(a, b registry.Node) int { return cmp.Compare(a.PK, b.PK) })
			queueClaimRecord(b, op.actor, op.nodes)
			changed = true
		}
		if !changed {
			return nil // nothing changed; the transaction is rolled back
		}
		// The records go in a round trip of their own, and the callers are
		// asked again before the COMMIT: for a large group that round trip
		// takes milliseconds, and a caller that gave up meanwhile (a
		// scheduler whose client timed out, which then releases what its
		// job holds) must not find its claim committed after that release
		// looked. What is left is the COMMIT's own round trip, the window a
		// lone transaction has too.
		if err := tx.send(ctx, b); err != nil {
			return err
		}
		if cancelled(ops) {
			return errGroupCancelled
		}
		committing = true
		return tx.commit(ctx, tx.batch())
	})
	return committing, err
}

// cancelled reports whether the caller of one of ops gave up.
func cancelled(ops []*groupOp) bool {
	return slices.ContainsFunc(ops, func(op *groupOp) bool { return op.ctx.Err() != nil })
}

func (op *groupOp) kind() string {
	if op.release != nil {
		return "release"
	}
	return "claim"
}
