// Package store keeps the registry in PostgreSQL. It is the only package
// that speaks SQL; it returns the registry package's types and errors.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/migrations"
)

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store is the registry's PostgreSQL storage. The zero value is not usable;
// call Open.
type Store struct {
	pool *pgxpool.Pool
	db   querier       // the pool, a held connection, or a transaction inside WithTx
	conn *pgxpool.Conn // set when the Store is bound to one connection (see TryLock)
	inTx bool
	// group carries concurrent claims and releases in shared
	// transactions; nil (each alone) in a transaction or on a held
	// connection.
	group *group
	// claims are the claims under way on this replica, by job; nil (none
	// tracked) in a transaction or on a held connection, where a claim
	// ends before the transaction commits.
	claims *jobClaims
	// unvacuumed counts the deltas folded out of host_free_delta since it
	// was last vacuumed (see FoldHostFree); shared with the stores bound
	// to one of the pool's connections.
	unvacuumed *atomic.Int64
	// pages lends pages of nodes (ListPage); nil on the stores made for
	// a transaction or a held connection, which list as ListNodes.
	pages *pageLender
	// fence, set on a leader's Store (Lease.Store), is checked by every
	// transaction WithTx commits.
	fence *fence
	// migrations are the schema this binary knows (Options.Migrations).
	migrations fs.FS
}

// Options tune the connection pool.
type Options struct {
	// Migrations are the goose migrations this store applies and whose
	// newest it takes for the schema it serves; the embedded
	// migrations.FS when nil. Tests of upgrades give a release's set.
	Migrations fs.FS
	// MaxConns caps the pool; 0 keeps pgx's default (max(4, CPUs)) unless the
	// URL sets pool_max_conns.
	MaxConns int32
	// ConnectTimeout bounds a connection attempt so an unreachable database
	// answers quickly; default 5s unless the URL sets connect_timeout.
	ConnectTimeout time.Duration
	// AcquireTimeout bounds how long a statement waits for a pooled
	// connection (a free one, or a new one being connected) before it fails
	// as unavailable; default 10s. With every connection busy — a database
	// that stopped answering, or more load than the pool serves — requests
	// then get 503 with Retry-After instead of queueing without end.
	AcquireTimeout time.Duration
	// StatementTimeout bounds each statement on a connection the pool
	// handed out, from sending it to reading its last row (a batch of
	// statements sent in one round trip, as a whole); default 30s.
	// A database that stops answering (a frozen host, a network partition
	// that resets nothing) then fails the statement as unavailable instead
	// of holding its request until the client gives up. Migrations, import
	// passes and pruning are not bounded (see withoutStatementTimeout).
	StatementTimeout time.Duration
	// IdleInTransactionTimeout ends a session of ours that sits idle in
	// an open transaction that long (the server's
	// idle_in_transaction_session_timeout), rolling it back and freeing
	// its locks: a replica frozen mid-transaction (SIGSTOP, a VM pause, a
	// long GC) holds no row hostage for longer. Default 5s.
	IdleInTransactionTimeout time.Duration
	// LockTimeout bounds each wait for a lock another session holds (the
	// server's lock_timeout); the statement then fails with an error
	// matching registry.ErrBusy. Default 10s. Group commits and waits for
	// the sync lock set tighter or looser bounds of their own.
	LockTimeout time.Duration
	// ObserveQuery, when set, is called as each statement ends (or fails
	// to get a connection) with "" on success, otherwise its ErrorClass:
	// what the failed-query metric counts. It runs on the statement's path,
	// so it must be quick.
	ObserveQuery func(class string)
	// ObserveGroup, when set, is called as each shared transaction of
	// claims and releases ends (see group): with the number of operations
	// it committed, or with the error that failed it (its operations were
	// then run again alone, or failed with it).
	ObserveGroup func(committed int, err error)
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
	sessionBounds(cfg.ConnConfig, opts)
	cfg.ConnConfig.Tracer = bounds{wait: cmp.Or(opts.AcquireTimeout, defaultAcquireTimeout),
		statement: cmp.Or(opts.StatementTimeout, defaultStatementTimeout), observe: opts.ObserveQuery}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", translate(err))
	}
	s := &Store{pool: pool, db: pool, claims: newJobClaims(), unvacuumed: new(atomic.Int64), pages: newPageLender(),
		migrations: opts.Migrations}
	if s.migrations == nil {
		s.migrations = migrations.FS
	}
	s.group = newGroup(ctx, s, groupRunners(pool.Config().MaxConns), opts.ObserveGroup)
	return s, nil
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
	if s.fence != nil {
		if err := s.fence.check(ctx, tx); err != nil {
			return err
		}
	}
	if h, ok := registry.KeyHoldFrom(ctx); ok {
		if _, err := tx.Exec(ctx, `SELECT registryd_hold_key($1, $2, $3)`, h.Principal, h.Key, h.RequestID); err != nil {
			if keyLost(err) {
				return keyTakenOver()
			}
			return translate(err)
		}
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
	return &Lock{conn: conn, store: &Store{pool: s.pool, db: conn, conn: conn, unvacuumed: s.unvacuumed}}, true, nil
}

