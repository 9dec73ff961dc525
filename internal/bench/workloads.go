package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Workload names, in the order a run takes them.
const (
	Heartbeat = "heartbeat"
	Retrieve  = "retrieve"
	FreePage  = "free"
	Claim     = "claim"
	Gang      = "gang"
	Fabric    = "fabric"
	Fill      = "fill"
	// Keep and Keep1 claim and keep what they claim (8 same_host, and
	// single nodes), the fleet filling up; every job is released at the
	// end of the workload.
	Keep     = "keep"
	Keep1    = "keep1"
	Selector = "selector"
	Abandon  = "abandon"
	Renew    = "renew"
	ListAll  = "listall"
	Replica  = "replica"
	Startup  = "startup"
)

// AllWorkloads is every workload, in run order. startup comes last: it
// restarts the server (the workloads after it, if any, run on the
// restarted one).
var AllWorkloads = []string{Heartbeat, Retrieve, FreePage, Selector, Claim, Gang, Fabric, Fill, Keep, Keep1, Abandon, Renew, ListAll, Replica, Startup}

// gangClients is the number of concurrent schedulers of the gang workload,
// whatever -clients says: the target is stated for 16.
const gangClients = 16

// gangSize is how many nodes of one host a gang claim takes.
const gangSize = 8

// fabricHosts is how many whole hosts of one fabric a fabric gang takes.
const fabricHosts = 4

// selectorText is the selector page's label selector: 1 host in 10, less
// 1 in 40 of those.
const selectorText = "team=t3,rack!=r13"

// minGPUMem is the free page's min_gpu_mem: 80 GiB, which three of the
// four seeded hardware generations have.
const minGPUMem = 80 << 30

// workload is one path measured through registryd and, with the same SQL,
// through pgbench.
type workload struct {
	name    string
	path    string // what the table calls it
	clients int
	op      op
	// script is the pgbench script's file in scripts/; "" when there is
	// none. tables says which copies of the registry's tables it needs.
	script string
	tables bool
}

// target is what the workloads send requests to.
type target struct {
	url   string
	fleet *fleet
	// holds checks that no node is given to two jobs at once.
	holds *holdings
	jobs  atomic.Int64
	// listBytes is the size of the last whole list listall read.
	listBytes atomic.Int64
	// claims times the claim requests alone of the claim and gang
	// workloads (an op is a claim and its release).
	claims claimTimes
	// kept are the jobs of a keep workload, released when it ends.
	kept kept
}

