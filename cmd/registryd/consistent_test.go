package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// Two `registryd serve` replicas with node caches on one database: 1,000
// pairs of a write acknowledged by A and a read on B right after (a GET, a
// list page, a Node-Id check) never show B's past.
func TestServeConsistentReadsAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_JWT_SECRET": testSecret, "REGISTRY_NODE_CACHE": "1000"}
	a, b := startServer(t, env), startServer(t, env)
	out, stderr, err := runCmd(t, env, "token", "--sub", "agent-consistent", "--role", "agent")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	agent := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	client := apitest.Client(t)
	do := func(method, url, body string, headers ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+agent)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got)
	}
	create := func(ip string) int64 {
		t.Helper()
		code, body := do("POST", a.url+"/v1/nodes/create",
			`{"ip":"`+ip+`","index":0,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`)
		var n struct{ PK int64 }
		if code != 201 || json.Unmarshal([]byte(body), &n) != nil {
			t.Fatalf("create on A: %d %s", code, body)
		}
		return n.PK
	}
	const nodes = 8
	pks := make([]int64, nodes)
	for i := range pks {
		pks[i] = create(fmt.Sprintf("10.6.0.%d", i+1))
	}
	stale := 0
	for i := range 1000 {
		k := i % nodes
		ip := fmt.Sprintf("10.6.0.%d", k+1)
		want := fmt.Sprintf("v%d", i)
		switch i % 3 {
		case 0, 1: // PATCH on A; GET (0) or a list page (1) on B
			if code, body := do("PATCH", fmt.Sprintf("%s/v1/nodes/%d", a.url, pks[k]), `{"driver_version":"`+want+`"}`, "Node-Id", strconv.FormatInt(pks[k], 10)); code != 200 {
				t.Fatalf("patch on A: %d %s", code, body)
			}
			var got string
			if i%3 == 0 {
				code, body := do("GET", fmt.Sprintf("%s/v1/nodes/%d", b.url, pks[k]), "")
				var n struct {
					DriverVersion string `json:"driver_version"`
				}
				if code != 200 || json.Unmarshal([]byte(body), &n) != nil {
					t.Fatalf("get on B: %d %s", code, body)
				}
				got = n.DriverVersion
			} else {
				code, body := do("POST", b.url+"/v1/nodes/list", `{"limit":100}`)
				var page []struct {
					PK            int64
					DriverVersion string `json:"driver_version"`
				}
				if code != 200 || json.Unmarshal([]byte(body), &page) != nil {
					t.Fatalf("list on B: %d %s", code, body)
				}
				for _, n := range page {
					if n.PK == pks[k] {
						got = n.DriverVersion
					}
				}
			}
			if got != want {
				stale++
			}
		case 2: // DELETE on A, Node-Id on B refused; re-create on A, Node-Id on B let in
			if code, body := do("DELETE", fmt.Sprintf("%s/v1/nodes/%d", a.url, pks[k]), "", "Node-Id", strconv.FormatInt(pks[k], 10)); code != 204 {
				t.Fatalf("delete on A: %d %s", code, body)
			}
			if code, _ := do("GET", b.url+"/v1/nodes/ping", "", "Node-Id", strconv.FormatInt(pks[k], 10)); code != 403 {
				stale++
			}
			pks[k] = create(ip)
			if code, _ := do("GET", b.url+"/v1/nodes/ping", "", "Node-Id", strconv.FormatInt(pks[k], 10)); code != 200 {
				stale++
			}
		}
	}
	if stale > 0 {
		t.Fatalf("%d stale answers on B in 1,000 write-on-A / read-on-B pairs", stale)
	}
}
