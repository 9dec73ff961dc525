package store_test

import (
	"context"
	"testing"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/store"
)

// BenchmarkFeedPosition is the look-up a consistent read waits for
// (shared by the reads arriving together): the feed's position with the
// epoch verdict, over a change log of 10,000 sequenced events.
func BenchmarkFeedPosition(b *testing.B) {
	ctx := context.Background()
	st := pgtest.Open(b, pgtest.New(b), store.Options{})
	if _, err := st.Pool().Exec(ctx, `
		INSERT INTO nodes (ip, gpu_index, cpu_mem, driver_version)
		SELECT '10.0.0.0'::inet + (g / 8), g % 8, 1, 'd' FROM generate_series(0, 9999) g`); err != nil {
		b.Fatal(err)
	}
	if _, err := st.SequenceEvents(ctx, 0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, pending, err := st.FeedPosition(ctx, 0); err != nil || pending {
			b.Fatal(pending, err)
		}
	}
}
