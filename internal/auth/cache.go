package auth

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// DefaultCacheSize is how many verified tokens a server remembers unless
// told otherwise (REGISTRY_TOKEN_CACHE): enough for every agent of a
// 10,000-host fleet, a few MiB at most.
const DefaultCacheSize = 10_000

// cacheShards spreads the cache over locks, so parallel requests rarely
// wait for each other.
const cacheShards = 16

// verified is what Verify learnt about a token that passed every check:
// the principal, what the revocation list is asked on every use, and the
// window of clock readings in which the time checks (exp, nbf, iat with
// Leeway, and the lifetime cap of a token without iat) all pass.
type verified struct {
	p         registry.Principal
	jti       string
	iat       *time.Time // nil: no "iat"
	lid       string     // a renewal's lineage ("lid"), or ""
	lat       *time.Time // when the lineage began ("lat"); nil without lid
	secret    bool       // signed with the HS256 secret (not another issuer's key)
	from, end time.Time  // usable while from <= now < end
}

// usableAt reports whether every time check Verify applies passes at now.
func (e *verified) usableAt(now time.Time) bool {
	return !now.Before(e.from) && now.Before(e.end)
}

// tokenCache remembers verified tokens by the SHA-256 of their text (never
// the text itself), at most size of them. Only tokens that passed every
// check get in, so garbage cannot fill it; when a shard is full, an
// arbitrary entry of it makes room (Go's map iteration starts at a random
// place). Entries are not trusted blindly: a hit is checked against the
// clock and the revocation list again (see Verifier.Verify).
type tokenCache struct {
	shards []cacheShard
}

type cacheShard struct {
	mu  sync.RWMutex
	m   map[[sha256.Size]byte]*verified
	max int
	_   [40]byte // keep shards' locks off each other's cache lines
}

// newTokenCache returns a cache of at most size entries, nil when size is
// not positive.
func newTokenCache(size int) *tokenCache {
	if size <= 0 {
		return nil
	}
	n := min(size, cacheShards)
	c := &tokenCache{shards: make([]cacheShard, n)}
	for i := range c.shards {
		// The first size%n shards hold one more: the sum is exactly size.
		c.shards[i].max = size / n
		if i < size%n {
			c.shards[i].max++
		}
		c.shards[i].m = make(map[[sha256.Size]byte]*verified)
	}
	return c
}

func (c *tokenCache) shard(key *[sha256.Size]byte) *cacheShard {
	return &c.shards[int(key[0])%len(c.shards)]
}

func (c *tokenCache) get(key *[sha256.Size]byte) *verified {
	s := c.shard(key)
	s.mu.RLock()
	e := s.m[*key]
	s.mu.RUnlock()
	return e
}

func (c *tokenCache) put(key *[sha256.Size]byte, e *verified) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[*key]; !ok && len(s.m) >= s.max {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[*key] = e
}

// remove forgets key, if it still holds e (a concurrent Verify may have
// put a fresh entry there meanwhile).
func (c *tokenCache) remove(key *[sha256.Size]byte, e *verified) {
	s := c.shard(key)
	s.mu.Lock()
	if s.m[*key] == e {
		delete(s.m, *key)
	}
	s.mu.Unlock()
}

// len counts the entries, for tests.
func (c *tokenCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}
