package scp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/providertest"
	"github.com/registryd/registryd/internal/provider/scp"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

// Every string the client keeps from an answer has a bound, and a value one
// byte past it has the field's outcome: an id fails the pass, a name,
// address, state or product field skips the host (which keeps its nodes),
// a label's source leaves the label out. A value at the bound is taken.
func TestStringBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		limit int
		set   func(n *scptest.Node, p *scptest.Product, v string)
		// past says what a value past the bound does: "fail" the pass,
		// "skip" the host, or leave out the label of this key.
		past string
	}{
		{"id", provider.MaxID, func(n *scptest.Node, _ *scptest.Product, v string) { n.ID = v }, "fail"},
		{"gpu_node_name", provider.MaxName, func(n *scptest.Node, _ *scptest.Product, v string) { n.Name = v }, "skip"},
		{"policy_ip", provider.MaxAddress, func(n *scptest.Node, _ *scptest.Product, v string) { n.PolicyIP = v }, "skip"},
		{"state", provider.MaxWord, func(n *scptest.Node, _ *scptest.Product, v string) { n.State = v }, "skip"},
		{"server_type", provider.MaxName, func(n *scptest.Node, p *scptest.Product, v string) { n.ServerType, p.Name = v, v }, "skip"},
		{"product_type_id", provider.MaxID, func(n *scptest.Node, p *scptest.Product, v string) { n.ServerType, n.ProductTypeID, p.ID = "", v, v }, "skip"},
		{"cluster_fabric_id", provider.MaxFabric, func(n *scptest.Node, _ *scptest.Product, v string) { n.Topology.FabricID = v }, "skip"},
		{"its description", provider.MaxText, func(_ *scptest.Node, p *scptest.Product, v string) { p.Description = v }, "skip"},
		{"its gpu_model", provider.MaxGPUModel, func(_ *scptest.Node, p *scptest.Product, v string) { p.GPUModel = v }, "skip"},
		{"its memory_value", provider.MaxWord, func(_ *scptest.Node, p *scptest.Product, v string) {
			p.MemoryValue = strings.Repeat(" ", len(v)-4) + "2048"
		}, "skip"},
		{"region_id", provider.MaxName, func(n *scptest.Node, _ *scptest.Product, v string) { n.Topology.RegionID = v }, scp.LabelRegion},
		{"node_pool_id", provider.MaxName, func(n *scptest.Node, _ *scptest.Product, v string) { n.Topology.NodePoolID = v }, scp.LabelNodePool},
		{"cluster_fabric_name", provider.MaxName, func(n *scptest.Node, _ *scptest.Product, v string) { n.Topology.FabricName = v }, scp.LabelFabricName},
	} {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			fetch := func(v string) (provider.Inventory, error) {
				fake := scptest.New(t)
				n := scptest.Node{ID: "n1", Name: "gpu-1", PolicyIP: "10.0.0.1", ServerType: "h100_metal", State: "RUNNING",
					Topology: &scptest.Topology{FabricID: "f1", FabricName: "fabric-1", NodePoolID: "pool-1", RegionID: "kr-west1"}}
				p := scptest.Product{ID: "p1", Name: "h100_metal", Description: "H100(80GB)*8", GPUModel: "H100", MemoryValue: "2048"}
				tc.set(&n, &p, v)
				fake.Nodes, fake.Products = []scptest.Node{n}, []scptest.Product{p}
				c, err := scp.New(scp.Config{Endpoint: fake.URL, AccessKey: scptest.AccessKey, SecretKey: scptest.SecretKey,
					AccountID: scptest.AccountID, Retry: provider.Retry{Attempts: 1}})
				if err != nil {
					t.Fatal(err)
				}
				inv, err := c.Fetch(context.Background())
				providertest.CheckFetch(t, inv, err)
				return inv, err
			}
			providertest.CheckBound(t, fetch, tc.limit, tc.past, provider.TooLong(tc.field, tc.limit), "n1", "")
		})
	}
}

// A skipped host's name is in its skip only within its bound: a summary
// never prints a provider's megabytes.
func TestLongNameNotKept(t *testing.T) {
	t.Parallel()
	fake := scptest.New(t)
	fake.Products = []scptest.Product{{ID: "p1", Name: "h100_metal", Description: "H100(80GB)*8", GPUModel: "H100", MemoryValue: "2048"}}
	fake.Nodes = []scptest.Node{{ID: "n1", Name: strings.Repeat("n", 1<<20), PolicyIP: "10.0.0.1", ServerType: "h100_metal", State: "RUNNING"}}
	c, err := scp.New(scp.Config{Endpoint: fake.URL, AccessKey: scptest.AccessKey, SecretKey: scptest.SecretKey,
		AccountID: scptest.AccountID, Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Fetch(context.Background())
	if err != nil || len(inv.Skipped) != 1 || inv.Skipped[0].Name != "" || inv.Skipped[0].ExternalID != "n1" {
		t.Fatalf("%+v, %v; want n1 skipped, without its name", inv.Skipped, err)
	}
}
