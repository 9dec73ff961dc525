package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// TestTranslate runs translate over errors that pgx really returns in each
// kind of database trouble, made by doing that trouble to a connection: a
// refused or missing server, a server that refuses the session at start-up
// or cuts it at the first statement with a given SQLSTATE, a connection
// reset under a running statement, a terminated backend, a read-only
// transaction, a pool with no free connection, a deadline. Every outage
// must match registry.ErrUnavailable (a 503 upstream); a client that gave up
// must stay context.Canceled; bugs must stay what they are (500s).
func TestTranslate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.New(t)

	connect := func(t *testing.T, url string) *pgx.Conn {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	// connectErr is what a failed connection attempt returns.
	connectErr := func(url string) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Close(ctx)
			return errors.New("connected, unexpectedly")
		}
		return err
	}
	// terminate has the session's backend ended as an administrator (or a
	// fast shutdown) ends it; the session learns it from its statement.
	terminate := func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		return err
	}

	for _, tc := range []struct {
		name        string
		err         func(t *testing.T) error
		unavailable bool
		canceled    bool
	}{
		// Outages.
		{"connection refused", func(t *testing.T) error {
			return connectErr("postgres://postgres@" + closedPort(t) + "/x?sslmode=disable&connect_timeout=5")
		}, true, false},
		{"no socket (server stopped)", func(t *testing.T) error {
			return connectErr("postgres://postgres@/x?host=" + url.QueryEscape(t.TempDir()) + "&port=5432")
		}, true, false},
		{"reset while connecting", func(t *testing.T) error {
			return connectErr("postgres://postgres@" + resetServer(t) + "/x?sslmode=disable&connect_timeout=5")
		}, true, false},
		{"57P03 starting up, at connect", func(t *testing.T) error {
			return connectErr(fakeServer(t, true, "57P03"))
		}, true, false},
		{"53300 too many connections, at connect", func(t *testing.T) error {
			return connectErr(fakeServer(t, true, "53300"))
		}, true, false},
		{"read-only server under target_session_attrs=read-write", func(t *testing.T) error {
			return connectErr(fakeServer(t, true, "read-only"))
		}, true, false},
		{"57P01 admin shutdown", func(t *testing.T) error {
			return terminate(connect(t, dbURL))
		}, true, false},
		{"conn closed (the next statement after the session died)", func(t *testing.T) error {
			conn := connect(t, dbURL)
			_ = terminate(conn)
			_, err := conn.Exec(ctx, `SELECT 1`)
			return err
		}, true, false},
		{"57P02 crash shutdown, mid-session", func(t *testing.T) error {
			_, err := connect(t, fakeServer(t, false, "57P02")).Exec(ctx, `SELECT 1`)
			return err
		}, true, false},
		{"57P03 cannot connect now, mid-session", func(t *testing.T) error {
			_, err := connect(t, fakeServer(t, false, "57P03")).Exec(ctx, `SELECT 1`)
			return err
		}, true, false},
		{"08006 connection failure, mid-session", func(t *testing.T) error {
			_, err := connect(t, fakeServer(t, false, "08006")).Exec(ctx, `SELECT 1`)
			return err
		}, true, false},
		// pgx reports a connection that died under a statement in several
		// ways, depending on the statement's form: each one here is what
		// it really returned for that form.
		{"server closes mid-session, statement without arguments (conn closed)", func(t *testing.T) error {
			_, err := connect(t, fakeServer(t, false, "close")).Exec(ctx, `SELECT 1`)
			return err
		}, true, false},
		{"server closes mid-session, statement with arguments (EOF)", func(t *testing.T) error {
			_, err := connect(t, fakeServer(t, false, "close")).Exec(ctx, `SELECT $1::int`, 1)
			return err
		}, true, false},
		{"connection reset under a statement without arguments (conn closed)", func(t *testing.T) error {
			proxy, cut := cutter(t, dbURL)
			conn := connect(t, proxy)
			time.AfterFunc(100*time.Millisecond, cut)
			_, err := conn.Exec(ctx, `SELECT pg_sleep(10)`)
			return err
		}, true, false},
		{"connection reset under a statement with arguments (net.OpError)", func(t *testing.T) error {
			proxy, cut := cutter(t, dbURL)
			conn := connect(t, proxy)
			time.AfterFunc(100*time.Millisecond, cut)
			_, err := conn.Exec(ctx, `SELECT pg_sleep($1)`, 10)
			return err
		}, true, false},
		{"connection reset before commit (write failed)", func(t *testing.T) error {
			proxy, cut := cutter(t, dbURL)
			tx, err := connect(t, proxy).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cut()
			return tx.Commit(ctx)
		}, true, false},
		{"25006 read-only transaction", func(t *testing.T) error {
			conn := connect(t, dbURL)
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, `CREATE TABLE t (x int)`)
			return err
		}, true, false},
		{"pool acquire timeout", func(t *testing.T) error {
			pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=1")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			held, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err = pool.Exec(waitCtx, `SELECT 1`)
			return err
		}, true, false},
		{"deadline under a statement", func(t *testing.T) error {
			waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := connect(t, dbURL).Exec(waitCtx, `SELECT pg_sleep(10)`)
			return err
		}, true, false},

		// A client that went away.
		{"canceled under a statement", func(t *testing.T) error {
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err := connect(t, dbURL).Exec(cctx, `SELECT pg_sleep(10)`)
			return err
		}, false, true},
		{"statement on a context already canceled (pgx: a timeout error)", func(t *testing.T) error {
			conn := connect(t, dbURL)
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err := conn.Exec(cctx, `SELECT 1`)
			return err
		}, false, true},
		{"canceled while waiting for a connection", func(t *testing.T) error {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			pool, err := pgxpool.New(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			_, err = pool.Exec(cctx, `SELECT 1`)
			return err
		}, false, true},

		// Bugs.
		{"syntax error", func(t *testing.T) error {
			_, err := connect(t, dbURL).Exec(ctx, `SELEC 1`)
			return err
		}, false, false},
		{"undefined column", func(t *testing.T) error {
			_, err := connect(t, dbURL).Exec(ctx, `SELECT nope FROM nodes`)
			return err
		}, false, false},
		{"scan into the wrong type", func(t *testing.T) error {
			var b bool
			return connect(t, dbURL).QueryRow(ctx, `SELECT 'x'::text`).Scan(&b)
		}, false, false},
		{"no rows", func(t *testing.T) error {
			var n int
			return connect(t, dbURL).QueryRow(ctx, `SELECT 1 WHERE false`).Scan(&n)
		}, false, false},
		{"conn busy (two uses of one connection)", func(t *testing.T) error {
			conn := connect(t, dbURL)
			rows, err := conn.Query(ctx, `SELECT generate_series(1, 10)`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			_, err = conn.Exec(ctx, `SELECT 1`)
			return err
		}, false, false},
		{"transaction used after commit", func(t *testing.T) error {
			tx, err := connect(t, dbURL).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `SELECT 1`)
			return err
		}, false, false},
		{"plain error", func(t *testing.T) error { return errors.New("boom") }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.err(t)
			if raw == nil {
				t.Fatal("no error happened")
			}
			t.Logf("pgx: %v", raw)
			got := store.Translate(fmt.Errorf("store: op: %w", raw))
			if is := errors.Is(got, registry.ErrUnavailable); is != tc.unavailable {
				t.Errorf("translate(%v) matches ErrUnavailable: %v, want %v", raw, is, tc.unavailable)
			}
			if is := errors.Is(got, context.Canceled); is != tc.canceled {
				t.Errorf("translate(%v) matches context.Canceled: %v, want %v", raw, is, tc.canceled)
			}
			// Translating twice (inner and outer layers both do) wraps once.
			if again := store.Translate(got); strings.Count(again.Error(), "database unavailable") > 1 {
				t.Errorf("translated twice: %v", again)
			}
		})
	}
}

