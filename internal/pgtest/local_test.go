package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func count(t *testing.T, url, table string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A local cluster keeps committed rows across an immediate shutdown (a
// crash of the server process) and comes back on the same URL.
func TestLocalSurvivesImmediateStop(t *testing.T) {
	t.Parallel()
	l := NewLocal(t, nil)
	url := l.URL()
	l.Exec(`INSERT INTO hardware_generations (name) VALUES ('H100')`)
	l.Stop("immediate")
	l.Start()
	if l.URL() != url {
		t.Errorf("URL moved across a restart: %s → %s", url, l.URL())
	}
	if n := count(t, l.URL(), "hardware_generations"); n != 1 {
		t.Errorf("%d rows after an immediate stop, want 1", n)
	}
}

// The standby of a pair has what the primary committed; promoted, it takes
// writes; a multi-host URL with target_session_attrs=read-write finds it.
func TestPairFailover(t *testing.T) {
	t.Parallel()
	primary, standby := NewPair(t, true)
	multi := MultiHostURL(primary, standby)
	primary.Exec(`INSERT INTO hardware_generations (name) VALUES ('H100')`)
	// Synchronous: acknowledged means on the standby too.
	if n := count(t, standby.URL(), "hardware_generations"); n != 1 {
		t.Errorf("standby has %d rows, want 1", n)
	}
	primary.Stop("fast")
	standby.Promote()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, multi)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO hardware_generations (name) VALUES ('B200')`); err != nil {
		t.Fatal(err)
	}
	if n := count(t, standby.URL(), "hardware_generations"); n != 2 {
		t.Errorf("promoted standby has %d rows, want 2", n)
	}
}

// A cluster directory left by a test process that died (a go test timeout
// skips every Cleanup) is removed by the next run; one whose process lives
// is left alone.
