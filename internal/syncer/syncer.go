// Package syncer imports the GPU inventory of cloud providers into the
// nodes table. It is built like a maintenance service: validated config,
// RunOnce for tests and `registryd sync --once`, Run for the loop in
// `serve`, a timeout per pass, an injected clock and logger.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/registry"
)

// Source is one provider's client.
type Source interface {
	Name() string // scp or e2e: the nodes' source
	Fetch(ctx context.Context) (provider.Inventory, error)
}

// Store applies an inventory. *store.Store implements it.
type Store interface {
	// ApplyImport makes source's nodes match nodes; nodes of the external
	// ids in skipped (hosts reported but not mappable) are left alone.
	ApplyImport(ctx context.Context, actor registry.Actor, source string, nodes []registry.ImportedNode, skipped []string) (registry.ImportResult, error)
}

// Locker takes the cluster-wide sync leadership (serve's loop without
// waiting; `registryd sync --once` may wait for another replica's pass).
// While held, the pass writes through the returned Store, which commits
// only while the leadership holds (serve's: a renewed lease, so a replica
// that froze mid-pass cannot write once another has taken over). ok is
// false when another replica holds it.
type Locker func(ctx context.Context) (st Store, release func(), ok bool, err error)

// ErrLocked means another replica is syncing right now.
var ErrLocked = errors.New("syncer: another registryd is syncing right now")

// Config configures a Syncer.
type Config struct {
	Sources     []Source
	Locker      Locker
	Interval    time.Duration // between passes in Run; default 5m
	PassTimeout time.Duration // bound on one pass; default 10m
	Logger      *slog.Logger
	Now         func() time.Time
	// OnPass, when set, gets every provider's pass as it ends (for
	// metrics), in RunOnce and so in Run.
	OnPass func(Summary)
	// MaxRemovalPercent is the mass-removal guard (registry.RemovalGuard):
	// a pass that would take away (remove, or mark gone) more than this
	// share of a provider's nodes takes away none of them, unless it is
	// the RemovalPasses-th pass in a row to find such a removal, none
	// larger than the first, or AllowRemoval lets this syncer's passes
	// through. 0 means 10; 100 turns it off.
	MaxRemovalPercent int
	RemovalPasses     int // default 3
	AllowRemoval      bool
	// MaxReadBytes bounds what one provider's pass reads from it, all
	// answers together (provider.WithReadBudget); default 256 MiB, about
	// four times what a fleet of 1,000,000 GPUs takes.
	MaxReadBytes int64
}

// DefaultMaxReadBytes is Config.MaxReadBytes's default.
const DefaultMaxReadBytes = 256 << 20

// Syncer runs import passes.
type Syncer struct {
	cfg Config
	mu  sync.Mutex
	// guards are, by provider, the mass-removal guard of its next pass:
	// how many passes in a row held a removal back (in this process: a
	// replica taking over starts again at 0).
	guards map[string]registry.RemovalGuard
}

