package revoke_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/revoke"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkLoad measures a full reload of the revocation list, which every
// replica does on each NOTIFY: is it cheap enough not to need incremental
// reloads? Rows are half subjects, half token ids.
func BenchmarkLoad(b *testing.B) {
	for _, rows := range []int{100, 10_000, 100_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			url := pgtest.New(b)
			st := pgtest.Open(b, url, store.Options{})
			if _, err := st.Pool().Exec(context.Background(), `
				INSERT INTO token_revocations (sub, revoked_before) SELECT 'agent-' || i, now() FROM generate_series(1, $1) i;
				`, rows/2); err != nil {
				b.Fatal(err)
			}
			if _, err := st.Pool().Exec(context.Background(), `
				INSERT INTO token_revocations (jti, until) SELECT md5(i::text), now() + interval '1 day' FROM generate_series(1, $1) i`, rows/2); err != nil {
				b.Fatal(err)
			}
			l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel})
			b.ResetTimer()
			for b.Loop() {
				if err := l.Load(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRevoked is the per-request cost of the check.
func BenchmarkRevoked(b *testing.B) {
	url := pgtest.New(b)
	st := pgtest.Open(b, url, store.Options{})
	if _, err := st.Pool().Exec(context.Background(), `
		INSERT INTO token_revocations (sub, revoked_before) SELECT 'agent-' || i, now() FROM generate_series(1, 10000) i`); err != nil {
		b.Fatal(err)
	}
	l := revoke.New(st, revoke.Options{Channel: store.RevocationsChannel})
	if err := l.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	iat := time.Now()
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.Revoked("agent-5000", "some-jti", &iat); err != nil {
			b.Fatal(err)
		}
	}
}
