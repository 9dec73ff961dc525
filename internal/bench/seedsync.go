package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/registryd/registryd/internal/provider/scp/scptest"
)

// SeedSync imports the fleet from a fake Samsung SDS Cloud through the
// product's own `registryd sync --once`, while the server runs, and
// measures the server as it is right after the import: the way a fleet
// of imported hosts arrives.
const SeedSync = "sync"

// syncProduct is the fake's one product: 8 H100s a host.
var syncProduct = scptest.Product{ID: "bench-h100x8", Name: "s8h100_metal",
	Description: "CPU 96 | Memory 2048GB | H100(80GB)*8 | Disk 960GB", GPUModel: "H100", MemoryValue: "2048", CPUValue: "96"}

// seedSync fills an empty registry with n nodes (n/8 hosts, rounded up)
// by running bin sync --once against dbURL and a fake SCP API that serves
// the hosts in fabrics of hostsPerFabric (250 fabrics at 1,000,000 nodes)
// at the same addresses as seed. It returns the fleet and the pass's own
// time (the sync command's wall time). work holds sync.log.
func seedSync(ctx context.Context, bin, dbURL string, pool *pgxpool.Pool, n int, work string) (*fleet, time.Duration, error) {
	if bin == "" {
		return nil, 0, fmt.Errorf("bench: -seed %s runs registryd sync --once: it needs the registryd binary", SeedSync)
	}
	if err := checkEmpty(ctx, pool); err != nil {
		return nil, 0, err
	}
	hosts := (n + 7) / 8
	fake := scptest.Start()
	defer fake.Close()
	fake.Lock()
	fake.Products = []scptest.Product{syncProduct}
	fake.HostsPerFabric = hostsPerFabric
	fake.Nodes = make([]scptest.Node, hosts)
	for h := range hosts {
		v := (h/250)*256 + h%250 + 1 // seed's addresses
		fake.Nodes[h] = scptest.Node{ID: fmt.Sprintf("bench-%07d", h), Name: fmt.Sprintf("gpu-%07d", h),
			PolicyIP: fmt.Sprintf("10.%d.%d.%d", v>>16&255, v>>8&255, v&255), ServerType: syncProduct.Name, State: "RUNNING"}
	}
	fake.Unlock()

	logPath := filepath.Join(work, "sync.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: seed: %w", err)
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, bin, "sync", "--once")
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Env = append(cmd.Env,
		"REGISTRY_DATABASE_URL="+dbURL,
		"REGISTRY_SCP_ENDPOINT="+fake.URL,
		"REGISTRY_SCP_ACCESS_KEY="+scptest.AccessKey,
		"REGISTRY_SCP_SECRET_KEY="+scptest.SecretKey,
		"REGISTRY_SCP_ACCOUNT_ID="+scptest.AccountID,
		"REGISTRY_SYNC_TIMEOUT=30m",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if err != nil {
		tail, _ := os.ReadFile(logPath)
		return nil, took, fmt.Errorf("bench: seed: registryd sync --once: %w; its log (%s) ends: %s", err, logPath, lastLines(string(tail), 10))
	}
	f, err := fleetOf(ctx, pool, hosts*8)
	if err != nil {
		return nil, took, err
	}
	if f.count != int64(hosts*8) {
		return nil, took, fmt.Errorf("bench: seed: the import left %d nodes, want %d", f.count, hosts*8)
	}
	f.seeded = took
	return f, took, nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
