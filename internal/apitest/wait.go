package apitest

import (
	"testing"
	"time"
)

// Eventually polls cond every 10ms until it holds, and fails the test
// (naming what it waited for) once limit has passed: a wait in a test is
// always bounded, so a broken build fails in seconds, not at the go test
// timeout. For conditions there is no event to wait on.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
