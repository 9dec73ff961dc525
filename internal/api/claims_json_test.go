package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// The claim and release answers' hand-written encodings are what
// encoding/json writes for the same structs. Fault caught (tried once):
// an empty list of released nodes written as [] where the struct's nil
// is null (the handler makes it [] itself, as before).
func TestClaimAnswersJSON(t *testing.T) {
	type plainClaim claimJSON // the same fields without the MarshalJSON
	type plainRelease releaseJSON
	job, owner := int64(7), `agent "<a&b>"`
	at := time.Date(2026, 12, 2, 0, 0, 0, 123400000, time.UTC)
	nodes := []registry.Node{
		{PK: 1, IP: "10.0.0.1", DriverVersion: "550", Source: "api", Schedulable: true, State: registry.StateBusy,
			CurrentJob: &job, LeaseExpiresAt: &at, Owner: &owner, CreatedAt: at, UpdatedAt: at},
		{PK: 2, IP: "::1", State: registry.StateFree},
	}
	check := func(t *testing.T, got any, want any) {
		t.Helper()
		g, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		w, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if string(g) != string(w) {
			t.Errorf("got  %s\nwant %s", g, w)
		}
	}
	for _, ns := range [][]registry.Node{nil, {}, nodes[:1], nodes} {
		check(t, claimJSON{Job: job, Nodes: ns}, plainClaim{Job: job, Nodes: ns})
		for _, not := range [][]notReleasedJSON{nil, {}, {{PK: 3, Reason: `held by job 9 <"x">`}}} {
			check(t, releaseJSON{Job: job, Released: ns, NotReleased: not}, plainRelease{Job: job, Released: ns, NotReleased: not})
		}
	}
}
