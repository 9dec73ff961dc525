package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// The seeded fleet: hosts of 8 GPUs at 10.x.y.1-250, four hardware
// generations in turn, 1 in 8 hosts wholly held by a job and 1 in 8 with
// 3 of its GPUs held (free GPUs fragmented across hosts), the first
// Agents hosts owned by an agent each (heartbeating, so with a liveness
// row).
var generations = []struct {
	name   string
	gpuMem int64
}{
	{"A100-40GB", 40 << 30},
	{"H100", 80 << 30},
	{"H200", 141 << 30},
	{"B200", 180 << 30},
}

// hostsPerFabric is how many consecutive hosts share a fabric (fab-0000,
// fab-0001, …): 250 fabrics of 500 hosts of 8 GPUs at 1,000,000 nodes.
// Each host is labelled team=t<host mod 10> and rack=r<host mod 40>.
const hostsPerFabric = 500

// seedJobBase is where the jobs of seeded busy hosts start; the workloads'
// jobs start far above it.
const seedJobBase = 1_000_000

// fleet is the seeded registry as the workloads need it.
type fleet struct {
	nodes, hosts int
	minPK, maxPK int64
	count        int64 // the nodes the registry holds
	// agents are the hosts owned by an agent each; none in a fleet
	// imported from a provider (SeedSync).
	agents    []agent
	scheduler string // a scheduler token
	admin     string // an admin token (the replica workload's writers)
	// adminActsAsAgents: heartbeats are sent with an admin token acting
	// as the node (no secret to mint agent tokens with).
	adminActsAsAgents bool
	seeded            time.Duration
}

type agent struct {
	sub, ip string
	token   string
	nodes   []int64
}

// seed fills an empty registry with n nodes through SQL (see checkEmpty).
func seed(ctx context.Context, pool *pgxpool.Pool, n, agents int) (*fleet, error) {
	start := time.Now()
	if err := checkEmpty(ctx, pool); err != nil {
		return nil, err
	}
	f := &fleet{nodes: n, hosts: (n + 7) / 8}
	agents = min(agents, f.hosts)
	names := make([]string, len(generations))
	mems := make([]int64, len(generations))
	for i, g := range generations {
		names[i], mems[i] = g.name, g.gpuMem
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One transaction: one commit to wait for, however many rows.
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO hardware_generations (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING`, names); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `SELECT pk FROM unnest($1::text[]) WITH ORDINALITY u(name, i) JOIN hardware_generations h USING (name) ORDER BY i`, names)
		hw, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version, hardware_generation, gpu_mem, owner, current_job,
				fabric, labels)
			SELECT '10.0.0.0'::inet + ((h / 250) * 256 + h % 250 + 1), g % 8, 2199023255552, '550.54.15',
				($2::bigint[])[h % 4 + 1], ($3::bigint[])[h % 4 + 1],
				CASE WHEN h < $4 THEN 'bench-agent-' || h END,
				CASE WHEN h % 8 = 7 OR (h % 8 = 5 AND g % 8 < 3) THEN $5 + h END,
				'fab-' || lpad((h / $6)::text, 4, '0'),
				jsonb_build_object('team', 't' || h % 10, 'rack', 'r' || h % 40)
			FROM generate_series(0, $1::bigint - 1) g, LATERAL (SELECT g / 8 AS h) x`, n, hw, mems, agents, seedJobBase, hostsPerFabric); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO node_liveness (node_pk, last_seen) SELECT pk, now() FROM nodes WHERE owner IS NOT NULL
			ON CONFLICT (node_pk) DO UPDATE SET last_seen = excluded.last_seen`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bench: seed %d nodes: %w", n, err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE nodes; ANALYZE node_liveness; ANALYZE hardware_generations`); err != nil {
		return nil, fmt.Errorf("bench: seed: analyze: %w", err)
	}
	seeded := time.Since(start)
	if f, err = fleetOf(ctx, pool, n); err != nil {
		return nil, err
	}
	f.seeded = seeded
	return f, nil
}

// checkEmpty refuses a registry that holds nodes already: the numbers
// depend on the fleet being the one described.
func checkEmpty(ctx context.Context, pool *pgxpool.Pool) error {
	var existing int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM nodes`).Scan(&existing); err != nil {
		return fmt.Errorf("bench: seed: %w", err)
	}
	if existing > 0 {
		return fmt.Errorf("bench: seed: the registry holds %d nodes already; the harness seeds an empty one", existing)
	}
	return nil
}

// fleetOf reads what the workloads need of a seeded fleet of n nodes:
// its pk range, its size and its agents (owners bench-agent-H, with their host's
// address and nodes).
func fleetOf(ctx context.Context, pool *pgxpool.Pool, n int) (*fleet, error) {
	f := &fleet{nodes: n, hosts: (n + 7) / 8}
	if err := pool.QueryRow(ctx, `SELECT coalesce(min(pk), 0), coalesce(max(pk), 0), count(*) FROM nodes`).Scan(&f.minPK, &f.maxPK, &f.count); err != nil {
		return nil, fmt.Errorf("bench: seed: %w", err)
	}
	rows, _ := pool.Query(ctx, `SELECT owner, host(min(ip)), array_agg(pk ORDER BY pk) FROM nodes WHERE owner LIKE 'bench-agent-%' GROUP BY owner ORDER BY owner`)
	var err error
	f.agents, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agent, error) {
		var a agent
		err := r.Scan(&a.sub, &a.ip, &a.nodes)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("bench: seed: agents: %w", err)
	}
	return f, nil
}

// tokens gives the fleet its tokens: minted with secret (a scheduler, and
// each agent bound to its host), or, without one, adminToken for
// everything, agents' heartbeats then being an admin acting as the node.
func (f *fleet) tokens(secret []byte, adminToken string) error {
	if len(secret) == 0 {
		if adminToken == "" {
			return fmt.Errorf("bench: neither a token secret nor an admin token")
		}
		f.scheduler, f.admin, f.adminActsAsAgents = adminToken, adminToken, true
		for i := range f.agents {
			f.agents[i].token = adminToken
		}
		return nil
	}
	signer := auth.Signer{Secret: secret}
	now := time.Now()
	const ttl = 12 * time.Hour
	tok, err := signer.Sign("bench-scheduler", registry.RoleScheduler, ttl, now)
	if err != nil {
		return fmt.Errorf("bench: token: %w", err)
	}
	f.scheduler = tok
	if f.admin, err = signer.Sign("bench-admin", registry.RoleAdmin, ttl, now); err != nil {
		return fmt.Errorf("bench: token: %w", err)
	}
	for i, a := range f.agents {
		m, err := signer.Mint(auth.TokenSpec{Sub: a.sub, Role: registry.RoleAgent, TTL: ttl, IPs: []string{a.ip}}, now)
		if err != nil {
			return fmt.Errorf("bench: token: %w", err)
		}
		f.agents[i].token = m.Token
	}
	return nil
}
