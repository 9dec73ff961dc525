package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// batcher sends a batch of statements in one round trip: a pool's
// connection or a transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// pipeTx is a transaction sent as batches, one round trip each: its BEGIN
// travels with the first batch and its COMMIT with the last. Statements
// that need no result of an earlier one go together.
//
// Inside WithTx it joins the transaction under way and neither begins nor
// commits it.
type pipeTx struct {
	db    batcher
	own   bool // begins and commits the transaction
	begun bool
}

// pipelined runs fn in a pipeTx on a connection of its own (or in the
// transaction under way), rolling back unless fn committed. fn's error is
// returned as is.
func (s *Store) pipelined(ctx context.Context, fn func(tx *pipeTx) error) error {
	if s.inTx {
		return fn(&pipeTx{db: s.db})
	}
	conn := s.conn
	if conn == nil {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return translate(err)
		}
		defer c.Release()
		conn = c
	}
	tx := &pipeTx{db: conn, own: true}
	err := fn(tx)
	if tx.begun && conn.Conn().PgConn().TxStatus() != 'I' {
		// fn failed, or returned before its commit. A rollback that fails
		// leaves the connection in a transaction: the pool then closes it
		// instead of handing it out again.
		// Under a context of its own: a caller who gave up must not cost
		// the connection too.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
	}
	return err
}

// batch is a new batch for the transaction's next round trip; the first
// one begins the transaction.
func (tx *pipeTx) batch() *pgx.Batch {
	b := &pgx.Batch{}
	if tx.own && !tx.begun {
		b.Queue("begin")
		tx.begun = true
	}
	return b
}

// send runs b's statements in one round trip and their callbacks in
// order, returning the first error.
func (tx *pipeTx) send(ctx context.Context, b *pgx.Batch) error {
	return translate(tx.db.SendBatch(ctx, b).Close())
}

// commit sends b and commits in the same round trip. When a statement of
// b fails, the commit is not run (the server skips the rest of a failed
// batch) and pipelined rolls back.
//
// A caller that gave up before commits nothing. Once the COMMIT is sent,
// giving up no longer cuts the round trip short (the statement timeout
// still bounds it): the server commits a COMMIT it has received whether
// the client waits or not, so the call returns only once the outcome is
// known, and what is answered (and what waits for it, such as a release
// of the same job, see jobClaims) is true.
func (tx *pipeTx) commit(ctx context.Context, b *pgx.Batch) error {
	if tx.own {
		if err := ctx.Err(); err != nil {
			return err
		}
		ctx = context.WithoutCancel(ctx)
		b.Queue("commit").Exec(func(ct pgconn.CommandTag) error {
			if ct.String() == "ROLLBACK" {
				return pgx.ErrTxCommitRollback
			}
			return nil
		})
	}
	return tx.send(ctx, b)
}
