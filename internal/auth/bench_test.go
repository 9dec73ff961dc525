package auth

import (
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// BenchmarkVerify is the whole check a request pays: strict pre-check,
// signature, claims, lifetime cap. BenchmarkCheckCompact is the strict
// pre-check alone, what this package adds on top of golang-jwt.
func BenchmarkVerify(b *testing.B) {
	v, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now }})
	for name, ips := range map[string][]string{"unbound": nil, "bound": {"10.0.0.7", "10.1.0.0/24"}} {
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

func BenchmarkCheckCompact(b *testing.B) {
	m, _ := Signer{Secret: secret}.Mint(TokenSpec{Sub: "agent-7", Role: registry.RoleAgent, TTL: time.Hour, IPs: []string{"10.0.0.7", "10.1.0.0/24"}}, now)
	for b.Loop() {
		if _, err := CheckCompact(m.Token); err != nil {
			b.Fatal(err)
		}
	}
}
