// Package bench is registryd's HTTP benchmark harness (make bench-http):
// it starts `registryd serve` on the embedded PostgreSQL (or targets a
// running registryd and its database), seeds a fleet through SQL, drives
// each hot path with its own load generator at a fixed concurrency for a
// fixed time, runs pgbench with the same SQL at the same client count,
// and reports both sides, their ratio and the machine they ran on.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config is one run of the harness.
type Config struct {
	Nodes     int           // the fleet's size, 8 per host
	Agents    int           // hosts owned by an agent each (heartbeats); default 1000
	Duration  time.Duration // per workload, per side
	Clients   int           // concurrency of every workload but gang (16)
	Workloads []string      // default AllWorkloads
	JSONOnly  bool          // only the JSON lines, no table
	// Seed is how the fleet gets in: SeedSQL (default), SeedAPI or
	// SeedSync.
	Seed string
	// Settle runs the workloads twice: right after the seed, then again
	// once PostgreSQL's autovacuum has vacuumed and analyzed the nodes
	// table since (at most SettleTimeout, default 15 min). Each result
	// names its phase.
	Settle        bool
	SettleTimeout time.Duration

	// Registryd is the registryd binary to start on the embedded
	// PostgreSQL; ServerEnv (NAME=VALUE) is added to its environment.
	Registryd string
	ServerEnv []string
	// StartTimeout bounds the server's start; default 2 min.
	StartTimeout time.Duration

	// URL, DatabaseURL and Secret target a running registryd instead:
	// its address, its database (seeded directly, read by pgbench) and
	// the HS256 secret it verifies tokens with (tokens are minted here).
	// Without the secret, Token (an admin token) is used for every
	// request, and heartbeats are an admin acting as the node rather
	// than its agent.
	URL, DatabaseURL string
	Secret           []byte
	Token            string
	// ReplicaURL is a second running replica on the same database, for
	// the replica workload against a running registryd (a started one
	// gets a second serve of the harness's own).
	ReplicaURL string

	// Pgbench is the pgbench binary; "" finds it (FindPgbench). When none
	// is found and RequirePgbench is false, the pgbench side is left out
	// with a note.
	Pgbench        string
	RequirePgbench bool

	// Client drives heartbeat, retrieve and free page: "wrk" (wrk,
	// required), "go" (the harness's own client), or "" for wrk when it
	// is installed (FindWrk) and the Go client otherwise. The table says
	// which did.
	Client string

	// WorkDir holds the server's data folder, log and the pgbench
	// scripts; "" is a temporary folder removed at the end.
	WorkDir string

	Stdout, Stderr io.Writer
}

// Result is one workload's line.
type Result struct {
	Workload string `json:"workload"`
	// Phase is "after seed" or "settled" in a run with Settle.
	Phase      string            `json:"phase,omitempty"`
	Path       string            `json:"path"`
	Client     string            `json:"client,omitempty"` // what sent the requests: wrk or go
	Nodes      int               `json:"nodes"`
	Clients    int               `json:"clients"`
	DurationS  float64           `json:"duration_s"`
	Ops        int64             `json:"ops"`
	Rate       float64           `json:"rate"`
	P50MS      float64           `json:"p50_ms"`
	P99MS      float64           `json:"p99_ms"`
	MaxMS      float64           `json:"max_ms"`
	Errors     int64             `json:"errors"`
	ErrorKinds map[string]int64  `json:"error_kinds,omitempty"`
	ErrorFirst map[string]string `json:"error_samples,omitempty"`
	Pgbench    *Pgbench          `json:"pgbench,omitempty"`
	Ratio      float64           `json:"ratio,omitempty"` // rate / pgbench tps
	// ServerPeakRSS is registryd's VmHWM during this workload (bytes);
	// PostgresPSS the embedded cluster's proportional set size right
	// after it. 0: not known (a server the harness did not start).
	ServerPeakRSS int64 `json:"server_peak_rss_bytes,omitempty"`
	PostgresPSS   int64 `json:"postgres_pss_bytes,omitempty"`
	// List is listall's throughput and PostgreSQL's own time for the same
	// rows (Ratio is then that time over registryd's median list time);
	// Start is startup's times.
	List  *ListStats  `json:"listall,omitempty"`
	Start *StartStats `json:"startup,omitempty"`
	// Claim is the claim requests alone of claim and gang, whose ops
	// are a claim and its release.
	Claim *ClaimStats `json:"claim_only,omitempty"`
	// Replica is the replica workload's writes, stale reads and its
	// max-stale phase.
	Replica *ReplicaStats `json:"replica,omitempty"`
	// Abandon is the abandon workload's comparison of the honest
	// schedulers alone and beside clients that abandon claims.
	Abandon *AbandonStats `json:"abandon,omitempty"`
	// Renew is the renew workload's count of watch events per renewal.
	Renew *RenewStats `json:"renew,omitempty"`
	// Fill is the fill workload's gangs and its claims' times as the
	// fleet filled.
	Fill *FillStats `json:"fill,omitempty"`
	// Kept is what a keep workload held at its end, and its releases.
	Kept *KeptStats `json:"kept,omitempty"`
}