// New validates cfg.
func New(cfg Config) (*Syncer, error) {
	if cfg.Locker == nil {
		return nil, errors.New("syncer: no Locker")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Minute
	}
	if cfg.PassTimeout <= 0 {
		cfg.PassTimeout = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxRemovalPercent <= 0 {
		cfg.MaxRemovalPercent = 10
	}
	if cfg.RemovalPasses <= 0 {
		cfg.RemovalPasses = 3
	}
	if cfg.MaxReadBytes <= 0 {
		cfg.MaxReadBytes = DefaultMaxReadBytes
	}
	return &Syncer{cfg: cfg, guards: map[string]registry.RemovalGuard{}}, nil
}

// Summary is what one pass did for one provider.
type Summary struct {
	Provider  string
	HostsSeen int
	Nodes     int // registry nodes the inventory maps to
	Skipped   []provider.Skip
	Result    registry.ImportResult
	// Guard is the mass-removal guard the pass ran under.
	Guard    registry.RemovalGuard
	Duration time.Duration
	Err      error // the provider failed; nothing was changed for it
}

// String is the one-paragraph report `registryd sync --once` prints.
func (s Summary) String() string {
	var b strings.Builder
	if s.Err != nil {
		fmt.Fprintf(&b, "%s: FAILED, nothing changed: %v", s.Provider, s.Err)
		return b.String()
	}
	r := s.Result
	fmt.Fprintf(&b, "%s: %d hosts seen → %d nodes: %d added, %d updated, %d unchanged, %d removed, %d kept because busy",
		s.Provider, s.HostsSeen, s.Nodes, r.Added, r.Updated, r.Unchanged, r.Removed, r.KeptBusy)
	if r.KeptSkipped > 0 {
		fmt.Fprintf(&b, ", %d kept as they were because their host was skipped", r.KeptSkipped)
	}
	fmt.Fprintf(&b, " (%s)", s.Duration.Round(time.Millisecond))
	if r.Withheld > 0 {
		g := s.Guard
		fmt.Fprintf(&b, "\n  REMOVALS HELD BACK: %d of the %d nodes would have gone (more than %d %%), so none did;"+
			" pass %d of %d in a row that finds no more than this (the %s removes them), or remove them now with registryd sync --once --allow-removal",
			r.Withheld, r.Total, g.MaxPercent, g.Pass(r.Withheld), g.Passes, ordinal(g.Passes))
	}
	if len(r.HardwareAdded) > 0 {
		fmt.Fprintf(&b, "\n  hardware generations created: %s", strings.Join(r.HardwareAdded, ", "))
	}
	if len(s.Skipped) > 0 {
		fmt.Fprintf(&b, "\n  %d hosts skipped:", len(s.Skipped))
		for _, sk := range s.Skipped {
			name := sk.Name
			if name == "" {
				name = sk.ExternalID
			}
			fmt.Fprintf(&b, "\n    %s: %s", name, sk.Reason)
		}
	}
	if len(r.Conflicts) > 0 {
		fmt.Fprintf(&b, "\n  %d nodes left to another provider:", len(r.Conflicts))
		for _, c := range r.Conflicts {
			fmt.Fprintf(&b, "\n    %s", c)
		}
	}
	return b.String()
}

// RunOnce runs one pass of every source under the sync lock. Each provider
// is all or nothing: its whole inventory is fetched first, and a failure
// changes nothing for it. The error is ErrLocked when another replica is
// syncing, or names every provider that failed.
func (s *Syncer) RunOnce(ctx context.Context) ([]Summary, error) {
	// The lock first: a Locker that waits for another replica's pass does
	// not eat into this pass's time.
	st, release, ok, err := s.cfg.Locker(ctx)
	if err != nil {
		return nil, fmt.Errorf("syncer: take the sync lock: %w", err)
	}
	if !ok {
		return nil, ErrLocked
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PassTimeout)
	defer cancel()
	var summaries []Summary
	var failed []string
	for _, src := range s.cfg.Sources {
		sum := s.pass(ctx, st, src)
		if s.cfg.OnPass != nil {
			s.cfg.OnPass(sum)
		}
		summaries = append(summaries, sum)
		if sum.Err != nil {
			failed = append(failed, src.Name())
		}
	}
	if len(failed) > 0 {
		return summaries, fmt.Errorf("syncer: %s failed", strings.Join(failed, ", "))
	}
	return summaries, nil
}

func (s *Syncer) pass(ctx context.Context, st Store, src Source) Summary {
	start := s.cfg.Now()
	sum := Summary{Provider: src.Name()}
	inv, err := src.Fetch(provider.WithReadBudget(ctx, s.cfg.MaxReadBytes))
	if err != nil {
		sum.Err = err
		sum.Duration = s.cfg.Now().Sub(start)
		return sum
	}
	nodes, skipped := Nodes(inv)
	sum.HostsSeen = len(inv.Hosts) + len(inv.Skipped)
	sum.Nodes = len(nodes)
	sum.Skipped = skipped
	actor := registry.Actor{Principal: registry.Principal{Sub: "sync:" + src.Name(), Role: registry.RoleSystem}}
	keep := make([]string, 0, len(skipped))
	for _, sk := range skipped {
		keep = append(keep, sk.ExternalID)
	}
	s.mu.Lock()
	sum.Guard = s.guards[src.Name()]
	s.mu.Unlock()
	sum.Guard.MaxPercent, sum.Guard.Passes, sum.Guard.Allow = s.cfg.MaxRemovalPercent, s.cfg.RemovalPasses, s.cfg.AllowRemoval
	sum.Result, err = st.ApplyImport(registry.WithRemovalGuard(ctx, sum.Guard), actor, src.Name(), nodes, keep)
	if err != nil {
		sum.Err = err
	} else {
		s.mu.Lock()
		s.guards[src.Name()] = sum.Guard.After(sum.Result.Withheld)
		s.mu.Unlock()
	}
	sum.Duration = s.cfg.Now().Sub(start)
	return sum
}

// ordinal is n as "1st", "2nd", "3rd", "4th", ….
func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}