// Lock takes the advisory lock key, waiting at most wait for the session
// holding it to let go: the server's lock_timeout bounds the wait, so it
// ends as soon as the lock is free, with no polling. ok is false when the
// lock was still held after wait. Like TryLock's, the returned Lock's
// Store runs every query on the locking connection.
func (s *Store) Lock(ctx context.Context, key int64, wait time.Duration) (l *Lock, ok bool, err error) {
	if wait < time.Millisecond {
		return s.TryLock(ctx, key)
	}
	// The statement runs for as long as the wait, longer than a statement
	// may; the server's lock_timeout bounds it instead, and ctx (with a
	// margin) in case the server stops answering.
	ctx, cancel := context.WithTimeout(withoutStatementTimeout(ctx), wait+10*time.Second)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("store: lock: %w", translate(err))
	}
	// A session-level lock taken inside a transaction outlives it, and SET
	// LOCAL confines the timeouts to that transaction.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)`,
			strconv.FormatInt(wait.Milliseconds(), 10)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
		return err
	})
	if pgErr, isPg := errors.AsType[*pgconn.PgError](err); isPg && pgErr.Code == "55P03" { // lock_not_available
		conn.Release()
		return nil, false, nil
	}
	if err != nil {
		conn.Hijack().Close(context.WithoutCancel(ctx)) // whatever state it is in, the lock goes with it
		return nil, false, fmt.Errorf("store: lock: %w", translate(err))
	}
	return &Lock{conn: conn, store: &Store{pool: s.pool, db: conn, conn: conn, unvacuumed: s.unvacuumed}}, true, nil
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

// translate maps driver errors onto the registry's sentinel kinds: every
// way the database can be unavailable becomes an error matching
// registry.ErrUnavailable (a 503 with Retry-After upstream). Errors it does
// not recognise pass through unchanged and become 500s: a bad statement or
// a broken invariant is a bug, and retrying it would not help.
func translate(err error) error {
	if err == nil {
		return nil
	}
	// The caller gave up (a client that went away): not an outage, and
	// not to be logged as one, whatever the driver made of it.
	if errors.Is(err, context.Canceled) {
		return err
	}
	if _, ok := errors.AsType[*unavailableError](err); ok {
		return err // already translated by an inner call
	}
	if _, ok := errors.AsType[*busyError](err); ok {
		return err
	}
	if code, _ := pgCode(err); code == "55P03" { // lock_not_available: lock_timeout ran out
		return &busyError{err}
	}
	if unavailable(err) {
		return &unavailableError{err}
	}
	return err
}

// unavailable reports whether err means the database cannot serve right
// now, judged by the driver's types and the server's SQLSTATE, never by
// message text. pgx v5 reports:
//
//   - a failed connection attempt (refused, no socket, timeout, a server
//     that is starting up or shutting down, too many connections, a host
//     that is not read-write under target_session_attrs) as a
//     *pgconn.ConnectError;
//   - a socket that fails under a statement (reset, broken pipe, deadline)
//     as a net.Error, or io.EOF / io.ErrUnexpectedEOF when the server just
//     closed it (an immediate shutdown or a crash);
//   - any later use of a connection it closed after such a failure as
//     pgconn.ErrConnClosed ("conn closed");
//   - a context deadline (waiting for a pool connection, or for an answer)
//     as context.DeadlineExceeded, possibly inside a pgconn timeout error;
//   - what the server says as a *pgconn.PgError with its SQLSTATE.
//
// "conn busy" (two goroutines on one connection) is deliberately not here:
// pgx calls it safe to retry, but it is a bug.
func unavailable(err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true // no connection at all, whatever the server said while refusing it
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableCode(pgErr.Code)
	}
	var netErr net.Error
	return errors.Is(err, pgconn.ErrConnClosed) ||
		errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)
}

// unavailableCode reports whether a SQLSTATE means the server cannot serve
// the statement now, though it might in a moment or on another host.
func unavailableCode(code string) bool {
	switch code {
	case "57P01", // admin_shutdown: the session was cut by a shutdown or pg_terminate_backend
		"57P02", // crash_shutdown: another backend crashed, the server restarts
		"57P03", // cannot_connect_now: starting up, shutting down, in recovery
		"25006", // read_only_sql_transaction: a standby, e.g. the old primary after a failover
		"53000", // insufficient_resources
		"53100", // disk_full
		"53200", // out_of_memory
		"53300": // too_many_connections
		return true
	}
	return strings.HasPrefix(code, "08") // connection_exception and its subclasses
}

// unavailableError keeps the driver's error for logs while matching
// registry.ErrUnavailable.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "database unavailable: " + e.err.Error() }
func (e *unavailableError) Is(target error) bool {
	return target == registry.ErrUnavailable
}
func (e *unavailableError) Unwrap() error { return e.err }

// busyError is a lock wait that lock_timeout ended: it keeps the driver's
// error for logs while matching registry.ErrBusy (and, being a moment's
// unavailability, registry.ErrUnavailable).
type busyError struct{ err error }

func (e *busyError) Error() string { return "waited too long for a lock: " + e.err.Error() }
func (e *busyError) Is(target error) bool {
	return target == registry.ErrBusy || target == registry.ErrUnavailable
}
func (e *busyError) Unwrap() error { return e.err }

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

// collectRows runs a query and collects its rows with scan; the query's
// own error is returned as well as the rows'.
func collectRows[T any](ctx context.Context, db querier, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// collectOne runs a query that returns one row and collects it with scan;
// no row is pgx.ErrNoRows, more than one pgx.ErrTooManyRows.
func collectOne[T any](ctx context.Context, db querier, scan pgx.RowToFunc[T], sql string, args ...any) (T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectExactlyOneRow(rows, scan)
}
