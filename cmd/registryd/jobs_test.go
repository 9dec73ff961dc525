package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
)

// post sends a JSON POST with the given headers on client c and returns
// the status and body; err is a transport failure (a timeout).
func post(ctx context.Context, c *http.Client, url, token, body string, headers ...string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func schedulerToken(t *testing.T, sub string) string {
	t.Helper()
	tok, err := auth.Signer{Secret: []byte(testSecret)}.Sign(sub, registry.RoleScheduler, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// heldBy counts the nodes job holds (0: any job), read from the
// database.
func heldBy(t *testing.T, db string, job int64) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		`SELECT count(*) FROM nodes WHERE current_job = $1 OR $1 = 0 AND current_job IS NOT NULL`, job).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Two `registryd serve` replicas on one database, schedulers as outside
// programs would be:
//   - team-b's claim, renewal and release of team-a's job, on the other
//     replica, are 403 job_owned_by_other;
//   - a claim sent with one Idempotency-Key to each replica holds what the
//     first took, and so do two sent at once, one to each;
//   - 1,000 claims abandoned by their caller after 0.2 to 3 ms, each
//     followed by a release of its job on the other replica, leave no node
//     held.
//
// Fault caught (tried once): the release without the lock of the job's
// row (abandoned claims left nodes held).
func TestServeJobsAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	urls, admin := replicas(t, db, 2)
	a, b := urls[0], urls[1]
	for i := range 16 {
		createNode(t, a, admin, fmt.Sprintf("10.23.0.%d", i/8+1), i%8)
	}
	teamA, teamB := schedulerToken(t, "team-a"), schedulerToken(t, "team-b")
	ctx := t.Context()
	hc := &http.Client{Timeout: 10 * time.Second}
	must := func(base, token, path, body string, want int, headers ...string) string {
		t.Helper()
		code, got, err := post(ctx, hc, base+path, token, body, headers...)
		if err != nil || code != want {
			t.Fatalf("POST %s%s %s: %d %s %v; want %d", base, path, body, code, got, err, want)
		}
		return got
	}

	// Ownership, across replicas.
	must(a, teamA, "/v1/nodes/claim", `{"job":1,"count":2}`, 200)
	for _, c := range []struct{ path, body string }{
		{"/v1/nodes/claim", `{"job":1}`}, {"/v1/nodes/renew", `{"job":1,"lease_seconds":60}`}, {"/v1/nodes/release", `{"job":1}`},
	} {
		if got := must(b, teamB, c.path, c.body, 403); !strings.Contains(got, `"code":"job_owned_by_other"`) {
			t.Errorf("team-b's %s on the other replica: %s", c.path, got)
		}
	}
	if n := heldBy(t, db, 1); n != 2 {
		t.Errorf("job 1 holds %d nodes after team-b's tries, want 2", n)
	}

	// One key, one claim: to each replica in turn, then to both at once.
	first := must(a, teamA, "/v1/nodes/claim", `{"job":2,"count":2}`, 200, "Idempotency-Key", "job-2")
	if again := must(b, teamA, "/v1/nodes/claim", `{"job":2,"count":2}`, 200, "Idempotency-Key", "job-2"); again != first {
		t.Errorf("the retry on the other replica answered\n%s\nwant the first answer\n%s", again, first)
	}
	var wg sync.WaitGroup
	answers := make([]string, 2)
	for i, base := range urls {
		wg.Go(func() {
			_, answers[i], _ = post(ctx, hc, base+"/v1/nodes/claim", teamA, `{"job":3,"count":2}`, "Idempotency-Key", "job-3")
		})
	}
	wg.Wait()
	if answers[0] != answers[1] || !strings.Contains(answers[0], `"job":3`) {
		t.Errorf("one key sent to both replicas at once: %s and %s", answers[0], answers[1])
	}
	if n2, n3 := heldBy(t, db, 2), heldBy(t, db, 3); n2 != 2 || n3 != 2 {
		t.Errorf("jobs 2 and 3 hold %d and %d nodes, want 2 each", n2, n3)
	}
	must(a, admin, "/v1/nodes/release", `{"job":1}`, 200)
	must(a, teamA, "/v1/nodes/release", `{"job":2}`, 200)
	must(b, teamA, "/v1/nodes/release", `{"job":3}`, 200)

	// Abandoned claims, released on the other replica.
	abandoned := 0
	for i := range 1000 {
		job := int64(100 + i)
		claimOn, releaseOn := urls[i%2], urls[1-i%2]
		giveUp := time.Duration(200+rand.IntN(2800)) * time.Microsecond
		cctx, cancel := context.WithTimeout(ctx, giveUp)
		if _, _, err := post(cctx, hc, claimOn+"/v1/nodes/claim", teamA, fmt.Sprintf(`{"job":%d,"count":1}`, job)); err != nil {
			abandoned++
		}
		cancel()
		must(releaseOn, teamA, "/v1/nodes/release", fmt.Sprintf(`{"job":%d}`, job), 200)
	}
	t.Logf("%d of 1000 claims abandoned before their answer", abandoned)
	if abandoned < 100 {
		t.Errorf("only %d claims abandoned: the test did not test it", abandoned)
	}
	if n := heldBy(t, db, 0); n != 0 {
		t.Errorf("%d nodes held after every job was released", n)
	}
}