// Nodes maps an inventory to registry nodes: one per GPU per host, or one
// with index 0 and no GPU memory for a CPU-only host. Hosts whose address
// is not an IP are skipped, with the provider's own skips.
func Nodes(inv provider.Inventory) ([]registry.ImportedNode, []provider.Skip) {
	skipped := append([]provider.Skip(nil), inv.Skipped...)
	var nodes []registry.ImportedNode
	for _, h := range inv.Hosts {
		ip, err := registry.CanonicalIP(strings.TrimSpace(h.IP))
		if err != nil {
			skipped = append(skipped, provider.Skip{ExternalID: h.ExternalID, Name: h.Name,
				Reason: fmt.Sprintf("address %q: %v", h.IP, err)})
			continue
		}
		if reason := implausible(h); reason != "" {
			skipped = append(skipped, provider.Skip{ExternalID: h.ExternalID, Name: h.Name, Reason: reason})
			continue
		}
		labels, err := registry.MakeLabels(h.Labels)
		if err != nil {
			skipped = append(skipped, provider.Skip{ExternalID: h.ExternalID, Name: h.Name, Reason: "its labels: " + err.Error()})
			continue
		}
		base := registry.ImportedNode{ExternalID: h.ExternalID, IP: ip, CPUMem: h.CPUMemBytes,
			GPUModel: h.GPUModel, State: h.State, Running: h.Running, Fabric: h.Fabric, Labels: labels}
		if h.GPUs <= 0 {
			base.GPUModel = ""
			nodes = append(nodes, base)
			continue
		}
		for i := range h.GPUs {
			n := base
			n.Index = i
			mem := h.GPUMemBytes
			n.GPUMem = &mem
			nodes = append(nodes, n)
		}
	}
	return nodes, skipped
}

// Limits past which a provider's answer is taken for garbage rather than
// a machine: one bad field must not make the registry allocate millions of
// nodes or store absurd sizes.
const (
	maxGPUsPerHost = 64
	maxMemBytes    = int64(1) << 50 // 1 PiB
)

func implausible(h provider.Host) string {
	// The texts the nodes take from the host are held to what the API
	// holds them to (a GPU model names the node's hardware generation).
	texts := registry.NodeSpec{IP: "127.0.0.1"}
	if h.Fabric != "" {
		texts.Fabric = &h.Fabric
	}
	if h.GPUModel != "" {
		texts.GPUModel = &h.GPUModel
	}
	bad := registry.FieldsOf(texts.Normalize())
	switch {
	case len(bad) > 0:
		return "reports a " + strings.ReplaceAll(bad[0].Field, "_", " ") + " that " + bad[0].Message
	case h.GPUs > maxGPUsPerHost:
		return fmt.Sprintf("reports %d GPUs on one host; more than %d is not believable", h.GPUs, maxGPUsPerHost)
	case h.CPUMemBytes < 0 || h.CPUMemBytes > maxMemBytes:
		return fmt.Sprintf("reports %d bytes of host memory", h.CPUMemBytes)
	case h.GPUs > 0 && (h.GPUMemBytes < 0 || h.GPUMemBytes > maxMemBytes):
		return fmt.Sprintf("reports %d bytes of memory per GPU", h.GPUMemBytes)
	}
	return ""
}

// Run syncs every interval until ctx ends. Only the replica holding the
// lock syncs; the others skip the tick. context.Canceled is not an error.
func (s *Syncer) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		summaries, err := s.RunOnce(ctx)
		switch {
		case errors.Is(err, ErrLocked):
			s.cfg.Logger.Debug("sync: another replica holds the sync lock; skipping this pass")
		case ctx.Err() != nil:
			return
		case err != nil && summaries == nil:
			s.cfg.Logger.Warn("sync pass could not start", "err", err)
		}
		for _, sum := range summaries {
			if sum.Err != nil {
				s.cfg.Logger.Error("sync failed; nothing changed for this provider", "provider", sum.Provider, "err", sum.Err)
				continue
			}
			s.cfg.Logger.Info("sync", "provider", sum.Provider, "hosts", sum.HostsSeen, "nodes", sum.Nodes,
				"added", sum.Result.Added, "updated", sum.Result.Updated, "unchanged", sum.Result.Unchanged,
				"removed", sum.Result.Removed, "kept_busy", sum.Result.KeptBusy, "kept_skipped", sum.Result.KeptSkipped, "withheld", sum.Result.Withheld, "skipped", len(sum.Skipped),
				"conflicts", len(sum.Result.Conflicts), "duration_ms", sum.Duration.Milliseconds())
			if r, g := sum.Result, sum.Guard; r.Withheld > 0 {
				s.cfg.Logger.Warn("sync held back removals: more of the provider's nodes were about to go than the guard allows",
					"provider", sum.Provider, "would_remove", r.Withheld, "of", r.Total, "max_percent", g.MaxPercent,
					"pass", g.Pass(r.Withheld), "passes", g.Passes)
			}
			for _, sk := range sum.Skipped {
				s.cfg.Logger.Warn("sync skipped a host", "provider", sum.Provider, "host", sk.Name, "id", sk.ExternalID, "reason", sk.Reason)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
