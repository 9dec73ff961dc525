package store

import (
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
	alone bool          // to run again alone, in the caller's goroutine
	done  chan struct{} // closed when a group is done with it
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
	case op.ctx.Err() != nil:
		err = op.ctx.Err() // the caller gave up: whatever else failed
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

// errGroupCancelled rolls a transaction back because the caller of one of
// its operations gave up before the COMMIT was sent: that operation must
// not commit. The others of a group run again, as a group.
var errGroupCancelled = errors.New("an operation's caller gave up")

// runTx runs ops in one transaction of at most three round trips (see
// pipeTx): BEGIN and every operation's statements, in order, each seeing
// what the earlier ones changed; the change-log and audit rows of those
// that changed something; a COMMIT. One operation alone sends its rows
// with the COMMIT, may take more round trips to settle, and runs under
// ctx, its caller's. A group runs under a context of its own (the
// statement timeout bounds each round trip), waits at most
// groupLockTimeout for a row lock, and commits nothing when the caller of
// one of its operations gave up before the COMMIT was sent
// (errGroupCancelled). An operation of a group that must run alone is
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
		if cancelled(ops) {
			return errGroupCancelled
		}
		b = tx.batch()
		changed := false
		for _, op := range ops {
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
		if !alone {
			// The rows go in a round trip of their own, and the callers are
			// asked again before the COMMIT: a caller that gave up meanwhile
			// must not find its operation committed after it looked.
			if err := tx.send(ctx, b); err != nil {
				return err
			}
			if cancelled(ops) {
				return errGroupCancelled
			}
			b = tx.batch()
		} else if cancelled(ops) {
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

// cancelled reports whether the caller of one of ops gave up.
func cancelled(ops []*groupOp) bool {
	return slices.ContainsFunc(ops, func(op *groupOp) bool { return op.ctx.Err() != nil })
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
// fails with its context's error and commits nothing; one whose caller
// gives up while its group runs does too, and the group runs again
// without it.
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
				op.alone = false
				op.err = fmt.Errorf("store: %s: a shared transaction panicked, its outcome unknown: %v", op.kind(), p)
			}
		}
		for _, op := range ops {
			close(op.done)
		}
	}()
	live := slices.Clone(ops) // ops stays whole: each is told it is done
	for {
		// Those whose callers gave up are answered with their context's
		// error; the rest run together, again after a roll-back that one
		// who gave up meanwhile caused (errGroupCancelled).
		live = slices.DeleteFunc(live, func(op *groupOp) bool {
			if err := op.ctx.Err(); err != nil {
				op.reset()
				op.alone, op.err = false, op.fail(err)
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
			op.alone = false
		}
		if !g.runOnce(live) {
			return
		}
	}
}

// runOnce runs live in one transaction and settles them, reporting
// whether it was rolled back because a caller gave up (they are to run
// again without it).
func (g *group) runOnce(live []*groupOp) (again bool) {
	committing, err := g.s.runTx(g.ctx, live)
	if errors.Is(err, errGroupCancelled) {
		if g.observe != nil {
			g.observe(0, err)
		}
		return true
	}
	if err == nil {
		n := 0
		for _, op := range live {
			if !op.alone {
				n++
			}
		}
		if g.observe != nil && n > 0 {
			g.observe(n, nil)
		}
		return false
	}
	if g.observe != nil {
		g.observe(0, err)
	}
	alone := !committing || rolledBack(err)
	for _, op := range live {
		op.reset()
		if alone {
			op.alone = true // alone, a cancelled one fails with its context's error
		} else {
			op.alone, op.err = false, op.fail(err)
		}
	}
	return false
}
