package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/registryd/registryd/internal/registry"
)

// Claims and releases run through one path, runTx, as a group of one or
// of many operations in one transaction (group commit). Why and how it
// pays: docs/design.md, "Claims and releases".

// txOp is a claim or a release: the statements of one operation, written
// once, and run alone in a transaction or beside others in one.
type txOp interface {
	// queue queues the operation's statements on b, the transaction's
	// first round trip.
	queue(b *pgx.Batch)
	// settle decides the operation's outcome from what its statements
	// returned, and queues the change-log and audit rows of the nodes it
	// changed on the batch it returns, reporting whether there were any.
	// Alone in its transaction (alone), it may first send more round
	// trips through tx, b being the batch of the next one. Beside others
	// it never sends, and answers errRunAlone when it needs to.
	settle(ctx context.Context, tx *pipeTx, b *pgx.Batch, actor registry.Actor, alone bool) (next *pgx.Batch, changed bool, err error)
	// shares reports whether it may run beside others.
	shares() bool
	// reset forgets an outcome, for the operation to run again.
	reset()
	// kind names it in errors: "claim" or "release".
	kind() string
}

// withdrawer is an operation that can be taken out of a group's
// transaction once its statements ran: withdraw queues the statements
// that undo what they changed, before the group's COMMIT. A claim is
// (a caller that gave up must not find its nodes held); a release is
// not (it commits whoever waits for it: freeing nodes is what it asked).
type withdrawer interface {
	withdraw(b *pgx.Batch)
	// job is the job whose claim it is: a release of that job later in
	// the group may take the claim's nodes in the same transaction, and
	// the claim is then not withdrawn (see releasesLater).
	job() int64
}

// releasesLater reports whether one of ops releases job: it would release
// what a claim of job before it took, in the same transaction, so that
// claim must commit (and be released) rather than be withdrawn, which
// would leave a release of nodes nobody saw claimed.
func releasesLater(ops []*groupOp, job int64) bool {
	return slices.ContainsFunc(ops, func(op *groupOp) bool {
		rl, ok := op.txOp.(*releasing)
		return ok && rl.r.Job == job
	})
}

// errRunAlone is what an operation's settle answers, in a group, when it
// changed nothing and must run again alone after the group (a claim that
// found too few nodes; alone, it says how many there are).
var errRunAlone = errors.New("run alone")

// groupOp is one caller's operation on its way to a transaction.
type groupOp struct {
	txOp
	ctx   context.Context
	actor registry.Actor
	err   error
	alone bool // to run again alone, in the caller's goroutine
	// gone: withdrawn from its group's transaction, its caller having
	// given up; it fails with its context's error.
	gone bool
	done chan struct{} // closed when a group is done with it
}

// run runs op, alone or in a group, and returns its error. A store in a
// transaction or on a held connection has no group: op runs alone in it.
func (s *Store) run(op *groupOp) error {
	if s.group == nil || !op.shares() {
		s.runAlone(op)
	} else {
		s.group.do(op)
	}
	return op.err
}

// runAlone runs op in a transaction of its own under its caller's context
// (or in the one under way), and sets its error.
func (s *Store) runAlone(op *groupOp) {
	op.reset()
	op.alone = false
	_, err := s.runTx(op.ctx, []*groupOp{op})
	switch {
	case err == nil:
	case keyLost(err):
		err = keyTakenOver()
	case op.ctx.Err() != nil || errors.Is(err, errGroupCancelled):
		err = cmp.Or(op.ctx.Err(), context.Canceled) // the caller gave up: whatever else failed
	}
	op.err = op.fail(err)
}

// fail is err as the operation's caller gets it: a registry error as it
// is, another wrapped once.
func (op *groupOp) fail(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*registry.Error](err); ok {
		return err
	}
	return fmt.Errorf("store: %s: %w", op.kind(), translate(err))
}

// groupLockTimeout bounds each wait of a group's statements for a row
// lock. It must stay under PostgreSQL's deadlock_timeout (1 s): a group
// locks rows in the order its requests came, not in pk order, so it can
// deadlock with a pk-ordered writer, and it is the group that must give
// way (then each of its operations runs alone), not the other writer.
const groupLockTimeout = "100ms"

