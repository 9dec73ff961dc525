package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// Seed modes: how the fleet gets into the registry.
const (
	// SeedSQL inserts the fleet in one transaction behind the server's
	// back, then restarts a started server on it (its cache preloaded).
	SeedSQL = "sql"
	// SeedAPI creates the same fleet through the running server's API,
	// as a real fleet arrives (agents register their own nodes, admins
	// the rest, schedulers claim the busy ones), and measures that server
	// as it is afterwards: no restart.
	SeedAPI = "api"
)

// seedClients is the concurrency of an API seed.
const seedClients = 32

// seedAPI fills an empty registry at url with the fleet seed describes,
// through the API: hardware generations by an admin, each agent host's
// nodes by its agent (token bound to the host's address; the agent becomes
// the owner and pings each node once), the other hosts' by an admin, and
// the busy hosts claimed by a scheduler with a filter on the host's
// address (1 in 8 wholly, 1 in 8 three GPUs). It needs the token secret.
func seedAPI(ctx context.Context, url string, pool *pgxpool.Pool, secret []byte, n, agents int) (*fleet, error) {
	start := time.Now()
	if len(secret) == 0 {
		return nil, fmt.Errorf("bench: seed through the API: needs the token secret (agents register their own nodes)")
	}
	if err := checkEmpty(ctx, pool); err != nil {
		return nil, err
	}
	hosts := (n + 7) / 8
	agents = min(agents, hosts)
	signer := auth.Signer{Secret: secret}
	now := time.Now()
	admin, err := signer.Sign("bench-admin", registry.RoleAdmin, time.Hour, now)
	if err != nil {
		return nil, fmt.Errorf("bench: token: %w", err)
	}
	scheduler, err := signer.Sign("bench-scheduler", registry.RoleScheduler, time.Hour, now)
	if err != nil {
		return nil, fmt.Errorf("bench: token: %w", err)
	}
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: seedClients}, Timeout: time.Minute}
	defer c.CloseIdleConnections()
	hw := make([]int64, len(generations))
	for i, g := range generations {
		b, err := call(ctx, c, "POST", url+"/v1/hardware/create", admin, fmt.Appendf(nil, `{"name":%q}`, g.name))
		if err != nil {
			return nil, fmt.Errorf("bench: seed: %w", err)
		}
		var h struct {
			PK int64 `json:"pk"`
		}
		if err := json.Unmarshal(b, &h); err != nil || h.PK == 0 {
			return nil, fmt.Errorf("bench: seed: hardware %s: %.200s", g.name, b)
		}
		hw[i] = h.PK
	}

	var next atomic.Int64
	var first error
	var once sync.Once
	fail := func(err error) { once.Do(func() { first = err }) }
	var wg sync.WaitGroup
	for range seedClients {
		wg.Go(func() {
			for h := next.Add(1) - 1; h < int64(hosts) && ctx.Err() == nil && first == nil; h = next.Add(1) - 1 {
				if err := seedHost(ctx, c, url, signer, admin, scheduler, hw, h, n, h < int64(agents), now); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	f, err := fleetOf(ctx, pool, n)
	if err != nil {
		return nil, err
	}
	f.seeded = time.Since(start)
	return f, nil
}

// seedHost creates host h's nodes (the agent's own when byAgent), pings
// them as the agent, and claims the busy ones.
func seedHost(ctx context.Context, c *http.Client, url string, signer auth.Signer, admin, scheduler string, hw []int64, h int64, n int, byAgent bool, now time.Time) error {
	// The same addresses as seed: 10.0.0.0 + (h/250)*256 + h%250 + 1.
	v := (h/250)*256 + h%250 + 1
	ip := fmt.Sprintf("10.%d.%d.%d", v>>16&255, v>>8&255, v&255)
	token := admin
	if byAgent {
		m, err := signer.Mint(auth.TokenSpec{Sub: "bench-agent-" + strconv.FormatInt(h, 10), Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{ip}}, now)
		if err != nil {
			return fmt.Errorf("bench: token: %w", err)
		}
		token = m.Token
	}
	g := generations[h%4]
	var pks []int64
	for i := int64(0); i < 8 && h*8+i < int64(n); i++ {
		body := fmt.Appendf(nil, `{"ip":%q,"index":%d,"cpu_mem":2199023255552,"driver_version":"550.54.15","hardware_generation":%d,"gpu_mem":%d,`+
			`"fabric":"fab-%04d","labels":{"team":"t%d","rack":"r%d"}}`,
			ip, i, hw[h%4], g.gpuMem, h/hostsPerFabric, h%10, h%40)
		b, err := call(ctx, c, "POST", url+"/v1/nodes/create", token, body)
		if err != nil {
			return fmt.Errorf("bench: seed: %w", err)
		}
		var node struct {
			PK int64 `json:"pk"`
		}
		if err := json.Unmarshal(b, &node); err != nil || node.PK == 0 {
			return fmt.Errorf("bench: seed: create: %.200s", b)
		}
		pks = append(pks, node.PK)
	}
	if byAgent {
		for _, pk := range pks {
			if _, err := call(ctx, c, "GET", url+"/v1/nodes/ping", token, nil, "Node-Id", strconv.FormatInt(pk, 10)); err != nil {
				return fmt.Errorf("bench: seed: %w", err)
			}
		}
	}
	count := 0
	switch h % 8 {
	case 7:
		count = len(pks)
	case 5:
		count = min(3, len(pks))
	}
	if count > 0 {
		body := fmt.Appendf(nil, `{"job":%d,"count":%d,"same_host":true,"ip":%q}`, seedJobBase+h, count, ip)
		if _, err := call(ctx, c, "POST", url+"/v1/nodes/claim", scheduler, body); err != nil {
			return fmt.Errorf("bench: seed: %w", err)
		}
	}
	return nil
}
