package auth

import (
	"fmt"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// BenchmarkVerify is the whole check a request pays: strict pre-check,
// signature, claims, lifetime cap, revocation list; "cached" is the same
// token again with a cache (a hit: hash, lookup, clock and revocation
// checks). BenchmarkCheckCompact is the strict pre-check alone, what this
// package adds on top of golang-jwt.
func BenchmarkVerify(b *testing.B) {
	for _, cache := range []int{0, DefaultCacheSize} {
		v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, Revocations: &listOf{}, CacheSize: cache})
		for _, bound := range []bool{false, true} {
			var ips []string
			if bound {
				ips = []string{"10.0.0.7", "10.1.0.0/24"}
			}
			name := map[bool]string{false: "unbound", true: "bound"}[bound]
			if cache > 0 {
				name += "/cached"
			}
			b.Run(name, func(b *testing.B) {
				m, err := Signer{Secret: secret}.Mint(TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour, IPs: ips}, now)
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := v.Verify(m.Token); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkVerifyParallel is many clients at once, each with a token of
// its own out of 1,000, with and without a cache: what the shards' locks
// cost under contention.
func BenchmarkVerifyParallel(b *testing.B) {
	toks := make([]string, 1000)
	for i := range toks {
		m, err := Signer{Secret: secret}.Mint(TokenSpec{Sub: fmt.Sprintf("agent-%d", i), Role: registry.RoleAgent, TTL: time.Hour}, now)
		if err != nil {
			b.Fatal(err)
		}
		toks[i] = m.Token
	}
	for _, cache := range []int{0, DefaultCacheSize} {
		v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }, Revocations: &listOf{}, CacheSize: cache})
		b.Run(fmt.Sprintf("cache=%d", cache), func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if _, err := v.Verify(toks[i%len(toks)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

func BenchmarkCheckCompact(b *testing.B) {
	m, _ := Signer{Secret: secret}.Mint(TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.7", "10.1.0.0/24"}}, now)
	for b.Loop() {
		if _, err := CheckCompact(m.Token); err != nil {
			b.Fatal(err)
		}
	}
}
