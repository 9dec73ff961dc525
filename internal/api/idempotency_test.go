package api_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/registry"
)

func problemCode(t *testing.T, r response) string {
	t.Helper()
	var p struct{ Code string }
	r.json(t, &p)
	return p.Code
}

// A claim sent again with its Idempotency-Key gets the first answer, byte
// for byte, marked Idempotent-Replayed, and holds what the first took; the
// key with another body is a 422; another principal's same key is its
// own; a malformed key is a 400. Faults caught (each tried once): no
// replay (the second claim took 2 more nodes); the fingerprint not
// compared (the other body replayed the first answer).
func TestIdempotentClaim(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	b.hosts(hw, 8)
	claim := `{"job":5,"count":2}`
	first := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", claim, "Idempotency-Key", "claim-5-a"))
	again := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", claim, "Idempotency-Key", "claim-5-a"))
	if !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" || first.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the retry: replayed %q, body\n%s\nwant the first's\n%s", again.header.Get("Idempotent-Replayed"), again.body, first.body)
	}
	if held := b.held(); len(held) != 2 {
		t.Errorf("held after a claim and its retry: %v, want 2 nodes", held)
	}
	r := b.must(http.StatusUnprocessableEntity, b.do("POST", "/v1/nodes/claim", `{"job":5,"count":3}`, "Idempotency-Key", "claim-5-a"))
	if code := problemCode(t, r); code != "idempotency_key_reused" {
		t.Errorf("the key with another body: code %q", code)
	}
	r = b.must(http.StatusUnprocessableEntity, b.do("POST", "/v1/nodes/release", claim, "Idempotency-Key", "claim-5-a"))
	if code := problemCode(t, r); code != "idempotency_key_reused" {
		t.Errorf("the key on another path: code %q", code)
	}
	other := "Bearer " + tokenFor(t, "team-b", registry.RoleScheduler)
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":6,"count":1}`, "Idempotency-Key", "claim-5-a", "Authorization", other))
	if held := b.held(); len(held) != 3 {
		t.Errorf("held after another principal's claim with the same key: %v, want 3 nodes", held)
	}
	// An error answer is kept too: the retry does not claim what came free.
	short := b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", `{"job":7,"count":6}`, "Idempotency-Key", "k7"))
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", `{"job":5}`))
	if again := b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", `{"job":7,"count":6}`, "Idempotency-Key", "k7")); !bytes.Equal(again.body, short.body) {
		t.Errorf("the retry of a 409: %s, want the first's %s", again.body, short.body)
	}
	for _, key := range []string{strings.Repeat("k", 256), "two words", "naïve"} {
		b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/claim", claim, "Idempotency-Key", key))
	}
}

// A retry that arrives while the first request with its key still runs
// waits for it and gets its answer; the job is claimed once. The first is
// held on the job's row, locked by the test. Fault caught (tried once):
// no wait for a running request (the retry answered at once, or ran
// too).
func TestIdempotentRetryWaitsForTheFirst(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	b.hosts(hw, 8)
	ctx := context.Background()
	tx := b.insertingJob(9)
	answers := make(chan response, 2)
	go func() {
		answers <- b.doAsync("POST", "/v1/nodes/claim", `{"job":9,"count":2}`, "Idempotency-Key", "job-9")
	}()
	b.waitForLockWait()
	go func() {
		answers <- b.doAsync("POST", "/v1/nodes/claim", `{"job":9,"count":2}`, "Idempotency-Key", "job-9")
	}()
	select {
	case r := <-answers:
		t.Fatalf("answered (%d %s) while the first claim waits", r.status, r.body)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var got []response
	for range 2 {
		select {
		case r := <-answers:
			got = append(got, r)
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10 s of the lock being let go")
		}
	}
	if got[0].status != http.StatusOK || !bytes.Equal(got[0].body, got[1].body) {
		t.Errorf("answers %d %s and %d %s, want one 200 twice", got[0].status, got[0].body, got[1].status, got[1].body)
	}
	if held := b.held(); len(held) != 2 {
		t.Errorf("held: %v, want the first claim's 2 nodes", held)
	}
}

// A claim sent with a key whose client leaves before it commits is taken
// back, and its retry claims once: what the retry answers is held, and
// nothing more. The claim is held on the job's row, locked by the test,
// while its client goes.
func TestIdempotentClaimOutlivesItsClient(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	b.hosts(hw, 8)
	ctx := context.Background()
	tx := b.insertingJob(12)
	cctx, leave := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(cctx, "POST", b.url+"/v1/nodes/claim", strings.NewReader(`{"job":12,"count":2}`))
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "job-12")
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	b.waitForLockWait()
	leave()
	if err := <-gone; err == nil {
		t.Fatal("the client that left got an answer")
	}
	time.Sleep(100 * time.Millisecond) // the server sees the client go
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var got struct{ Nodes []struct{ PK int64 } }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":12,"count":2}`, "Idempotency-Key", "job-12")).json(t, &got)
	if held := b.held(); len(got.Nodes) != 2 || len(held) != 2 {
		t.Errorf("the retry got %v, %d nodes held; want the first claim's 2", got.Nodes, len(held))
	}
}

