// Package providertest holds checks shared by the provider clients' tests.
package providertest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/registry"
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
// address; GPU hosts name their model; a fabric id has no surrounding
// blanks; every label has a valid key under one of registryd's provider
// prefixes (*.registryd.io/) and a non-empty valid value. (Whether the
// numbers are believable is the sync worker's own check.)
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
		case strings.TrimSpace(h.Fabric) != h.Fabric:
			t.Fatalf("host %q has fabric %q", h.ExternalID, h.Fabric)
		case len(h.ExternalID) > maxExternalID, len(h.Name) > max(provider.MaxName, maxExternalID),
			len(h.IP) > provider.MaxAddress, len(h.State) > provider.MaxWord,
			len(h.GPUModel) > provider.MaxGPUModel, len(h.Fabric) > provider.MaxFabric:
			t.Fatalf("host %.40q… holds a string past its bound (id %d, name %d, ip %d, state %d, model %d, fabric %d bytes)",
				h.ExternalID, len(h.ExternalID), len(h.Name), len(h.IP), len(h.State), len(h.GPUModel), len(h.Fabric))
		}
		for k, v := range h.Labels {
			prefix, _, _ := strings.Cut(k, "/")
			switch {
			case registry.CheckLabelKey(k) != "":
				t.Fatalf("host %q: label key %q %s", h.ExternalID, k, registry.CheckLabelKey(k))
			case !strings.Contains(k, "/") || !strings.HasSuffix(prefix, ".registryd.io"):
				t.Fatalf("host %q: label key %q is not under a provider's prefix", h.ExternalID, k)
			case v == "":
				t.Fatalf("host %q: label %q is empty; it should have been left out", h.ExternalID, k)
			case registry.CheckLabelValue(v) != "":
				t.Fatalf("host %q: label %q=%q: its value %s", h.ExternalID, k, v, registry.CheckLabelValue(v))
			}
		}
		seen[h.ExternalID] = true
	}
	for _, sk := range inv.Skipped {
		if len(sk.ExternalID) > maxExternalID || len(sk.Name) > provider.MaxName || len(sk.Reason) > maxReason {
			t.Fatalf("skip %.40q… holds a string past its bound (id %d, name %d, reason %d bytes)",
				sk.ExternalID, len(sk.ExternalID), len(sk.Name), len(sk.Reason))
		}
	}
}

// maxExternalID is the longest external id a host may have: E2E's join a
// cluster's id and a worker's, which may be its name. A host without a
// name of its own is named by it.
const maxExternalID = provider.MaxID + 1 + provider.MaxName

// maxReason is the longest reason a skip may give: a sentence quoting a
// few bounded strings.
const maxReason = 2 * provider.MaxText

// CheckRedirectRefused starts an endpoint that redirects every request to
// another host, calls fetch with the endpoint's URL and fails t unless
// the fetch failed naming the other host, without secret in its error,
// and the other host heard nothing.
func CheckRedirectRefused(t *testing.T, status int, secret string, fetch func(endpoint string) error) {
	t.Helper()
	var heard atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		heard.Add(1)
	}))
	t.Cleanup(other.Close)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), status)
	}))
	t.Cleanup(endpoint.Close)
	err := fetch(endpoint.URL)
	if err == nil || heard.Load() != 0 {
		t.Fatalf("fetch: %v; the other host heard %d requests", err, heard.Load())
	}
	if msg := err.Error(); !strings.Contains(msg, "redirected to "+other.URL) || strings.Contains(msg, secret) {
		t.Errorf("error %q: want the other host named and no secret", msg)
	}
}

// CheckBound fails t unless a field bounded at limit bytes takes a value
// of limit bytes (fetch, given it, returns one host) and a value one byte
// longer has the field's outcome past: "fail" (the pass fails for reason),
// "skip" (host id is skipped for reason), or a label key (the host keeps
// no such label, or keeps it as fallback when that is set).
func CheckBound(t testing.TB, fetch func(value string) (provider.Inventory, error), limit int, past, reason, id, fallback string) {
	t.Helper()
	inv, err := fetch(strings.Repeat("x", limit))
	if err != nil || len(inv.Hosts) != 1 {
		t.Fatalf("a value of %d bytes, at the bound: %+v, %v; want the host", limit, inv, err)
	}
	inv, err = fetch(strings.Repeat("x", limit+1))
	switch past {
	case "fail":
		if err == nil || !strings.Contains(err.Error(), reason) || !strings.Contains(err.Error(), "not applied") {
			t.Errorf("past the bound: %+v, %v; want the pass failed for %q", inv, err, reason)
		}
	case "skip":
		if err != nil || len(inv.Hosts) != 0 || len(inv.Skipped) != 1 || !strings.Contains(inv.Skipped[0].Reason, reason) ||
			inv.Skipped[0].ExternalID != id {
			t.Errorf("past the bound: %+v, %v; want %s skipped for %q", inv, err, id, reason)
		}
	default:
		if err != nil || len(inv.Hosts) != 1 {
			t.Fatalf("past the bound: %+v, %v; want the host", inv, err)
		}
		if v, ok := inv.Hosts[0].Labels[past]; ok && (fallback == "" || v != fallback) {
			t.Errorf("past the bound: label %s=%q, want it left out", past, v)
		}
	}
}
