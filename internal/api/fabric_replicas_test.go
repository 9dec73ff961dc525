package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	registryd "github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// Twelve schedulers claim fabric gangs (2 whole hosts of 4 in one fabric)
// through two registryd servers on one database until none fits: no gang
// is split across fabrics or hosts, no node is given twice, and the fleet
// (4 fabrics of 6 hosts: 12 gangs) is given out whole, what the
// concurrent claims left being taken by claims one at a time after.
func TestFabricGangsAcrossReplicas(t *testing.T) {
	b := setup(t)
	b.fabricHosts(4, 6, 6, 6, 6)
	verifier, err := auth.NewVerifier(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	var replicas []string
	for range 2 {
		st := pgtest.Open(t, b.dbURL, store.Options{MaxConns: 8})
		ts := httptest.NewServer(api.New(api.Config{Store: st, OpenAPI: registryd.OpenAPI, Auth: verifier}))
		t.Cleanup(ts.Close)
		replicas = append(replicas, ts.URL)
	}
	sched := tokenFor(t, "sched", registry.RoleScheduler)
	client := apitest.Client(t)
	var mu sync.Mutex
	owner := map[int64]int64{}
	gangs := 0
	claim := func(url string, job int64) (bool, error) {
		req, _ := http.NewRequest("POST", url+"/v1/nodes/claim", strings.NewReader(
			fmt.Sprintf(`{"job":%d,"count":8,"per_host":4,"same_fabric":true}`, job)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+sched)
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			var p struct{ Code string }
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Code != registry.CodeNoFabricFit {
				return false, fmt.Errorf("job %d: 409 %q, want no_fabric_fit", job, p.Code)
			}
			return false, nil
		}
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("job %d: status %d", job, resp.StatusCode)
		}
		var got claimAnswer
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			return false, err
		}
		perHost, fabrics := got.spread()
		mu.Lock()
		defer mu.Unlock()
		gangs++
		if len(got.Nodes) != 8 || len(perHost) != 2 || len(fabrics) != 1 {
			return true, fmt.Errorf("job %d took %v in fabrics %v", job, perHost, fabrics)
		}
		for ip, n := range perHost {
			if n != 4 {
				return true, fmt.Errorf("job %d took %d nodes of host %s", job, n, ip)
			}
		}
		for _, n := range got.Nodes {
			if prev, ok := owner[n.PK]; ok {
				return true, fmt.Errorf("node %d given to jobs %d and %d", n.PK, prev, job)
			}
			owner[n.PK] = job
		}
		return true, nil
	}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			for round := range 10 {
				ok, err := claim(replicas[(i+round)%2], int64(1000*(i+1)+round))
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
			}
		})
	}
	wg.Wait()
	for job := int64(900_000); ; job++ { // one at a time, what is left
		ok, err := claim(replicas[job%2], job)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	if gangs != 12 || len(owner) != 96 {
		t.Errorf("%d gangs of %d nodes given out; want the fleet's 12 gangs, 96 nodes", gangs, len(owner))
	}
	held := b.held()
	for pk, job := range owner {
		if held[pk] != job {
			t.Errorf("node %d: answered to job %d, the database says %d", pk, job, held[pk])
		}
	}
}