// insertingJob begins a transaction that inserts job's row and leaves it
// open (rolled back when the test ends): every claim of the job waits for
// it.
func (b *bundle) insertingJob(job int64) pgx.Tx {
	b.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (job, owner) VALUES ($1, NULL)`, job); err != nil {
		b.t.Fatal(err)
	}
	return tx
}

// A key whose runner was lost (its replica died: the record stays
// running past its lease, with no answer): when that request changed
// nothing the retry runs it; when it did, the retry gets a 409
// idempotent_answer_lost naming the nodes, and keeps getting it. The
// lost runners are records written as a dead replica leaves them.
func TestIdempotentLostRunner(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	b.hosts(hw, 8)
	// The fingerprint of the retry below, as the server computes it.
	first := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":11,"count":1}`, "Idempotency-Key", "probe"))
	var fp []byte
	if err := b.store.Pool().QueryRow(context.Background(),
		`SELECT fingerprint FROM idempotency_keys WHERE key = 'probe'`).Scan(&fp); err != nil {
		t.Fatal(err)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/release", `{"job":11}`))
	_ = first
	lose := func(key, requestID string) {
		b.exec(`INSERT INTO idempotency_keys (principal, key, fingerprint, request_id, running_until, keep_until)
			SELECT principal, $1, $2, $3, now() - interval '1 second', now() + interval '1 day' FROM idempotency_keys WHERE key = 'probe'`,
			key, fp, requestID)
	}
	// Nothing changed by the lost request: the retry runs.
	lose("lost-clean", "dead-replica-1")
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":11,"count":1}`, "Idempotency-Key", "lost-clean"))
	if held := b.held(); len(held) != 1 {
		t.Errorf("held after the retry of a lost request that changed nothing: %v, want 1", held)
	}
	// The lost request claimed (its audit entries carry its request id).
	var rid string
	if err := b.store.Pool().QueryRow(context.Background(),
		`SELECT request_id FROM audit_log WHERE action = 'node.claim' ORDER BY id DESC LIMIT 1`).Scan(&rid); err != nil {
		t.Fatal(err)
	}
	lose("lost-dirty", rid)
	for range 2 {
		r := b.must(http.StatusConflict, b.do("POST", "/v1/nodes/claim", `{"job":11,"count":1}`, "Idempotency-Key", "lost-dirty"))
		if code := problemCode(t, r); code != "idempotent_answer_lost" {
			t.Errorf("the retry of a lost request that claimed: code %q (%s)", code, r.body)
		}
	}
	if held := b.held(); len(held) != 1 {
		t.Errorf("held after the retries of a lost claim: %v, want 1", held)
	}
}

// A runner whose transaction is still committing when its key's lease
// runs out cannot commit after a retry took the key over: the retry's
// take-over and the runner's last statement (registryd_hold_key) are
// ordered on the key's row, so the job holds what one claim took, the
// runner answers 409 idempotency_key_taken_over and the retry 200. The
// runner is held in its records' round trip by a trigger. Fault caught
// (found by a review): no check in the runner's transaction (both
// claimed: 2 nodes for one key).
func TestIdempotentRunnerPastItsLease(t *testing.T) {
	b := setup(t, func(c *api.Config) { c.IdempotencyLease = 2 * time.Second })
	hw := b.createHardware("H100")
	b.hosts(hw, 8)
	b.exec(`CREATE SEQUENCE once`)
	b.exec(`CREATE FUNCTION slow_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF nextval('once') = 1 THEN PERFORM pg_sleep(3); END IF; RETURN NEW; END $$`)
	b.exec(`CREATE TRIGGER slow_once BEFORE INSERT ON audit_log FOR EACH ROW WHEN (NEW.action = 'node.claim') EXECUTE FUNCTION slow_once()`)
	first := make(chan response, 1)
	go func() {
		first <- b.doAsync("POST", "/v1/nodes/claim", `{"job":21,"count":1}`, "Idempotency-Key", "k21")
	}()
	time.Sleep(2300 * time.Millisecond) // past the lease, the runner in its trigger
	retry := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":21,"count":1}`, "Idempotency-Key", "k21"))
	var f response
	select {
	case f = <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the runner not answered within 10 s")
	}
	if f.status != http.StatusConflict || problemCode(t, f) != "idempotency_key_taken_over" {
		t.Errorf("the runner past its lease: %d %s, want 409 idempotency_key_taken_over", f.status, f.body)
	}
	if held := b.held(); len(held) != 1 {
		t.Errorf("held after a keyed claim of 1 node and its retry: %v, want 1 node", held)
	}
	if again := b.must(http.StatusOK, b.do("POST", "/v1/nodes/claim", `{"job":21,"count":1}`, "Idempotency-Key", "k21")); !bytes.Equal(again.body, retry.body) {
		t.Errorf("a later retry: %s, want the answer that claimed: %s", again.body, retry.body)
	}
}
