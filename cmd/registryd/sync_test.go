package main

import (
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/provider/e2e/e2etest"
	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

func fakeSCP(t *testing.T) *scptest.Server {
	s := scptest.New(t)
	s.Products = []scptest.Product{{ID: "p", Name: "s8h100_metal", Description: "CPU 96 | Memory 2048GB | H100(80GB)*8 | Disk 960GB",
		GPUModel: "H100", MemoryValue: "2048", CPUValue: "96"}}
	s.Nodes = []scptest.Node{
		{ID: "n1", Name: "gpu-1", PolicyIP: "10.30.0.1", ServerType: "s8h100_metal", State: "RUNNING"},
		{ID: "n2", Name: "gpu-2", PolicyIP: "", ServerType: "s8h100_metal", State: "RUNNING"},
	}
	return s
}

func syncEnv(t *testing.T, scp *scptest.Server, e2e *e2etest.Server) map[string]string {
	env := map[string]string{
		"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_MIGRATE": "true", "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_SCP_ENDPOINT": scp.URL, "REGISTRY_SCP_ACCESS_KEY": scptest.AccessKey,
		"REGISTRY_SCP_SECRET_KEY": scptest.SecretKey, "REGISTRY_SCP_ACCOUNT_ID": scptest.AccountID,
	}
	if e2e != nil {
		env["REGISTRY_E2E_ENDPOINT"] = e2e.URL
		env["REGISTRY_E2E_API_KEY"] = e2etest.TestAPIKey
		env["REGISTRY_E2E_TOKEN"] = e2etest.TestToken
		env["REGISTRY_E2E_PROJECT_ID"] = e2etest.TestProjectID
		env["REGISTRY_E2E_LOCATION"] = e2etest.TestLocation
	}
	return env
}

func TestSyncOnce(t *testing.T) {
	t.Parallel()
	scp, e2e := fakeSCP(t), e2etest.New(t)
	e2e.Clusters = []e2etest.Cluster{{ID: 1, Name: "c", Status: "Running", CPU: 8, GPU: 0, MemoryGB: 32,
		Workers: []e2etest.Worker{{ID: 1, Name: "w", PrivateIP: "10.31.0.1", Status: "Running"}}}}
	env := syncEnv(t, scp, e2e)
	out, _, err := runCmd(t, env, "sync", "--once")
	if err != nil {
		t.Fatalf("sync --once: %v\n%s", err, out)
	}
	for _, want := range []string{"scp: 2 hosts seen → 8 nodes: 8 added", "gpu-2: no policy_ip", "e2e: 1 hosts seen → 1 nodes: 1 added", "hardware generations created: H100"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	// A provider failure: non-zero exit, its summary says why, the other applies.
	e2e.Lock()
	e2e.Token = "revoked"
	e2e.Unlock()
	out, _, err = runCmd(t, env, "sync", "--once")
	if err == nil || !strings.Contains(out, "e2e: FAILED, nothing changed") || !strings.Contains(out, "scp: 2 hosts seen → 8 nodes: 0 added, 0 updated, 8 unchanged") {
		t.Errorf("failing provider: %v\n%s", err, out)
	}
	if strings.Contains(out, e2etest.TestAPIKey) || strings.Contains(out, e2etest.TestToken) {
		t.Errorf("the summary leaks a credential:\n%s", out)
	}
}

func TestSyncConfigErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"REGISTRY_SCP_ENDPOINT": "https://x"}, "REGISTRY_SCP_ACCESS_KEY, REGISTRY_SCP_SECRET_KEY are not set"},
		{map[string]string{"REGISTRY_E2E_ENDPOINT": "https://x", "REGISTRY_E2E_API_KEY": "k"}, "REGISTRY_E2E_LOCATION, REGISTRY_E2E_PROJECT_ID, REGISTRY_E2E_TOKEN are not set"},
		{map[string]string{"REGISTRY_SYNC_TIMEOUT": "often"}, "REGISTRY_SYNC_TIMEOUT"}, // sync --once reads no REGISTRY_SYNC_INTERVAL
		{map[string]string{"REGISTRY_SCP_GPU_TABLE": "H100=lots"}, "REGISTRY_SCP_GPU_TABLE"},
		{map[string]string{"REGISTRY_SYNC_MAX_REMOVAL": "0"}, `REGISTRY_SYNC_MAX_REMOVAL="0": want a percentage between 1 and 100`},
		{map[string]string{"REGISTRY_SYNC_MAX_REMOVAL": "10%"}, "REGISTRY_SYNC_MAX_REMOVAL"},
		{map[string]string{"REGISTRY_SYNC_REMOVAL_PASSES": "101"}, "REGISTRY_SYNC_REMOVAL_PASSES"},
		{map[string]string{"REGISTRY_SYNC_MAX_READ_MIB": "lots"}, "REGISTRY_SYNC_MAX_READ_MIB"},
		{map[string]string{"REGISTRY_SCP_SECRET_KEY": "a", "REGISTRY_SCP_SECRET_KEY_FILE": "/nonexistent"}, "not both"},
		{map[string]string{"REGISTRY_DATABASE_URL": db, "REGISTRY_MIGRATE": "true", "REGISTRY_JWT_SECRET": testSecret}, "no provider is configured"},
	} {
		_, _, err := runCmd(t, tc.env, "sync", "--once")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want it to say %q", tc.env, err, tc.want)
		}
	}
	if _, _, err := runCmd(t, map[string]string{}, "sync"); err == nil {
		t.Error("sync without --once succeeded")
	}
}

// serve imports on its own when a provider is configured.
func TestServeSyncLoop(t *testing.T) {
	t.Parallel()
	scp := fakeSCP(t)
	env := syncEnv(t, scp, nil)
	env["REGISTRY_SYNC_INTERVAL"] = "1s"
	srv := startServer(t, env)
	tok := adminToken(t, env)
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := call(t, "POST", srv.url+"/v1/nodes/list", `{"source":"scp"}`, tok)
		if code == 200 && strings.Count(body, `"source":"scp"`) == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no import within 20s: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The next pass picks up a change at the provider.
	scp.Lock()
	scp.Nodes[0].State = "STOPPED"
	scp.Unlock()
	for {
		_, body := call(t, "POST", srv.url+"/v1/nodes/list", `{"source":"scp","free":true}`, tok)
		if body == "[]\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stopped host still schedulable: %s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
