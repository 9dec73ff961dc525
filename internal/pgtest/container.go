package pgtest

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// startContainer starts PostgreSQL in a container when a Docker engine
// answers. ok is false, with no error, when there is no engine: the caller
// then falls back to a local cluster.
func startContainer(ctx context.Context) (url string, ok bool, err error) {
	probeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(probeCtx)
	if err != nil {
		return "", false, nil // no engine here
	}
	cli.Close()

	ctr, err := testcontainers.Run(ctx, "postgres:15-alpine",
		testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": "test", "POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithCmdArgs("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=300"),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(2*time.Minute)),
	)
	if err != nil {
		return "", false, fmt.Errorf("start PostgreSQL container: %w", err)
	}
	stopFns = append(stopFns, func() { _ = testcontainers.TerminateContainer(ctr) })
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", false, err
	}
	port, err := ctr.MappedPort(ctx, "5432/tcp")
	if err != nil {
		return "", false, err
	}
	return fmt.Sprintf("postgres://postgres:test@%s/postgres?sslmode=disable", net.JoinHostPort(host, port.Port())), true, nil
}
