package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"

	"github.com/registryd/registryd/client"
)

// An agent registers its GPUs and heartbeats as each node (these examples
// are docs/api.md's; they compile, they are not run).
func Example_agent() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithTokenSource(client.TokenFile("/etc/registryd-agent/token")))
	if err != nil {
		log.Fatal(err)
	}
	node, adopted, err := c.CreateNode(ctx, client.NodeCreate{IP: "10.0.0.7", Index: 0,
		CPUMem: 512 << 30, DriverVersion: "550.54.15", GPUMem: client.Ptr(int64(80 << 30))})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("node %d (adopted: %v)", node.PK, adopted)
	if _, err := c.Ping(ctx, client.AsNode(node.PK)); err != nil { // every interval: the heartbeat
		log.Print(err)
	}
	if _, err := c.PatchNode(ctx, node.PK, client.NodePatch{DriverVersion: client.Ptr("560.28.03")}, client.AsNode(node.PK)); err != nil {
		log.Print(err)
	}
}

// A scheduler finds free nodes, claims a host's GPUs and watches the fleet.
func Example_scheduler() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	free, err := c.ListNodes(ctx, client.NodeFilter{Free: client.Ptr(true), HardwareGeneration: client.Ptr(int64(1)),
		MinGPUMem: client.Ptr(int64(80 << 30)), SeenWithin: client.Ptr(int64(60))})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d free", len(free))
	got, err := c.ClaimNodes(ctx, client.NodeClaim{Job: 7001, Count: client.Ptr(8), SameHost: client.Ptr(true)})
	if errors.Is(err, client.ErrConflict) {
		log.Print("not enough free nodes; nothing held")
	}
	log.Printf("claimed %d", len(got.Nodes))
	// A multi-node training job: 4 whole hosts of 8 GPUs in one fabric,
	// among the nodes labelled for the research team.
	gang, err := c.ClaimNodes(ctx, client.NodeClaim{Job: 7002, Count: client.Ptr(32), PerHost: client.Ptr(8),
		SameFabric: client.Ptr(true), Selector: client.Ptr("team=research")})
	if ce, ok := errors.AsType[*client.Error](err); ok && ce.Code == client.CodeNoFabricFit {
		log.Print(ce.Detail) // "no fabric has 4 hosts …; the most in one fabric is 3"
	}
	log.Printf("gang of %d", len(gang.Nodes))
	if _, err := c.ReleaseNodes(ctx, client.NodeRelease{Job: 7001}); err != nil {
		log.Print(err)
	}
	err = c.Watch(ctx, client.WatchOptions{HardwareGeneration: client.Ptr(int64(1))}, func(ev client.Event) error {
		switch {
		case ev.Reset != nil: // re-list
		case ev.Node != nil:
			log.Printf("%d %s node %d job %v", ev.ID, ev.Type, ev.Node.Node.PK, ev.Node.Node.CurrentJob)
		case ev.Renewal != nil: // one event per renewal of a job's leases
			log.Printf("%d job %d held until %v", ev.ID, ev.Renewal.Job, ev.Renewal.LeaseExpiresAt)
		}
		return nil
	})
	log.Print(err)
}

// An admin fixes the registry, conditionally.
func Example_admin() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	var r client.Response
	if _, err := c.GetNode(ctx, 42, client.Into(&r)); err != nil { // r.ETag is the node's version
		log.Fatal(err)
	}
	_, err = c.PatchNode(ctx, 42, client.NodePatch{GPUMem: client.Null[int64]()}, client.IfMatch(r.ETag))
	var e *client.Error
	if errors.As(err, &e) && e.Status == http.StatusPreconditionFailed {
		log.Print("changed meanwhile: read again")
	}
	if err := c.ForceDeleteNode(ctx, 42); err != nil { // even while it holds a job
		log.Print(err)
	}
	entries, err := c.ListAudit(ctx, client.AuditFilter{TargetType: client.Ptr(client.AuditNode), TargetPK: client.Ptr(int64(42))})
	log.Print(len(entries), err)
	if _, err := c.RevokeTokens(ctx, client.RevokeRequest{Sub: client.Ptr("agent-gpu-17")}); err != nil {
		log.Print(err)
	}
}

