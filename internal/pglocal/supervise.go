package pglocal

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SuperviseOptions tunes Supervise; zero fields take the defaults.
type SuperviseOptions struct {
	// Attempts is how many restarts in a row may fail before Supervise
	// gives up; default 5. A restart whose server dies again before
	// StableAfter counts as failed.
	Attempts int
	// Backoff is the wait before the second attempt, doubling for each
	// further one up to MaxBackoff; defaults 500ms and 8s. The first
	// attempt is immediate. With the defaults the five attempts span
	// about 7.5 s of waiting plus their own start-up time.
	Backoff, MaxBackoff time.Duration
	// ReadyTimeout bounds one attempt's start-up; default 15s.
	ReadyTimeout time.Duration
	// StableAfter is how long a restarted server must stay up for the
	// failure count to start afresh; default 1 minute.
	StableAfter time.Duration
}

func (o SuperviseOptions) withDefaults() SuperviseOptions {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	set(&o.Backoff, 500*time.Millisecond)
	set(&o.MaxBackoff, 8*time.Second)
	set(&o.ReadyTimeout, 15*time.Second)
	set(&o.StableAfter, time.Minute)
	return o
}

// errStopping ends a restart because Stop has been called.
var errStopping = errors.New("pglocal: cluster is stopping")

// Supervise keeps the server running until ctx ends or Stop is called: when
// the postmaster exits without Stop having asked (a crash, a kill, someone's
// `pg_ctl stop`), it is started again on the same data directory and socket
// directory, so URL stays valid and connection pools reconnect by
// themselves. Failed restarts are retried with exponential backoff; after
// Options.Attempts failures in a row Supervise returns an error saying why,
// and the caller should give up too (exit, so that its own supervisor can
// act). It returns nil when ctx ends or Stop is called.
//
// Run it at most once per cluster, in its own goroutine.
func (c *Cluster) Supervise(ctx context.Context, opts SuperviseOptions) error {
	opts = opts.withDefaults()
	failures := 0
	upSince := time.Now()
	for {
		s := c.current()
		select {
		case <-ctx.Done():
			return nil
		case <-s.exited:
		}
		if c.isStopping() {
			return nil
		}
		c.mu.Lock()
		c.downSince = s.exitedAt
		c.mu.Unlock()
		s.drainLog(time.Second)
		if time.Since(upSince) >= opts.StableAfter {
			failures = 0
		} else if failures >= opts.Attempts {
			// Each of the last restarts died again before StableAfter: a
			// crash loop, which more restarts would only repeat.
			c.logger.Error("pglocal: postgres exited again soon after its restart; giving up", "dir", c.dataDir,
				"status", exitStatus(s.waitErr), "last_log", c.tail.last(errorLines))
			return fmt.Errorf("pglocal: postgres in %s could not be restarted: it exited again within %s of each of %d restarts (last: %s)",
				c.dataDir, opts.StableAfter, failures, exitStatus(s.waitErr))
		}
		c.logger.Error("pglocal: postgres exited unexpectedly; restarting it", "dir", c.dataDir,
			"status", exitStatus(s.waitErr), "last_log", c.tail.last(errorLines))
		for {
			if failures > 0 {
				wait := min(opts.Backoff<<(failures-1), opts.MaxBackoff)
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
			}
			failures++
			err := c.restart(ctx, opts.ReadyTimeout)
			if err == nil {
				break
			}
			if errors.Is(err, errStopping) || ctx.Err() != nil {
				return nil
			}
			if failures >= opts.Attempts {
				return fmt.Errorf("pglocal: postgres in %s exited and could not be restarted (%d attempts): %w",
					c.dataDir, failures, err)
			}
			c.logger.Warn("pglocal: restart failed; trying again", "dir", c.dataDir, "attempt", failures, "err", err)
		}
		upSince = time.Now()
		c.mu.Lock()
		c.downSince = time.Time{}
		c.mu.Unlock()
		c.logger.Info("pglocal: postgres restarted", "dir", c.dataDir, "attempt", failures)
	}
}

// restart starts a new server in place of the current one, which has
// exited.
func (c *Cluster) restart(ctx context.Context, timeout time.Duration) error {
	// Someone else's postmaster on our data directory is not ours to kill.
	if err := c.checkNotRunning(c.ra); err != nil {
		return err
	}
	// Backends of a killed postmaster can outlive it and keep its shared
	// memory attached, and a new postmaster refuses to start while they
	// do ("pre-existing shared memory block is still in use").
	if err := killServer(c.dataDir, 5*time.Second); err != nil {
		return err
	}
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return errStopping
	}
	s, err := c.spawn()
	if err == nil {
		c.srv = s // from here on Stop stops this one
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	readyCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.waitReady(readyCtx, s); err != nil {
		if c.isStopping() || ctx.Err() != nil {
			return errors.Join(errStopping, err) // Stop takes care of s
		}
		_ = s.proc.Kill()
		_ = killServer(c.dataDir, 5*time.Second)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
		return err
	}
	return nil
}

func (c *Cluster) current() *server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srv
}

func (c *Cluster) isStopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopping
}

// DownSince reports whether the server is down without Stop having been
// called, and since when: from the moment its postmaster exited until a
// restart (by Supervise) accepts connections again.
func (c *Cluster) DownSince() (since time.Time, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return time.Time{}, false
	}
	if !c.downSince.IsZero() {
		return c.downSince, true
	}
	select {
	case <-c.srv.exited:
		return c.srv.exitedAt, true
	default:
		return time.Time{}, false
	}
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
