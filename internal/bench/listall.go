package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listAllClients is the listall workload's concurrency, whatever -clients
// says: it measures one consumer streaming the whole fleet (a cache
// filling itself, an inventory export), not many at once.
const listAllClients = 1

// listAllTimeout bounds one full list: a million nodes is hundreds of MB.
const listAllTimeout = 10 * time.Minute

// ListStats is what the listall workload measured beyond the rate of full
// lists and their times (the result's p50/p99).
type ListStats struct {
	Nodes int64 `json:"nodes_per_list"`
	Bytes int64 `json:"bytes_per_list"`
	// MBPerS and NodesPerS are one list's bytes (10^6 to the MB) and
	// nodes over the median time of a full list.
	MBPerS    float64 `json:"mb_per_s"`
	NodesPerS float64 `json:"nodes_per_s"`
	// PgxReadMS is the median time PostgreSQL took to hand the same rows
	// to the harness through pgx (rows read and discarded) over PgxReads
	// reads; 0 when not measured.
	PgxReadMS float64 `json:"pgx_read_ms,omitempty"`
	PgxReads  int     `json:"pgx_reads,omitempty"`
	PgxError  string  `json:"pgx_error,omitempty"`
}

// listAllOp streams POST /v1/nodes/list {} and checks that it is one JSON
// array of exactly want nodes in ascending pk order, counting them as they
// come (never holding the body). The size of the last good list goes to
// bytes.
func (t *target) listAllOp(want int64, bytes *atomic.Int64) op {
	return func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
		long := *c // the same connection, a longer bound than one request's
		long.Timeout = listAllTimeout
		resp, err := send(ctx, &long, "POST", t.url+"/v1/nodes/list", t.fleet.scheduler, []byte(`{}`))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		cr := &countingReader{r: resp.Body}
		if _, err := countList(cr, want); err != nil {
			return fmt.Errorf("POST /v1/nodes/list: %w", err)
		}
		bytes.Store(cr.n)
		return nil
	}
}

// errShortList is a list that is not the whole fleet.
var errShortList = errors.New("list of the whole fleet has the wrong number of nodes")

// countList reads one JSON array of node objects from r token by token
// (jsontext: a validating streaming tokenizer, several times faster than
// encoding/json's Decoder, whose speed would otherwise cap what the
// harness can measure on a small machine) and returns how many nodes it
// held, never holding more than a token. Each node must be an object with
// a pk above the one before it; the array must be closed and nothing but
// white space may follow it; and it must hold want nodes (else an error
// wrapping errShortList). A stream cut short, as a server that fails
// mid-list leaves it, is an error.
func countList(r io.Reader, want int64) (int64, error) {
	dec := jsontext.NewDecoder(r)
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '[' {
		return 0, fmt.Errorf("not a JSON array (first token %v, %v)", tok, err)
	}
	var n, last int64
	for dec.PeekKind() != ']' {
		pk, err := readNode(dec)
		if err != nil {
			return n, fmt.Errorf("node %d: %w", n+1, err)
		}
		if pk <= last {
			return n, fmt.Errorf("node %d: pk %s, want one above %d", n+1, pkString(pk), last)
		}
		last = pk
		n++
	}
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != ']' {
		return n, fmt.Errorf("the array is not closed after %d nodes (%v, %v)", n, tok, err)
	}
	if tok, err := dec.ReadToken(); err != io.EOF {
		return n, fmt.Errorf("more after the array: %v, %v", tok, err)
	}
	if n != want {
		return n, fmt.Errorf("%w: %d nodes, want %d", errShortList, n, want)
	}
	return n, nil
}

// readNode reads one object and returns its pk (0 when it has none),
// skipping every other member.
func readNode(dec *jsontext.Decoder) (int64, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return 0, err
	}
	if tok.Kind() != '{' {
		return 0, fmt.Errorf("%v, want an object", tok)
	}
	var pk int64
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return 0, err
		}
		if name.String() != "pk" {
			if err := dec.SkipValue(); err != nil {
				return 0, err
			}
			continue
		}
		v, err := dec.ReadToken()
		if err != nil {
			return 0, err
		}
		if v.Kind() != '0' {
			return 0, fmt.Errorf("pk %v, want a number", v)
		}
		pk = v.Int()
	}
	if _, err := dec.ReadToken(); err != nil { // the '}'
		return 0, err
	}
	return pk, nil
}

func pkString(pk int64) string {
	if pk == 0 {
		return "missing"
	}
	return fmt.Sprint(pk)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// pgxFullReads reads every node as scripts/listall.sql selects them
// through one connection of pool, discarding the rows: once to warm up,
// then again until d has passed (at least once). It returns the median
// time of the measured reads and their count; a read of other than want
// rows is an error.
func pgxFullReads(ctx context.Context, pool *pgxpool.Pool, want int64, d time.Duration) (time.Duration, int, error) {
	sql, err := scripts.ReadFile("scripts/listall.sql")
	if err != nil {
		return 0, 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: listall: pgx: %w", err)
	}
	defer conn.Release()
	read := func() (time.Duration, error) {
		t0 := time.Now()
		rows, err := conn.Query(ctx, string(sql))
		if err != nil {
			return 0, err
		}
		var n int64
		for rows.Next() {
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if n != want {
			return 0, fmt.Errorf("%w: %d rows, want %d", errShortList, n, want)
		}
		return time.Since(t0), nil
	}
	if _, err := read(); err != nil {
		return 0, 0, fmt.Errorf("bench: listall: pgx: %w", err)
	}
	var times []time.Duration
	end := time.Now().Add(d)
	for len(times) == 0 || time.Now().Before(end) {
		dt, err := read()
		if err != nil {
			return 0, len(times), fmt.Errorf("bench: listall: pgx: %w", err)
		}
		times = append(times, dt)
	}
	slices.Sort(times)
	return percentile(times, 0.5), len(times), nil
}