// A scheduler follows the fleet: an informer lists it at a position,
// watches from there and lists again on a reset (docs/scheduling.md,
// "Follow the fleet").
func ExampleInformer() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	in := client.NewInformer(c, client.InformerOptions{Handler: func(u client.InformerUpdate) {
		if u.Listed {
			log.Printf("the fleet as of event %d", u.EventID) // at start, and after every reset
			return
		}
		if u.Event.Node != nil { // else u.Event.Renewal: a renewal moved a job's leases
			log.Printf("%d %s node %d", u.EventID, u.Event.Type, u.Event.Node.Node.PK)
		}
	}})
	go func() { log.Print(in.Run(ctx)) }() // until ctx ends; retries while the registry is away
	<-in.Synced()
	nodes, at := in.Nodes() // every node as of event at, by pk; safe from any goroutine
	n, ok := in.Get(42)
	log.Print(len(nodes), at, n.State, ok)
}

// The same by hand: list at a position, then watch from it. Reads are
// consistent unless a call says MaxStale or NoCache.
func ExampleClient_ListNodesWithPosition() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.ListNodesWithPosition(ctx, client.NodeFilter{}) // l.Nodes as of event l.EventID
	if err != nil {
		log.Fatal(err)
	}
	err = c.Watch(ctx, client.WatchOptions{After: &l.EventID}, func(ev client.Event) error {
		switch {
		case ev.Reset != nil: // list again; watch from the new list's EventID
		case ev.Bookmark != nil: // where the stream stands; nothing changed
		case ev.Node != nil: // apply ev.Node.Node by pk if its Version is newer; EventDeleted removes it
		case ev.Renewal != nil: // for each of its Nodes you hold with an older Version: LeaseExpiresAt, UpdatedAt (At), Version
		}
		return nil
	})
	log.Print(err)
	if _, err := c.GetNode(ctx, 42, client.MaxStale()); err != nil { // a replica's cache as it is
		log.Print(err)
	}
}

// A claim that is safe to retry: one key per operation, the same for its
// retries (the client retries it by itself after a 503, a 429 or a lost
// connection; a retry after your own timeout must reuse the key too).
// Reasons are codes, not prose (docs/scheduling.md, "Retry safely").
func ExampleIdempotencyKey() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	key := client.NewIdempotencyKey()
	nodes, err := c.ClaimNodes(ctx, client.NodeClaim{Job: 4715, Count: client.Ptr(8)}, client.IdempotencyKey(key))
	var e *client.Error
	switch {
	case err == nil:
		log.Print(len(nodes.Nodes), " nodes for job 4715")
	case errors.As(err, &e) && e.Code == client.CodeInsufficientCapacity:
		// wait for capacity, then claim again with a new key
	case errors.As(err, &e) && e.Code == client.CodeJobOwnedByOther:
		// another scheduler's job: choose a job id of your own
	default:
		log.Print(err) // still unknown after the retries: retry later with the same key
	}
}

// A scheduler's loop on an informer: it claims when its view shows enough
// free nodes, with a key per job so that a lost answer is retried safely,
// and after a 409 waits for the view to change instead of polling
// (docs/scheduling.md, "Follow the fleet").
func ExampleInformer_schedulingLoop() {
	ctx := context.Background()
	c, err := client.New("http://registry:8080", client.WithToken("…"))
	if err != nil {
		log.Fatal(err)
	}
	changed := make(chan struct{}, 1)
	in := client.NewInformer(c, client.InformerOptions{Handler: func(client.InformerUpdate) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}})
	go func() { log.Print(in.Run(ctx)) }()
	<-in.Synced()
	for job := int64(1); job <= 10; job++ {
		key := client.NewIdempotencyKey()
		for claimed := false; !claimed; {
			nodes, _ := in.Nodes()
			free := 0
			for _, n := range nodes {
				if n.State == client.StateFree {
					free++
				}
			}
			if free >= 8 {
				_, err := c.ClaimNodes(ctx, client.NodeClaim{Job: job, Count: client.Ptr(8)}, client.IdempotencyKey(key))
				var e *client.Error
				switch {
				case err == nil:
					claimed = true
					continue
				case errors.As(err, &e) && e.Code == client.CodeInsufficientCapacity:
					key = client.NewIdempotencyKey() // a new attempt, not a retry
				default:
					log.Fatal(err)
				}
			}
			<-changed
		}
	}
}