// KeptStats is a keep workload's claims, all held until its end, and
// their releases then.
type KeptStats struct {
	Jobs         int     `json:"jobs"`
	Nodes        int     `json:"nodes"`
	ReleaseRate  float64 `json:"release_rate"`
	ReleaseP50MS float64 `json:"release_p50_ms"`
	ReleaseP99MS float64 `json:"release_p99_ms"`
}

// ClaimStats times the claim requests of a claim workload apart from
// their releases.
type ClaimStats struct {
	Claims int     `json:"claims"`
	Rate   float64 `json:"rate"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
}

// Report is a whole run.
type Report struct {
	Machine     Machine `json:"machine"`
	Nodes       int     `json:"nodes"`
	Hosts       int     `json:"hosts"`
	SeedSeconds float64 `json:"seed_seconds"`
	// SettleSeconds is how long autovacuum took to settle the nodes
	// table after the first phase of a run with Settle.
	SettleSeconds float64   `json:"settle_seconds,omitempty"`
	Seed          string    `json:"seed"`
	Started       time.Time `json:"started"`
	ServerPeakRSS int64     `json:"server_peak_rss_bytes,omitempty"`
	Notes         []string  `json:"notes,omitempty"`
	Results       []Result  `json:"-"`
}

// ErrWorkloadErrors means some workload had failed requests (or pgbench
// failed); the report shows which.
var ErrWorkloadErrors = errors.New("bench: some workloads had errors")

func (c *Config) defaults() error {
	if c.Nodes <= 0 {
		c.Nodes = 100_000
	}
	if c.Agents <= 0 {
		c.Agents = 1000
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Clients <= 0 {
		c.Clients = 32
	}
	if len(c.Workloads) == 0 {
		c.Workloads = AllWorkloads
		if c.URL != "" { // a server the harness did not start, it cannot restart
			c.Workloads = slices.DeleteFunc(slices.Clone(AllWorkloads), func(w string) bool {
				return w == Startup || w == Replica && c.ReplicaURL == ""
			})
		}
	}
	for _, w := range c.Workloads {
		if !slices.Contains(AllWorkloads, w) {
			return fmt.Errorf("bench: no workload %q (want some of %s)", w, strings.Join(AllWorkloads, ","))
		}
	}
	switch c.Seed {
	case "":
		c.Seed = SeedSQL
	case SeedSQL, SeedAPI:
	case SeedSync:
		if c.Registryd == "" {
			return fmt.Errorf("bench: seed %s runs registryd sync --once: it needs the registryd binary (-registryd)", SeedSync)
		}
		if c.URL != "" && c.DatabaseURL == "" {
			return fmt.Errorf("bench: seed %s against a running registryd needs its database's URL", SeedSync)
		}
	default:
		return fmt.Errorf("bench: seed %q: want %s, %s or %s", c.Seed, SeedSQL, SeedAPI, SeedSync)
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 15 * time.Minute
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	switch {
	case c.URL != "" && c.DatabaseURL == "":
		return errors.New("bench: a running registryd (URL) needs its database's URL (REGISTRY_DATABASE_URL)")
	case c.URL != "" && len(c.Secret) == 0 && c.Token == "":
		return errors.New("bench: a running registryd (URL) needs its token secret (REGISTRY_JWT_SECRET) or an admin token (REGISTRY_TOKEN)")
	case c.URL == "" && c.Registryd == "":
		return errors.New("bench: no registryd binary to start, and no URL of a running one")
	}
	if c.URL != "" && c.ReplicaURL == "" && slices.Contains(c.Workloads, Replica) {
		return errors.New("bench: the replica workload against a running registryd needs a second replica on its database (ReplicaURL)")
	}
	if c.URL != "" && slices.Contains(c.Workloads, Startup) {
		return errors.New("bench: the startup workload restarts the server, so it needs one the harness starts (no URL)")
	}
	return nil
}

// Run runs every workload of cfg and writes the JSON lines (and, unless
// JSONOnly, the table) to cfg.Stdout. It returns the report, and
// ErrWorkloadErrors (wrapped) when any workload had errors: they are
// reported, never averaged away.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	rep := &Report{Nodes: cfg.Nodes, Seed: cfg.Seed, Started: time.Now().UTC()}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Stderr, "bench: "+format+"\n", args...) }

	work := cfg.WorkDir
	if work == "" {
		dir, err := os.MkdirTemp("", "registryd-bench")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		work = dir
	}

	pgbench := cfg.Pgbench
	if pgbench == "" {
		p, err := FindPgbench()
		if err != nil && cfg.RequirePgbench {
			return nil, err
		}
		if err != nil {
			rep.Notes = append(rep.Notes, "pgbench not found: the pgbench side is left out")
			logf("pgbench not found: measuring registryd only")
		}
		pgbench = p
	} else if !isExecutable(pgbench) {
		return nil, fmt.Errorf("%w at %s", ErrNoPgbench, pgbench)
	}

	var wrk string
	switch cfg.Client {
	case "go":
	case "wrk":
		if wrk = FindWrk(); wrk == "" {
			return nil, errors.New("bench: -client wrk: wrk is not installed (apt-get install wrk)")
		}
	case "":
		if wrk = FindWrk(); wrk == "" {
			rep.Notes = append(rep.Notes, "wrk not found: heartbeat, retrieve and free page use the harness's Go client, which takes more of the cores than wrk")
		}
	default:
		return nil, fmt.Errorf("bench: client %q: want wrk or go", cfg.Client)
	}

	url, dbURL, secret := cfg.URL, cfg.DatabaseURL, cfg.Secret
	var srv *server
	if url == "" {
		secret = make([]byte, 32)
		rand.Read(secret)
		secret = []byte(hex.EncodeToString(secret))
		logf("starting %s serve on the embedded PostgreSQL", cfg.Registryd)
		var err error
		srv, err = startServer(ctx, cfg.Registryd, work, secret, cfg.StartTimeout, cfg.ServerEnv)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := srv.stop(); err != nil {
				logf("%v", err)
			}
		}()
		url, dbURL = srv.url, srv.dbURL
		logf("serving on %s (pid %d), log %s", url, srv.pid(), srv.stderr)
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database: %w", err)
	}
	defer func() { pool.Close() }() // the pool of the last start (see startup)
	rep.Machine = describeMachine(ctx, pool, pgbench)

	logf("seeding %d nodes through %s", cfg.Nodes, cfg.Seed)
	var f *fleet
	switch cfg.Seed {
	case SeedAPI:
		f, err = seedAPI(ctx, url, pool, secret, cfg.Nodes, cfg.Agents)
	case SeedSync:
		f, _, err = seedSync(ctx, cfg.Registryd, dbURL, pool, cfg.Nodes, work)
	default:
		f, err = seed(ctx, pool, cfg.Nodes, cfg.Agents)
	}
	if err != nil {
		return nil, err
	}
	seededAt := time.Now()
	if err := f.tokens(secret, cfg.Token); err != nil {
		return nil, err
	}
	if f.adminActsAsAgents {
		rep.Notes = append(rep.Notes, "no token secret: heartbeats are an admin acting as the node, not its agent")
	}
	rep.Hosts, rep.SeedSeconds = f.hosts, f.seeded.Seconds()
	logf("seeded %d nodes on %d hosts in %.1fs (%d agents)", f.nodes, f.hosts, rep.SeedSeconds, len(f.agents))

	if pgbench != "" && cfg.Seed == SeedSync {
		// Copying the tables reads every row of the import, which is
		// work the measurement right after it must find undone.
		rep.Notes = append(rep.Notes, "seed sync: the pgbench side is left out (its copies of the tables would read every imported row before the workloads)")
		pgbench = ""
	}
	if pgbench != "" {
		needCopies := slices.ContainsFunc(cfg.Workloads, func(w string) bool { return w == Claim || w == Gang || w == Fabric || w == Abandon || w == Renew })
		t0 := time.Now()
		if err := pgbenchTables(ctx, pool, needCopies); err != nil {
			return nil, err
		}
		logf("pgbench's tables made in %.1fs", time.Since(t0).Seconds())
		defer func() {
			if err := dropPgbenchTables(context.WithoutCancel(ctx), pool); err != nil {
				logf("%v", err)
			}
		}()
	}

	if srv != nil && cfg.Seed == SeedSQL {
		// A registry runs with its fleet in place: start again on the
		// seeded data, so the server finds the fleet as a long-running
		// one has it (its node cache listed from PostgreSQL), not as rows
		// that appeared behind its back.
		logf("restarting registryd on the seeded fleet")
		var logged int64
		if fi, err := os.Stat(srv.stderr); err == nil {
			logged = fi.Size()
		}
		if _, err := srv.restart(ctx); err != nil {
			return nil, fmt.Errorf("bench: restart after seeding: %w", err)
		}
		pool.Close()
		if pool, err = pgxpool.New(ctx, srv.dbURL); err != nil {
			return nil, fmt.Errorf("bench: database: %w", err)
		}
		url, dbURL = srv.url, srv.dbURL
		if !slices.Contains(cfg.ServerEnv, "REGISTRY_NODE_CACHE=0") {
			t0 := time.Now()
			if err := waitForLog(ctx, srv.stderr, logged, "node cache: preloaded", 5*time.Minute); err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			logf("node cache preloaded in %.1fs", time.Since(t0).Seconds())
		}
	}

	enc := json.NewEncoder(cfg.Stdout)
	if err := enc.Encode(rep); err != nil {
		return nil, err
	}
	t := &target{url: url, fleet: f, holds: newHoldings()}
	firstJob := 2_000_000_000 + time.Now().Unix()%1_000_000*1000
	t.jobs.Store(firstJob)
	failed := false
	steps := make([]step, 0, 2*len(cfg.Workloads))
	for _, name := range cfg.Workloads {
		steps = append(steps, step{name: name})
	}
	if cfg.Settle {
		for i := range steps {
			steps[i].phase = PhaseAfterSeed
			steps = append(steps, step{phase: PhaseSettled, name: steps[i].name})
		}
	}
	settling := cfg.Settle
	for _, st := range steps {
		name := st.name
		if st.phase == PhaseSettled && settling {
			settling = false
			logf("waiting until autovacuum has vacuumed and analyzed the nodes table since the seed (at most %s)", cfg.SettleTimeout)
			waited, err := waitSettled(ctx, pool, seededAt, cfg.SettleTimeout)
			if err != nil {
				return nil, err
			}
			rep.SettleSeconds = waited.Seconds()
			note := fmt.Sprintf("settled: autovacuum vacuumed and analyzed the nodes table %.0f s after the first phase ended (%.0f s after the seed)", waited.Seconds(), time.Since(seededAt).Seconds())
			rep.Notes = append(rep.Notes, note)
			logf("%s", note)
		}
		w, err := t.workload(name, cfg.Clients)
		if err != nil {
			return nil, err
		}
		res := Result{Workload: w.name, Phase: st.phase, Path: w.path, Nodes: cfg.Nodes, Clients: w.clients}
		if srv != nil {
			if err := resetPeakRSS(srv.pid()); err != nil {
				logf("cannot reset the server's peak RSS (%v): it is the peak since start", err)
			}
		}
		var l Load
		if name == Startup {
			logf("%s: %d restarts of registryd with %d nodes", name, startupRuns, cfg.Nodes)
			var restartErr error
			res.Start, l, restartErr = restarts(ctx, srv, startupRuns)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if restartErr != nil {
				// The server is down: nothing after this can run.
				logf("%s: %v", name, restartErr)
				rep.Results = append(rep.Results, res)
				_ = enc.Encode(res)
				return rep, fmt.Errorf("%w: %s: %w", ErrWorkloadErrors, name, restartErr)
			}
			// The connections of the pool went with the old PostgreSQL.
			pool.Close()
			if pool, err = pgxpool.New(ctx, srv.dbURL); err != nil {
				return nil, fmt.Errorf("bench: database: %w", err)
			}
			t.url, dbURL = srv.url, srv.dbURL
			logf("%s: serving again on %s (pid %d)", name, srv.url, srv.pid())
		} else if name == Abandon {
			res.Client = "go"
			logf("%s: %d schedulers claim and release, %s alone then %s beside %d clients abandoning claims", name, abandonHonest, cfg.Duration, cfg.Duration, abandonClients)
			l = runAbandon(ctx, t, pool, cfg.Duration, &res)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		} else if name == Fill {
			res.Client = "go"
			logf("%s: %d schedulers claim fabric gangs and keep them until none fits, then release them all", name, w.clients)
			l = runFill(ctx, t, pool, &res)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		} else if name == Renew {
			res.Client = "go"
			logf("%s: %d clients renew %d jobs of %d nodes, %s, an unfiltered watch counting events", name, w.clients, renewJobs, renewJobNodes, cfg.Duration)
			l = runRenew(ctx, t, w.clients, cfg.Duration, &res)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		} else if name == Replica {
			b := cfg.ReplicaURL
			var rs *server
			if srv != nil {
				logf("%s: starting replica B on the same database", name)
				var err error
				if rs, err = startReplica(ctx, srv, work, cfg.ServerEnv); err != nil {
					return nil, err
				}
				b = rs.url
			}
			res.Client = "go"
			logf("%s: %d writers on A (%s), %d readers on B (%s), %s consistent then %s max-stale", name, replicaWriters, t.url, w.clients, b, cfg.Duration, cfg.Duration)
			l = runReplica(ctx, t, b, w.clients, cfg.Duration, &res)
			if rs != nil {
				if err := rs.stop(); err != nil {
					logf("%v", err)
				}
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		} else {
			script, byWrk := t.wrkScript(name)
			if byWrk && wrk != "" {
				res.Client = "wrk"
				logf("%s: registryd through wrk, %d connections, %s", name, w.clients, cfg.Duration)
				var err error
				if l, err = runWrk(ctx, wrk, work, name, script, t.url, w.clients, warmup(cfg.Duration), cfg.Duration); err != nil {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					l = Load{ErrorKinds: map[string]int64{"wrk failed": 1}, ErrorSamples: map[string]string{"wrk failed": err.Error()}, Errors: 1}
				}
			} else {
				res.Client = "go"
				logf("%s: registryd, %d clients, %s", name, w.clients, cfg.Duration)
				wu := warmup(cfg.Duration)
				if name == Keep || name == Keep1 {
					// Every claim counts: the first ones are those that
					// meet the fleet as the seed left it.
					wu = 0
				}
				t.claims.reset(time.Now().Add(wu))
				l = generate(ctx, w.clients, wu, cfg.Duration, w.op)
				if n, p50, p99 := t.claims.stats(); n > 0 && (name == Claim || name == Gang || name == Fabric) && l.Elapsed > 0 {
					res.Claim = &ClaimStats{Claims: n, Rate: float64(n) / l.Elapsed.Seconds(), P50MS: ms(p50), P99MS: ms(p99)}
				}
				if name == Keep || name == Keep1 {
					size := gangSize
					if name == Keep1 {
						size = 1
					}
					var fs FillStats
					jobs := t.kept.take()
					releaseAll(ctx, t, jobs, size, true, &fs, func(kind string, err error) {
						if l.ErrorKinds[kind] == 0 {
							l.ErrorSamples[kind] = err.Error()
						}
						l.ErrorKinds[kind]++
						l.Errors++
					})
					res.Kept = &KeptStats{Jobs: len(jobs), Nodes: len(jobs) * size,
						ReleaseRate: fs.ReleaseRate, ReleaseP50MS: fs.ReleaseP50MS, ReleaseP99MS: fs.ReleaseP99MS}
				}
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
		res.DurationS, res.Ops, res.Rate, res.Errors = l.Elapsed.Seconds(), l.Ops, l.Rate, l.Errors
		res.P50MS, res.P99MS, res.MaxMS = ms(l.P50), ms(l.P99), ms(l.Max)
		if l.Errors > 0 {
			res.ErrorKinds, res.ErrorFirst = l.ErrorKinds, l.ErrorSamples
			failed = true
			logf("%s: %d errors: %v", name, l.Errors, l.ErrorKinds)
		}
		if name == Claim || name == Gang || name == Fabric || name == Fill || name == Keep || name == Keep1 { // every node a claim took is released again
			var held int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE current_job > $1`, firstJob).Scan(&held); err != nil {
				return nil, fmt.Errorf("bench: %s: %w", name, err)
			}
			if held > 0 {
				k := "held after the run"
				l.ErrorKinds[k] += held
				l.ErrorSamples[k] = fmt.Sprintf("%d nodes are still held by the harness's jobs after their releases", held)
				l.Errors += held
				res.Errors, res.ErrorKinds, res.ErrorFirst = l.Errors, l.ErrorKinds, l.ErrorSamples
				failed = true
			}
		}
		if l.Ops == 0 {
			failed = true
		}
		if srv != nil {
			res.ServerPeakRSS = peakRSS(srv.pid())
			rep.ServerPeakRSS = max(rep.ServerPeakRSS, res.ServerPeakRSS)
			res.PostgresPSS = pss(srv.postmasterPID())
		}
		if name == ListAll {
			res.List = &ListStats{Nodes: int64(cfg.Nodes), Bytes: t.listBytes.Load()}
			if l.P50 > 0 {
				res.List.MBPerS = float64(res.List.Bytes) / 1e6 / l.P50.Seconds()
				res.List.NodesPerS = float64(cfg.Nodes) / l.P50.Seconds()
			}
			logf("%s: PostgreSQL's own full read through pgx, %s", name, cfg.Duration)
			read, reads, err := pgxFullReads(ctx, pool, int64(cfg.Nodes), cfg.Duration)
			if err != nil {
				res.List.PgxError = err.Error()
				failed = true
				logf("%s: %v", name, err)
			} else {
				res.List.PgxReadMS, res.List.PgxReads = ms(read), reads
				if l.P50 > 0 {
					res.Ratio = read.Seconds() / l.P50.Seconds()
				}
			}
		}
		if pgbench != "" && w.script != "" {
			logf("%s: pgbench %s, %d clients, %s", name, w.script, w.clients, cfg.Duration)
			var claimedBefore int64
			if name == Fabric {
				claimedBefore, _ = pgbenchClaimed(ctx, pool)
			}
			p, err := runPgbench(ctx, pgbench, work, dbURL, w.script, w.clients, cfg.Duration, f)
			if err == nil && name == Fabric && p.Processed > 0 {
				// fabric.sql's claim and release are two transactions: one
				// whose host another client still holds claims nothing.
				var after int64
				if after, err = pgbenchClaimed(ctx, pool); err == nil {
					p.Whole = (after - claimedBefore) / (fabricHosts * gangSize)
					p.WholeTPS = p.TPS * float64(p.Whole) / float64(p.Processed)
				}
			}
			switch {
			case err != nil:
				p.Error = err.Error()
				failed = true
				logf("%s: %v", name, err)
			case p.WholeTPS > 0:
				res.Ratio = res.Rate / p.WholeTPS
			case p.TPS > 0:
				res.Ratio = res.Rate / p.TPS
			}
			res.Pgbench = &p
		}
		rep.Results = append(rep.Results, res)
		if err := enc.Encode(res); err != nil {
			return nil, err
		}
	}
	if n := t.holds.doubles.Load(); n > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("DOUBLE ASSIGNMENT: %d claims were given a node another job held", n))
	}
	if !cfg.JSONOnly {
		fmt.Fprint(cfg.Stdout, "\n"+Markdown(rep))
	}
	if failed {
		return rep, fmt.Errorf("%w: %s", ErrWorkloadErrors, failedWorkloads(rep))
	}
	return rep, nil
}

