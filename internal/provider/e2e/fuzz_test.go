package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"github.com/registryd/registryd/internal/provider"
	"github.com/registryd/registryd/internal/provider/e2e"
	"github.com/registryd/registryd/internal/provider/providertest"
)

// FuzzFetch feeds an arbitrary answer to every page call through a real
// HTTP server and the client's real parsing. Whatever arrives, Fetch must
// end, must not panic, must not return part of an inventory with an error,
// and an inventory it accepts must keep provider.Host's promises.
func FuzzFetch(f *testing.F) {
	if seed, err := os.ReadFile("testdata/cluster_seed.json"); err == nil {
		f.Add(seed)
	}
	f.Add([]byte(`{"code":200,"data":[{"id":7,"name":"c","status":"Running","no_of_nodes":1,` +
		`"sku_details":{"specs":{"gpu":8,"memory":1024,"gpu_memory":640,"gpu_card_type":"H100"}},` +
		`"worker_nodes":[{"id":"w1","private_ip":"10.0.0.9","status":"Running"}]}],"errors":{},"message":"Success"}`))
	f.Add([]byte(`{"code":200,"data":[{"id":"x","sku_details":{"specs":{"gpu":"2","memory":"8","gpu_memory":"48","gpu_card_type":"L4"}},"worker_nodes":[{"name":"a","ip":"::ffff:10.1.1.1"},7,null]}]}`))
	f.Add([]byte(`{"code":200,"data":[{"id":8,"name":"훈련 / run (v2)","status":"Running","sku_details":{"specs":{"name":"GDC3 8×H100","gpu":8,` +
		`"memory":1024,"gpu_memory":640,"gpu_card_type":"H100"},"plan":{"location":" Delhi NCR "}},"worker_nodes":[{"id":1,"private_ip":"10.0.0.1"}]}]}`))
	f.Add([]byte(`{"code":500,"data":null,"errors":"boom","message":"bad"}`))
	f.Add([]byte(`{"code":200,"data":[]}`))

	// One server for the whole run: each input only swaps the answer.
	var mu sync.Mutex
	var answer []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		body := answer
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	f.Cleanup(srv.Close)
	c, err := e2e.New(e2e.Config{Endpoint: srv.URL, APIKey: "k", Token: "t", ProjectID: "1", Location: "Delhi",
		PerPage: 2, Retry: provider.Retry{Attempts: 1}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mu.Lock()
		answer = body
		mu.Unlock()
		inv, err := c.Fetch(context.Background())
		providertest.CheckFetch(t, inv, err)
	})
}