func (t *target) workload(name string, clients int) (workload, error) {
	f := t.fleet
	switch name {
	case Heartbeat:
		if len(f.agents) == 0 {
			return workload{}, fmt.Errorf("bench: heartbeat needs agent-owned nodes, which a fleet seeded with -seed %s has none of", SeedSync)
		}
		// As registryd's agent sends it: the Node-Id check takes the
		// node cache as it is (Cache-Control: max-stale).
		path := "heartbeat: GET /v1/nodes/ping + Node-Id, max-stale (agent, own node)"
		if f.adminActsAsAgents {
			path = "heartbeat: GET /v1/nodes/ping + Node-Id, max-stale (admin acting as the node)"
		}
		return workload{name: name, path: path, clients: clients,
			script: "heartbeat.sql",
			op: func(ctx context.Context, c *http.Client, rng *rand.Rand) error {
				a := f.agents[rng.IntN(len(f.agents))]
				pk := a.nodes[rng.IntN(len(a.nodes))]
				_, err := call(ctx, c, "GET", t.url+"/v1/nodes/ping", a.token, nil, "Node-Id", strconv.FormatInt(pk, 10), "Cache-Control", "max-stale")
				return err
			}}, nil
	case Retrieve:
		return workload{name: name, path: "retrieve: GET /v1/nodes/{random pk}", clients: clients,
			script: "retrieve.sql",
			op: func(ctx context.Context, c *http.Client, rng *rand.Rand) error {
				pk := f.minPK + rng.Int64N(f.maxPK-f.minPK+1)
				_, err := call(ctx, c, "GET", t.url+"/v1/nodes/"+strconv.FormatInt(pk, 10), f.scheduler, nil)
				return err
			}}, nil
	case FreePage:
		return workload{name: name, path: "free page: POST /v1/nodes/list free, min_gpu_mem, random after, limit 100", clients: clients,
			script: "free.sql",
			op: t.listPage(func(rng *rand.Rand) []byte {
				return fmt.Appendf(nil, `{"free":true,"min_gpu_mem":%d,"after":%d,"limit":100}`, minGPUMem, rng.Int64N(f.maxPK))
			})}, nil
	case Selector:
		return workload{name: name, path: "selector page: POST /v1/nodes/list free, selector " + selectorText + ", random after, limit 100", clients: clients,
			script: "selector.sql",
			op: t.listPage(func(rng *rand.Rand) []byte {
				return fmt.Appendf(nil, `{"free":true,"selector":%q,"after":%d,"limit":100}`, selectorText, rng.Int64N(f.maxPK))
			})}, nil
	case Claim:
		return workload{name: name, path: "claim 1 + release: POST /v1/nodes/claim, /v1/nodes/release", clients: clients,
			script: "claim.sql", tables: true,
			op: func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
				return t.claimRelease(ctx, c, 1, false)
			}}, nil
	case Gang:
		return workload{name: name, path: "gang: claim 8 same_host + release", clients: gangClients,
			script: "gang.sql", tables: true,
			op: func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
				return t.claimRelease(ctx, c, gangSize, true)
			}}, nil
	case Fabric:
		return workload{name: name, path: fmt.Sprintf("fabric gang: claim %d×%d per_host, same_fabric + release", fabricHosts, gangSize),
			clients: gangClients, script: "fabric.sql", tables: true,
			op: func(ctx context.Context, c *http.Client, _ *rand.Rand) error {
				return t.claimReleaseWith(ctx, c, claimShape{count: fabricHosts * gangSize, perHost: gangSize, sameFabric: true})
			}}, nil
	case Keep:
		return workload{name: name, path: fmt.Sprintf("keep: claim %d same_host and keep it (the fleet fills); all released at the end", gangSize),
			clients: gangClients, op: t.claimKeep(gangSize, true)}, nil
	case Keep1:
		return workload{name: name, path: "keep1: claim 1 and keep it (the fleet fills); all released at the end",
			clients: gangClients, op: t.claimKeep(1, false)}, nil
	case Fill:
		// No op: Run drives it itself (runFill).
		return workload{name: name, path: fmt.Sprintf("fabric fill: claim %d×%d per_host, same_fabric and keep them until none fits; then release all", fabricHosts, gangSize),
			clients: gangClients}, nil
	case Abandon:
		// No op: Run drives both phases itself (runAbandon).
		return workload{name: name, path: fmt.Sprintf("abandon: %d schedulers claim 1 + release while %d others give up on claims after 1-3 ms", abandonHonest, abandonClients),
			clients: abandonHonest, script: "claim.sql", tables: true}, nil
	case Renew:
		// No op: Run drives it itself (runRenew).
		return workload{name: name, path: fmt.Sprintf("renew: POST /v1/nodes/renew of %d jobs of %d nodes, one watch counting events", renewJobs, renewJobNodes),
			clients: clients, script: "renew.sql", tables: true}, nil
	case ListAll:
		return workload{name: name, path: "list all: POST /v1/nodes/list {} (every node, streamed)", clients: listAllClients,
			op: t.listAllOp(int64(f.nodes), &t.listBytes)}, nil
	case Replica:
		// No op: Run drives the two replicas itself (runReplica).
		return workload{name: name, path: fmt.Sprintf("replica: GET /v1/nodes/{pk} on B while %d writers PATCH those nodes on A", replicaWriters),
			clients: clients, script: "retrieve.sql"}, nil
	case Startup:
		// No op: Run restarts the server itself (restarts).
		return workload{name: name, path: fmt.Sprintf("startup: SIGTERM, serve again on the same data, until /readyz 200 (%d starts)", startupRuns),
			clients: 1}, nil
	}
	return workload{}, fmt.Errorf("bench: no workload %q (want %v)", name, AllWorkloads)
}