// errGroupCancelled rolls back the transaction of an operation alone
// because its caller gave up before the COMMIT was sent: it must not
// commit.
var errGroupCancelled = errors.New("an operation's caller gave up")

// runTx runs ops in one transaction of two round trips (see pipeTx):
// BEGIN and every operation's statements, in order, each seeing what the
// earlier ones changed; then the change-log and audit rows of those that
// changed something, with the COMMIT. One operation alone may take more
// round trips to settle, runs under ctx, its caller's, and commits
// nothing when its caller gave up (registry.Gone) before the COMMIT was
// sent (errGroupCancelled). A group runs under a context of its own (the
// statement timeout bounds each round trip) and waits at most
// groupLockTimeout for a row lock; a claim of it whose caller gave up
// once its statements ran is withdrawn (see withdrawer) and marked gone,
// and the others commit. An operation of a group that must run alone is
// marked so. It reports whether the COMMIT was sent.
func (s *Store) runTx(ctx context.Context, ops []*groupOp) (committing bool, err error) {
	alone := len(ops) == 1
	// Once it has a connection, the transaction's statements run to their
	// end even if a caller gives up: a statement cancelled mid-way costs
	// the connection (and PostgreSQL a new backend), which clients that
	// give up on claims by the thousand would make everyone pay. Callers
	// are asked instead, between round trips and before the COMMIT; the
	// statement timeout bounds each round trip.
	outer := ctx
	ctx = context.WithoutCancel(ctx)
	err = s.pipelined(outer, func(tx *pipeTx) error {
		if alone && cancelled(ops) {
			return errGroupCancelled // nothing sent yet: nothing to undo
		}
		b := tx.batch()
		if !alone {
			b.Queue(`SET LOCAL lock_timeout = '` + groupLockTimeout + `'`)
		}
		for _, op := range ops {
			op.queue(b)
		}
		if err := tx.send(ctx, b); err != nil {
			return err
		}
		if alone && cancelled(ops) {
			return errGroupCancelled
		}
		b = tx.batch()
		changed := false
		for i, op := range ops {
			if w, ok := op.txOp.(withdrawer); ok && !alone && registry.Gone(op.ctx) && !releasesLater(ops[i+1:], w.job()) {
				// Its caller gave up: the others commit, without it.
				w.withdraw(b)
				op.gone = true
				continue
			}
			next, c, err := op.settle(ctx, tx, b, op.actor, alone)
			if errors.Is(err, errRunAlone) {
				op.alone = true
				continue
			}
			if err != nil {
				return err
			}
			b, changed = next, changed || c
		}
		if !changed {
			return nil // nothing changed; the transaction is rolled back
		}
		if alone && cancelled(ops) {
			return errGroupCancelled
		}
		queueHolds(b, ops)
		committing = true
		return tx.commit(ctx, b)
	})
	return committing, err
}

// keyLost reports whether err is registryd_hold_key's: the request's
// Idempotency-Key was taken over.
func keyLost(err error) bool {
	code, _ := pgCode(err)
	return code == "RK001"
}