// Phases of a run with Settle.
const (
	PhaseAfterSeed = "after seed"
	PhaseSettled   = "settled"
)

// step is one workload of a run, in its phase.
type step struct{ phase, name string }

// waitSettled waits (at most timeout) until PostgreSQL has vacuumed and
// analyzed the nodes table, by autovacuum or by hand, both after since,
// and returns how long it waited.
func waitSettled(ctx context.Context, pool *pgxpool.Pool, since time.Time, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		var vacuumed, analyzed bool
		err := pool.QueryRow(ctx, `
			SELECT coalesce(greatest(last_vacuum, last_autovacuum) > $1, false),
			       coalesce(greatest(last_analyze, last_autoanalyze) > $1, false)
			FROM pg_stat_user_tables WHERE relname = 'nodes'`, since).Scan(&vacuumed, &analyzed)
		if err != nil {
			return 0, fmt.Errorf("bench: settle: %w", err)
		}
		if vacuumed && analyzed {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("bench: settle: the nodes table was not vacuumed (%t) and analyzed (%t) within %s of the seed", vacuumed, analyzed, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

func failedWorkloads(rep *Report) string {
	var names []string
	for _, r := range rep.Results {
		if r.Errors > 0 || r.Ops == 0 || (r.Pgbench != nil && r.Pgbench.Error != "") || (r.List != nil && r.List.PgxError != "") {
			names = append(names, r.Workload)
		}
	}
	return strings.Join(names, ", ")
}

// warmup is how long a workload runs unmeasured before its duration: a
// tenth of it, at most 2 s.
func warmup(d time.Duration) time.Duration { return min(d/10, 2*time.Second) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
