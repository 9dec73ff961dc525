package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/pgtest"
)

// The backup story of docs/operating.md, round trip: pg_dump of a serving
// registry's database, pg_restore into a fresh one, and registryd started
// on the copy (no migration needed) serves the same nodes, byte for byte,
// and goes on numbering new ones after the restored ones.
func TestBackupRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	bin, err := pglocal.FindBinDir()
	if err != nil {
		t.Skipf("no PostgreSQL client binaries: %v", err)
	}
	src, dst := pgtest.New(t), pgtest.NewEmpty(t)
	env := map[string]string{"REGISTRY_DATABASE_URL": src, "REGISTRY_JWT_SECRET": testSecret}
	tok := adminToken(t, env)
	srv := startServer(t, env)
	for _, body := range []string{
		`{"ip":"10.9.0.1","index":0,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`,
		`{"ip":"10.9.0.1","index":1,"cpu_mem":1024,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`,
		`{"ip":"10.9.0.2","index":0,"cpu_mem":2048,"driver_version":"535","hardware_generation":null,"gpu_mem":null}`,
	} {
		if code, resp := call(t, "POST", srv.url+"/v1/nodes/create", body, tok); code != 201 {
			t.Fatalf("create %d %s", code, resp)
		}
	}
	code, before := call(t, "POST", srv.url+"/v1/nodes/list", "", tok)
	if code != 200 {
		t.Fatalf("list %d %s", code, before)
	}

	// While it serves: pg_dump takes a consistent snapshot.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dump := filepath.Join(t.TempDir(), "registry.dump")
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_dump"), "--format=custom", "--file="+dump, "--dbname="+src).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_restore"), "--no-owner", "--exit-on-error", "--dbname="+dst, dump).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}

	env = map[string]string{"REGISTRY_DATABASE_URL": dst, "REGISTRY_JWT_SECRET": testSecret}
	restored := startServer(t, env)
	code, after := call(t, "POST", restored.url+"/v1/nodes/list", "", tok)
	if code != 200 || after != before {
		t.Fatalf("the restored registry lists %d:\n%s\nthe original listed:\n%s", code, after, before)
	}
	var nodes []struct{ PK int64 }
	if err := json.Unmarshal([]byte(before), &nodes); err != nil || len(nodes) != 3 {
		t.Fatalf("nodes %s: %v", before, err)
	}
	code, body := call(t, "POST", restored.url+"/v1/nodes/create",
		`{"ip":"10.9.0.3","index":0,"cpu_mem":1,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, tok)
	var created struct{ PK int64 }
	if code != 201 || json.Unmarshal([]byte(body), &created) != nil || created.PK <= nodes[2].PK {
		t.Errorf("a node created after the restore: %d %s (the last restored pk is %d)", code, body, nodes[2].PK)
	}
	if code, body := call(t, "GET", restored.url+"/readyz", ""); code != 200 || !strings.Contains(body, "ready") {
		t.Errorf("readyz on the restored database: %d %s", code, body)
	}
}