// closedPort is a local TCP address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// serve accepts connections on a local port and hands each to handle
// until the test ends.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				handle(conn)
			})
		}
	})
	return ln.Addr().String()
}

// reset closes conn with a TCP reset instead of an orderly close.
func reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

// resetServer accepts and resets every connection.
func resetServer(t *testing.T) string {
	return serve(t, func(conn net.Conn) {
		_, _ = io.ReadFull(conn, make([]byte, 8)) // the start of the startup message
		reset(conn)
	})
}

// fakeServer speaks just enough of the protocol to fail as a real server
// does. With atStartup it refuses the session with a FATAL of the given
// SQLSTATE (or, for "read-only", accepts it and says
// transaction_read_only is on, as a standby does, so that
// target_session_attrs=read-write refuses it); otherwise it accepts the session and answers the first
// statement with that FATAL (or, for "close", just closes).
func fakeServer(t *testing.T, atStartup bool, code string) string {
	t.Helper()
	addr := serve(t, func(conn net.Conn) {
		be := pgproto3.NewBackend(conn, conn)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		fatal := &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: "fake failure " + code}
		if atStartup && code != "read-only" {
			be.Send(fatal)
			_ = be.Flush()
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
		be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if err := be.Flush(); err != nil {
			return
		}
		if _, err := be.Receive(); err != nil || code == "close" {
			return
		}
		if code == "read-only" { // the answer to SHOW transaction_read_only
			be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("transaction_read_only"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}})
			be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte("on")}})
			be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SHOW")})
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			_ = be.Flush()
			_, _ = be.Receive() // Terminate
			return
		}
		be.Send(fatal)
		_ = be.Flush()
	})
	u := "postgres://postgres@" + addr + "/x?sslmode=disable&connect_timeout=5"
	if code == "read-only" {
		u += "&target_session_attrs=read-write"
	}
	return u
}

// cutter is a TCP proxy to the database at dbURL; cut resets every
// connection through it, as a dying server or network does.
func cutter(t *testing.T, dbURL string) (proxyURL string, cut func()) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	network, target := pgconn.NetworkAddress(cfg.Host, cfg.Port)
	var mu sync.Mutex
	var clients []net.Conn
	addr := serve(t, func(client net.Conn) {
		_ = client.SetDeadline(time.Time{})
		server, err := net.Dial(network, target)
		if err != nil {
			return
		}
		defer server.Close()
		mu.Lock()
		clients = append(clients, client)
		mu.Unlock()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
		go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
		<-done
	})
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, cfg.Password), Host: addr,
		Path: "/" + cfg.Database, RawQuery: "sslmode=disable&connect_timeout=5"}
	return u.String(), func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range clients {
			reset(c)
		}
	}
}
