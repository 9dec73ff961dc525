// Package providertest holds checks shared by the provider clients' tests.
package providertest

import (
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider"
)

// CheckFetch fails t unless a pass's result is all or nothing: a failed
// pass returns no hosts at all (the sync worker must not act on half an
// inventory), a successful one a sound inventory (CheckInventory).
func CheckFetch(t testing.TB, inv provider.Inventory, err error) {
	t.Helper()
	if err != nil {
		if len(inv.Hosts)+len(inv.Skipped) != 0 {
			t.Fatalf("a failed pass returned a partial inventory: %+v", inv)
		}
		return
	}
	CheckInventory(t, inv)
}

// CheckInventory fails t when inv breaks what provider.Host promises the
// sync worker: every host has an id, unique within the inventory, and an
// address; GPU hosts name their model. (Whether the numbers are believable
// is the sync worker's own check.)
func CheckInventory(t testing.TB, inv provider.Inventory) {
	t.Helper()
	seen := map[string]bool{}
	for _, h := range inv.Hosts {
		switch {
		case h.ExternalID == "":
			t.Fatalf("host without an id: %+v", h)
		case seen[h.ExternalID]:
			t.Fatalf("host id %q twice", h.ExternalID)
		case strings.TrimSpace(h.IP) == "":
			t.Fatalf("host %q has no address", h.ExternalID)
		case h.GPUs < 0:
			t.Fatalf("host %q has %d GPUs", h.ExternalID, h.GPUs)
		case h.GPUs > 0 && strings.TrimSpace(h.GPUModel) == "":
			t.Fatalf("GPU host %q without a model: %+v", h.ExternalID, h)
		}
		seen[h.ExternalID] = true
	}
}
