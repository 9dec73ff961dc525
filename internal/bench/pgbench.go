package bench

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/pglocal"
)

//go:embed scripts/*.sql
var scripts embed.FS

// Pgbench is what pgbench measured for a workload's SQL.
type Pgbench struct {
	Clients   int     `json:"clients"`
	TPS       float64 `json:"tps"`
	LatencyMS float64 `json:"latency_avg_ms"`
	// P50MS and P99MS are percentiles of the transactions' latencies,
	// from pgbench's per-transaction log; zero when it wrote none.
	P50MS     float64 `json:"p50_ms,omitempty"`
	P99MS     float64 `json:"p99_ms,omitempty"`
	Processed int64   `json:"transactions"`
	Failed    int64   `json:"failed"`
	// Whole is, for a script that claims gangs, how many of its
	// transactions claimed one whole (the others found a host taken and
	// claimed nothing), and WholeTPS their rate: what the ratio compares.
	Whole    int64   `json:"whole_transactions,omitempty"`
	WholeTPS float64 `json:"whole_tps,omitempty"`
	Script   string  `json:"script"`
	Error    string  `json:"error,omitempty"`
}

// ErrNoPgbench means no pgbench binary was found.
var ErrNoPgbench = errors.New("bench: pgbench not found")

// FindPgbench looks for pgbench where the PostgreSQL server binaries are
// (PG_BINDIR, pg_config --bindir, /usr/lib/postgresql/*/bin), then on
// PATH.
func FindPgbench() (string, error) {
	if dir, err := pglocal.FindBinDir(); err == nil {
		if p := filepath.Join(dir, "pgbench"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	return "", ErrNoPgbench
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// pgbenchTables makes the tables the scripts write: a two-column liveness
// table for heartbeats, and copies of nodes, node_changes and audit_log
// (with their indexes) for claims, so that pgbench's writes touch nothing
// the server reads. dropPgbenchTables removes them.
func pgbenchTables(ctx context.Context, pool *pgxpool.Pool, withCopies bool) error {
	stmts := []string{
		`DROP TABLE IF EXISTS bench_liveness`,
		`CREATE TABLE bench_liveness (node_pk bigint PRIMARY KEY, last_seen timestamptz)`,
		`INSERT INTO bench_liveness SELECT pk, now() FROM nodes`,
		`ANALYZE bench_liveness`,
	}
	if withCopies {
		// The rows first, then the indexes nodes has, built in bulk: much
		// faster than maintaining them row by row at a million nodes.
		rows, _ := pool.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'nodes' AND schemaname = current_schema()`)
		defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("bench: pgbench tables: %w", err)
		}
		stmts = append(stmts,
			`DROP TABLE IF EXISTS bench_nodes, bench_node_changes, bench_audit_log, bench_jobs`,
			`CREATE TABLE bench_nodes (LIKE nodes INCLUDING ALL EXCLUDING INDEXES)`,
			`INSERT INTO bench_nodes OVERRIDING SYSTEM VALUE SELECT * FROM nodes`,
		)
		for _, d := range defs {
			stmts = append(stmts, copyIndex(d))
		}
		stmts = append(stmts,
			`CREATE TABLE bench_node_changes (LIKE node_changes INCLUDING ALL)`,
			`CREATE TABLE bench_audit_log (LIKE audit_log INCLUDING ALL)`,
			// renew.sql's jobs: as many as the renew workload's, holding
			// as many leased nodes each (the fleet's last free ones).
			`CREATE TABLE bench_jobs (LIKE jobs INCLUDING ALL)`,
			fmt.Sprintf(`INSERT INTO bench_jobs (job, owner) SELECT 4000000000 + g, 'bench-scheduler' FROM generate_series(1, %d) g`, renewJobs),
			fmt.Sprintf(`UPDATE bench_nodes SET current_job = 4000000001 + pk %% %d, lease_expires_at = now() + interval '1 day'
				WHERE pk IN (SELECT pk FROM bench_nodes WHERE current_job IS NULL AND schedulable ORDER BY pk DESC LIMIT %d)`, renewJobs, renewJobs*renewJobNodes),
			`ANALYZE bench_nodes`,
		)
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("bench: pgbench tables: %s: %w", s, err)
		}
	}
	return nil
}

var indexDefRE = regexp.MustCompile(`^(CREATE (?:UNIQUE )?INDEX )(\S+)( ON (?:ONLY )?)(?:\S+\.)?nodes( USING .*)$`)

// copyIndex turns the definition of an index of nodes into the same index
// of bench_nodes.
func copyIndex(def string) string {
	return indexDefRE.ReplaceAllString(def, "${1}bench_${2}${3}bench_nodes${4}")
}

func dropPgbenchTables(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS bench_liveness, bench_nodes, bench_node_changes, bench_audit_log, bench_jobs`)
	return err
}

// runPgbench runs script (a file of scripts/) with pgbench -n -M prepared
// at clients for d against dbURL, the fleet's bounds as variables. A
// pgbench that fails, or whose clients abort or whose transactions fail,
// is an error naming its output.
func runPgbench(ctx context.Context, bin, dir, dbURL, script string, clients int, d time.Duration, f *fleet) (Pgbench, error) {
	p := Pgbench{Clients: clients, Script: script}
	src, err := scripts.ReadFile("scripts/" + script)
	if err != nil {
		return p, err
	}
	path := filepath.Join(dir, script)
	if err := os.WriteFile(path, src, 0o644); err != nil {
		return p, err
	}
	secs := max(1, int(math.Round(d.Seconds())))
	p, err = pgbenchOnce(ctx, bin, dir, dbURL, script, path, clients, secs, f)
	if err != nil && p.Processed == 0 && strings.Contains(err.Error(), "no tps line") {
		// Nothing processed at all: on a loaded machine the clients may
		// take the whole of a short run to connect. Once more, longer.
		p, err = pgbenchOnce(ctx, bin, dir, dbURL, script, path, clients, 2*secs+1, f)
	}
	return p, err
}

// pgbenchOnce runs the script written at path for secs seconds.
func pgbenchOnce(ctx context.Context, bin, dir, dbURL, script, path string, clients, secs int, f *fleet) (Pgbench, error) {
	threads := max(1, min(clients, numCPU()))
	logPrefix := filepath.Join(dir, "pgbench-log-"+strings.TrimSuffix(script, ".sql"))
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(secs), "-f", path, "-l", "--log-prefix", logPrefix,
		"-D", "minpk=" + strconv.FormatInt(f.minPK, 10), "-D", "maxpk=" + strconv.FormatInt(f.maxPK, 10),
		dbURL}
	// A run that hangs (a lock, a server gone) must not hold the harness:
	// pgbench gets its duration and a minute more.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	out := stdout.String()
	parsed, parseErr := parsePgbench(out)
	parsed.Clients, parsed.Script = clients, script
	parsed.P50MS, parsed.P99MS = pgbenchPercentiles(logPrefix)
	switch {
	case runErr != nil:
		return parsed, fmt.Errorf("bench: pgbench %s: %v\n%s%s", script, runErr, tail(stderr.String(), 10), tail(out, 10))
	case parseErr != nil:
		return parsed, fmt.Errorf("bench: pgbench %s: %w\n%s", script, parseErr, tail(out, 10))
	case parsed.Failed > 0:
		return parsed, fmt.Errorf("bench: pgbench %s: %d failed transactions\n%s", script, parsed.Failed, tail(stderr.String(), 10))
	case strings.Contains(stderr.String(), "aborted"):
		return parsed, fmt.Errorf("bench: pgbench %s: clients aborted\n%s", script, tail(stderr.String(), 10))
	}
	return parsed, nil
}

var (
	tpsRE       = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	latencyRE   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	processedRE = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	failedRE    = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// parsePgbench reads pgbench's summary: tps (the first figure, which
// PostgreSQL 15 reports without the initial connection time), average
// latency, transactions processed and failed.
func parsePgbench(out string) (Pgbench, error) {
	var p Pgbench
	m := tpsRE.FindStringSubmatch(out)
	if m == nil {
		return p, errors.New("no tps line in pgbench's output")
	}
	p.TPS, _ = strconv.ParseFloat(m[1], 64)
	if m := latencyRE.FindStringSubmatch(out); m != nil {
		p.LatencyMS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := processedRE.FindStringSubmatch(out); m != nil {
		p.Processed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := failedRE.FindStringSubmatch(out); m != nil {
		p.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if p.TPS == 0 || p.Processed == 0 {
		return p, errors.New("pgbench processed no transactions")
	}
	return p, nil
}

// pgbenchPercentiles reads the per-transaction logs pgbench -l wrote with
// prefix (one file per thread) and removes them, answering the median and
// the 99th percentile of the latencies (the third field, in µs) in ms;
// zeros when there are none.
func pgbenchPercentiles(prefix string) (p50, p99 float64) {
	files, _ := filepath.Glob(prefix + ".*")
	var us []int64
	for _, f := range files {
		b, err := os.ReadFile(f)
		_ = os.Remove(f)
		if err != nil {
			continue
		}
		us = append(us, pgbenchLatencies(string(b))...)
	}
	if len(us) == 0 {
		return 0, 0
	}
	slices.Sort(us)
	at := func(q float64) float64 { return float64(us[min(len(us)-1, int(q*float64(len(us))))]) / 1000 }
	return at(0.50), at(0.99)
}

// pgbenchLatencies are the latencies (µs) of a pgbench -l log: lines of
// "client transaction latency script epoch µs"; lines that do not parse
// (a skipped transaction's "skipped") are left out.
func pgbenchLatencies(log string) []int64 {
	var us []int64
	for line := range strings.Lines(log) {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		if v, err := strconv.ParseInt(fields[2], 10, 64); err == nil && v >= 0 {
			us = append(us, v)
		}
	}
	return us
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	t := strings.Join(lines[max(0, len(lines)-n):], "\n")
	if t != "" {
		t += "\n"
	}
	return t
}

// pgbenchClaimed counts the nodes the pgbench scripts' claims recorded
// (bench_node_changes, kind claimed: a row's width is its nodes).
func pgbenchClaimed(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(width), 0) FROM bench_node_changes WHERE kind = 'claimed'`).Scan(&n)
	return n, err
}