// cancelled reports whether the caller of one of ops gave up (see
// registry.Gone).
func cancelled(ops []*groupOp) bool {
	return slices.ContainsFunc(ops, func(op *groupOp) bool { return registry.Gone(op.ctx) })
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

// minRunners is the fewest transactions of claims and releases a store
// runs at once; groupMax the most operations one group carries.
const (
	minRunners = 2
	groupMax   = 64
)

// groupRunners is how many claim and release transactions run at once for
// a pool of maxConns connections: half of them, at least minRunners.
func groupRunners(maxConns int32) int { return max(minRunners, int(maxConns)/2) }

// group queues the operations that arrive while its runners are all busy
// and runs the queue, as groups of at most groupMax, when one is free.
//
// Invariants: an operation is all or nothing, and a group commits exactly
// what its operations would have committed one by one in their order. An
// operation runs alone, in its caller's goroutine with its caller's
// context, whenever a runner is free and nothing waits, so a quiet
// registry pays nothing for grouping. A group that fails before its
// COMMIT could have committed (rolledBack) runs each operation again
// alone; one whose COMMIT's outcome is unknown fails each with that
// error. An operation whose caller gives up while it waits in the queue
// fails with its context's error and commits nothing; so does a claim
// whose caller gives up while its group runs, up to the COMMIT (the group
// withdraws it and commits the others). A release whose caller gave up
// commits with its group.
type group struct {
	s *Store
	// ctx is what groups run under: no caller's values or cancellation
	// (runTx checks its callers between round trips; the statement
	// timeout bounds each).
	ctx     context.Context
	runners int
	observe func(committed int, err error) // Options.ObserveGroup

	mu      sync.Mutex
	queue   []*groupOp
	running int // runners busy: callers running their own operation, or goroutines running groups
}

func newGroup(ctx context.Context, s *Store, runners int, observe func(committed int, err error)) *group {
	return &group{s: s, ctx: context.WithoutCancel(ctx), runners: runners, observe: observe}
}

// do runs op, alone or in the next group, and sets its outcome.
func (g *group) do(op *groupOp) {
	g.mu.Lock()
	if g.running < g.runners && len(g.queue) == 0 {
		// Nothing waits: op goes alone, in this goroutine, as a runner. A
		// group that queues meanwhile is started when it is done.
		g.running++
		g.mu.Unlock()
		defer g.next()
		g.s.runAlone(op)
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
			op.err = op.fail(op.ctx.Err())
			return
		}
		g.mu.Unlock()
		// Under way: its outcome is the transaction's, waited for (the
		// statement timeout bounds it) so that what is answered is true.
		<-op.done
	}
	if op.alone {
		g.s.runAlone(op)
	}
}

// startRunners starts runners for the queue while fewer than g.runners
// run. g.mu is held.
func (g *group) startRunners() {
	for len(g.queue) > 0 && g.running < g.runners {
		g.running++
		go g.run()
	}
}

// next hands a runner that is done over to the queue: a goroutine runs
// groups until the queue is empty, or the runner is given back.
func (g *group) next() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.running--
		return
	}
	go g.run()
}

// run runs queued groups, holding one runner, until the queue is empty.
func (g *group) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
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

// runGroup runs ops in one transaction, or marks them to run alone, and
// tells each it is done.
func (g *group) runGroup(ops []*groupOp) {
	defer func() {
		// A panic here would end the process (no handler's recovery
		// covers a runner) and leave the callers waiting: each is failed
		// instead, the outcome unknown.
		if p := recover(); p != nil {
			for _, op := range ops {
				op.reset()
				op.alone, op.gone = false, false
				op.err = fmt.Errorf("store: %s: a shared transaction panicked, its outcome unknown: %v", op.kind(), p)
			}
		}
		for _, op := range ops {
			close(op.done)
		}
	}()
	// Those whose callers gave up already are answered with their
	// context's error, having run nothing; the rest run together.
	live := slices.DeleteFunc(slices.Clone(ops), func(op *groupOp) bool { // ops stays whole: each is told it is done
		if registry.Gone(op.ctx) {
			op.reset()
			op.alone, op.gone, op.err = false, false, op.fail(cmp.Or(op.ctx.Err(), context.Canceled))
			return true
		}
		return false
	})
	if len(live) < 2 {
		for _, op := range live {
			op.alone = true
		}
		return
	}
	for _, op := range live {
		op.reset()
		op.alone, op.gone = false, false
	}
	committing, err := g.s.runTx(g.ctx, live)
	if err == nil {
		n := 0
		for _, op := range live {
			switch {
			case op.gone: // withdrawn: it committed nothing
				op.reset()
				op.err = op.fail(cmp.Or(op.ctx.Err(), context.Canceled))
			case !op.alone:
				n++
			}
		}
		if g.observe != nil && n > 0 {
			g.observe(n, nil)
		}
		return
	}
	if g.observe != nil {
		g.observe(0, err)
	}
	alone := !committing || rolledBack(err)
	for _, op := range live {
		op.reset()
		op.gone = false
		if alone {
			op.alone = true // alone, a cancelled one fails with its context's error
		} else {
			op.alone, op.err = false, op.fail(err)
		}
	}
}
