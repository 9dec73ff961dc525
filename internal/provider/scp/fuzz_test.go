package scp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/providertest"
	"github.com/registryd/registryd/internal/provider/scp"
)

// FuzzFetch feeds arbitrary answers to the two calls of a pass (products,
// then every page of GPU nodes) through a real HTTP server and the
// client's real parsing. Whatever arrives, Fetch must end, must not panic,
// must not return part of an inventory with an error, and an inventory it
// accepts must keep provider.Host's promises.
func FuzzFetch(f *testing.F) {
	f.Add([]byte(`{"products":[{"id":"p1","name":"H100x8","description":"H100(80GB)*8","product_attrs":{"gpu_model":"H100","memory_value":"2048GB"}}]}`),
		[]byte(`{"count":1,"gpu_nodes":[{"id":"n1","gpu_node_name":"gpu-1","policy_ip":"10.0.0.1","server_type":"H100x8","product_type_id":"p1","state":"RUNNING"}]}`))
	f.Add([]byte(`{"products":[{"id":"p1","name":"H100x8","description":"H100(80GB)*8","product_attrs":{"gpu_model":"H100","memory_value":"2048GB"}}]}`),
		[]byte(`{"count":1,"gpu_nodes":[{"id":"n1","policy_ip":"10.0.0.1","product_type_id":"p1","state":"RUNNING",`+
			`"cluster_fabric_id":" f\u00e91 ","cluster_fabric_name":"클러스터 A/1","node_pool_id":7,"region_id":"-kr west1-"}]}`))
	f.Add([]byte(`{"products":[]}`), []byte(`{"count":null,"gpu_nodes":[]}`))
	f.Add([]byte(`{"products":[{"id":"p","product_attrs":{"gpu_model":"NONE","memory_value":"64"}}]}`),
		[]byte(`{"count":2,"gpu_nodes":[{"id":"a","policy_ip":"::1","product_type_id":"p"},{"id":"a","policy_ip":"::1","product_type_id":"p"}]}`))
	f.Add([]byte(`{"errors":[{"detail":"nope"}]}`), []byte(`null`))

	// One server for the whole run: each input only swaps the answers.
	var mu sync.Mutex
	var products, nodes []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		body := nodes
		if r.URL.Path == "/v1/gpu-nodes/products" {
			body = products
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	f.Cleanup(srv.Close)
	c, err := scp.New(scp.Config{Endpoint: srv.URL, AccessKey: "ak", SecretKey: "sk",
		PageSize: 2, Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, productsBody, nodesBody []byte) {
		mu.Lock()
		products, nodes = productsBody, nodesBody
		mu.Unlock()
		inv, err := c.Fetch(context.Background())
		providertest.CheckFetch(t, inv, err)
	})
}

// A node without an id cannot be found again by later passes: it is
// skipped with a reason, and two of them do not fail the pass as a
// repeated id would. (Found by FuzzFetch.)
func TestNodeWithoutIDIsSkipped(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gpu-nodes/products" {
			w.Write([]byte(`{"products":[{"id":"p1","name":"H100x8","description":"H100(80GB)*8","product_attrs":{"gpu_model":"H100","memory_value":"2048GB"}}]}`))
			return
		}
		w.Write([]byte(`{"count":3,"gpu_nodes":[{"policy_ip":"10.0.0.1","product_type_id":"p1"},` +
			`{"id":" ","policy_ip":"10.0.0.2","product_type_id":"p1"},{"id":"n3","policy_ip":"10.0.0.3","product_type_id":"p1"}]}`))
	}))
	defer srv.Close()
	c, err := scp.New(scp.Config{Endpoint: srv.URL, AccessKey: "ak", SecretKey: "sk", Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Hosts) != 1 || inv.Hosts[0].ExternalID != "n3" {
		t.Errorf("hosts = %+v, want only n3", inv.Hosts)
	}
	if len(inv.Skipped) != 2 || inv.Skipped[0].Reason != "no id" || inv.Skipped[1].Reason != "no id" {
		t.Errorf("skipped = %+v, want two without id", inv.Skipped)
	}
}

// A server that answers every page with the same full page of id-less
// nodes and no count cannot be paged: the pass fails at once instead of
// paging up to the node limit (38 s here before). (Found by FuzzFetch.)
func TestFullPagesWithoutIDsOrCountFail(t *testing.T) {
	t.Parallel()
	var pages atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gpu-nodes/products" {
			w.Write([]byte(`{"products":[]}`))
			return
		}
		pages.Add(1)
		w.Write([]byte(`{"gpu_nodes":[{"policy_ip":"10.0.0.1"},{"policy_ip":"10.0.0.2"}]}`))
	}))
	defer srv.Close()
	c, err := scp.New(scp.Config{Endpoint: srv.URL, AccessKey: "ak", SecretKey: "sk", PageSize: 2, Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Fetch(ctx); err == nil || !strings.Contains(err.Error(), "without an id and no count") {
		t.Fatalf("Fetch = %v, want the pass refused", err)
	}
	if n := pages.Load(); n != 1 {
		t.Errorf("%d pages read, want 1", n)
	}
}