// listPage is an op that lists the page body asks for and checks that
// the answer is a JSON array.
func (t *target) listPage(body func(*rand.Rand) []byte) op {
	return func(ctx context.Context, c *http.Client, rng *rand.Rand) error {
		b, err := call(ctx, c, "POST", t.url+"/v1/nodes/list", t.fleet.scheduler, body(rng))
		if err != nil {
			return err
		}
		if len(b) < 2 || b[0] != '[' {
			return fmt.Errorf("POST /v1/nodes/list: not a JSON array: %.80s", b)
		}
		return nil
	}
}

type claimedNode struct {
	PK         int64   `json:"pk"`
	IP         string  `json:"ip"`
	Fabric     *string `json:"fabric"`
	CurrentJob *int64  `json:"current_job"`
}

// claimShape is what a workload's claims ask for.
type claimShape struct {
	count      int
	sameHost   bool
	perHost    int
	sameFabric bool
}

// claimRelease claims count nodes for a new job, checks them (their job,
// one host for a gang, none held by another job the generator knows of)
// and releases them.
func (t *target) claimRelease(ctx context.Context, c *http.Client, count int, sameHost bool) error {
	return t.claimReleaseWith(ctx, c, claimShape{count: count, sameHost: sameHost})
}

// claimReleaseWith is claimRelease of any shape; a fabric gang is checked
// for whole hosts of one fabric.
func (t *target) claimReleaseWith(ctx context.Context, c *http.Client, s claimShape) error {
	count := s.count
	job := t.jobs.Add(1)
	body := fmt.Appendf(nil, `{"job":%d,"count":%d,"same_host":%t}`, job, count, s.sameHost)
	if s.perHost > 0 {
		body = fmt.Appendf(nil, `{"job":%d,"count":%d,"per_host":%d,"same_fabric":%t}`, job, count, s.perHost, s.sameFabric)
	}
	t0 := time.Now()
	b, err := call(ctx, c, "POST", t.url+"/v1/nodes/claim", t.fleet.scheduler, body)
	if err != nil {
		return err
	}
	t.claims.add(t0, time.Since(t0))
	var got struct {
		Job   int64         `json:"job"`
		Nodes []claimedNode `json:"nodes"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("POST /v1/nodes/claim: %w", err)
	}
	pks := pksOf(got.Nodes)
	if err := t.holds.take(job, pks); err != nil {
		return err // not released: a node two jobs hold is a finding to keep
	}
	checkErr := checkClaim(job, count, s.sameHost, got.Nodes)
	if checkErr == nil && s.perHost > 0 {
		checkErr = checkWholeHosts(job, s.perHost, s.sameFabric, got.Nodes)
	}
	t.holds.drop(pks)
	if len(pks) == 0 {
		return checkErr
	}
	rb, err := call(ctx, c, "POST", t.url+"/v1/nodes/release", t.fleet.scheduler, fmt.Appendf(nil, `{"job":%d,"nodes":%s}`, job, mustJSON(pks)))
	if err != nil {
		return errors.Join(checkErr, err)
	}
	var rel struct {
		Released    []claimedNode     `json:"released"`
		NotReleased []json.RawMessage `json:"not_released"`
	}
	if err := json.Unmarshal(rb, &rel); err != nil {
		return errors.Join(checkErr, fmt.Errorf("POST /v1/nodes/release: %w", err))
	}
	if len(rel.Released) != len(pks) || len(rel.NotReleased) != 0 {
		return errors.Join(checkErr, fmt.Errorf("POST /v1/nodes/release: released %d of %d, not released %s", len(rel.Released), len(pks), rel.NotReleased))
	}
	return checkErr
}

// pksOf is the pks of nodes, in their order.
func pksOf(nodes []claimedNode) []int64 {
	pks := make([]int64, len(nodes))
	for i, n := range nodes {
		pks[i] = n.PK
	}
	return pks
}

func checkClaim(job int64, count int, sameHost bool, nodes []claimedNode) error {
	if len(nodes) != count {
		return fmt.Errorf("POST /v1/nodes/claim: %d nodes for job %d, asked for %d", len(nodes), job, count)
	}
	for _, n := range nodes {
		if n.CurrentJob == nil || *n.CurrentJob != job {
			return fmt.Errorf("POST /v1/nodes/claim: node %d came back with current_job %v, want %d", n.PK, n.CurrentJob, job)
		}
		if sameHost && n.IP != nodes[0].IP {
			return fmt.Errorf("POST /v1/nodes/claim: same_host claim for job %d spans %s and %s", job, nodes[0].IP, n.IP)
		}
	}
	return nil
}

// checkWholeHosts fails unless nodes are whole groups of perHost, one per
// host, all of one fabric when sameFabric.
func checkWholeHosts(job int64, perHost int, sameFabric bool, nodes []claimedNode) error {
	per := map[string]int{}
	for _, n := range nodes {
		per[n.IP]++
		if sameFabric && (n.Fabric == nil || nodes[0].Fabric == nil || *n.Fabric != *nodes[0].Fabric) {
			return fmt.Errorf("POST /v1/nodes/claim: same_fabric claim for job %d spans fabrics %v and %v", job, nodes[0].Fabric, n.Fabric)
		}
	}
	for ip, k := range per {
		if k != perHost {
			return fmt.Errorf("POST /v1/nodes/claim: job %d took %d nodes of host %s, want %d", job, k, ip, perHost)
		}
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

var errDoubleAssignment = errors.New("double assignment")

// holdings are the nodes claims of this run hold right now, by job. A
// claim is registered before its release is sent and dropped before the
// release, so a node in it is one no other claim may have been given.
type holdings struct {
	mu      sync.Mutex
	held    map[int64]int64
	doubles atomic.Int64
}

func newHoldings() *holdings { return &holdings{held: map[int64]int64{}} }

// take registers pks as held by job; a pk another job holds is a double
// assignment (an error wrapping errDoubleAssignment), and then nothing is
// registered.
func (h *holdings) take(job int64, pks []int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, pk := range pks {
		if other, ok := h.held[pk]; ok {
			h.doubles.Add(1)
			return fmt.Errorf("%w: node %d given to job %d while job %d holds it", errDoubleAssignment, pk, job, other)
		}
	}
	for _, pk := range pks {
		h.held[pk] = job
	}
	return nil
}

func (h *holdings) drop(pks []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, pk := range pks {
		delete(h.held, pk)
	}
}

// claimTimes collects the latencies of successful claim requests that
// end after since (the measured part of a run, not its warm-up).
type claimTimes struct {
	mu    sync.Mutex
	since time.Time
	lat   []time.Duration
}

// reset starts a new collection of claims that end after since.
func (c *claimTimes) reset(since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since, c.lat = since, nil
}

func (c *claimTimes) add(start time.Time, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.since.IsZero() && start.Add(d).After(c.since) {
		c.lat = append(c.lat, d)
	}
}

// stats are the claims' count, p50 and p99.
func (c *claimTimes) stats() (n int, p50, p99 time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lat) == 0 {
		return 0, 0, 0
	}
	sorted := slices.Sorted(slices.Values(c.lat))
	return len(sorted), percentile(sorted, 0.50), percentile(sorted, 0.99)
}
