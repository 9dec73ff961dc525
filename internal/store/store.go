// Package store keeps the registry in PostgreSQL. It is the only package
// that speaks SQL; it returns the registry package's types and errors.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/registry"
)

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the registry's PostgreSQL storage. The zero value is not usable;
// call Open.
type Store struct {
	pool *pgxpool.Pool
	db   querier       // the pool, a held connection, or a transaction inside WithTx
	conn *pgxpool.Conn // set when the Store is bound to one connection (see TryLock)
	inTx bool
}

// Options tune the connection pool.
type Options struct {
	// MaxConns caps the pool; 0 keeps pgx's default (max(4, CPUs)) unless the
	// URL sets pool_max_conns.
	MaxConns int32
	// ConnectTimeout bounds a connection attempt so an unreachable database
	// answers quickly; default 5s unless the URL sets connect_timeout.
	ConnectTimeout time.Duration
}

// Open connects to the database at url. It does not check the schema; see
// SchemaStatus.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may echo the URL, password included: keep it out.
		return nil, errors.New("store: the database URL cannot be parsed")
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
		if cfg.ConnConfig.ConnectTimeout == 0 {
			cfg.ConnConfig.ConnectTimeout = 5 * time.Second
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", translate(err))
	}
	return &Store{pool: pool, db: pool}, nil
}

// Close releases every connection.
func (s *Store) Close() { s.pool.Close() }

// Pool exposes the pool for migrations and tests.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("store: ping: %w", translate(err))
	}
	return nil
}

// WithTx runs fn inside one transaction on a Store bound to it, committing
// when fn returns nil and rolling back otherwise. Nested calls reuse the
// outer transaction.
func (s *Store) WithTx(ctx context.Context, fn func(*Store) error) error {
	if s.inTx {
		return fn(s)
	}
	var tx pgx.Tx
	var err error
	if s.conn != nil {
		tx, err = s.conn.Begin(ctx)
	} else {
		tx, err = s.pool.Begin(ctx)
	}
	if err != nil {
		return translate(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := fn(&Store{pool: s.pool, db: tx, conn: s.conn, inTx: true}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return translate(err)
	}
	return nil
}

// Lock is a session-level advisory lock held on its own connection.
type Lock struct {
	conn  *pgxpool.Conn
	store *Store
}

// TryLock takes the advisory lock key without waiting. ok is false when
// another session holds it. The returned Lock's Store runs every query on
// the locking connection, so if that session dies the lock is gone and so
// is the ability to write under it: a replica that lost its session cannot
// go on as if it still held the lock.
func (s *Store) TryLock(ctx context.Context, key int64) (l *Lock, ok bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("store: lock: %w", translate(err))
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, fmt.Errorf("store: lock: %w", translate(err))
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return &Lock{conn: conn, store: &Store{pool: s.pool, db: conn, conn: conn}}, true, nil
}

// Store returns a Store bound to the lock's connection.
func (l *Lock) Store() *Store { return l.store }

// Release gives the lock back (closing the connection if unlocking fails,
// which releases it just as surely).
func (l *Lock) Release(ctx context.Context) {
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		l.conn.Hijack().Close(ctx)
		return
	}
	l.conn.Release()
}

// translate maps driver errors onto the registry's sentinel kinds. Errors it
// does not recognise pass through unchanged (and become 500s upstream).
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutting down, crash, starting
			len(pgErr.Code) == 5 && pgErr.Code[:2] == "08", // connection exception
			pgErr.Code == "53300":                          // too many connections
			return &unavailableError{err}
		}
		return err
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return &unavailableError{err}
	}
	return err
}

// unavailableError keeps the driver's error for logs while matching
// registry.ErrUnavailable.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "database unavailable: " + e.err.Error() }
func (e *unavailableError) Is(target error) bool {
	return target == registry.ErrUnavailable
}
func (e *unavailableError) Unwrap() error { return e.err }

// pgCode returns the SQLSTATE of err and the constraint it names, if any.
func pgCode(err error) (code, constraint string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, pgErr.ConstraintName
	}
	return "", ""
}

const (
	codeUniqueViolation     = "23505"
	codeForeignKeyViolation = "23503"
)
