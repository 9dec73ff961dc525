package store

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// TestNodeDocJSON holds nodeDoc's hand-written encoding to what
// encoding/json writes for the same fields, and checks it reads back.
func TestNodeDocJSON(t *testing.T) {
	type plain struct { // nodeDoc without its MarshalJSON
		registry.Node
		Version int64 `json:"version"`
	}
	job, owner, reason := int64(7), `agent "<a&b>"`, "maint\n\u2028"
	seen := time.Date(2026, 12, 2, 0, 0, 0, 123400000, time.UTC)
	for _, n := range []registry.Node{
		{},
		{PK: 1, IP: "10.0.0.1", DriverVersion: "550", Source: "api", Schedulable: true, State: registry.StateFree, Version: 3,
			CreatedAt: seen, UpdatedAt: seen},
		{PK: 2, IP: "::1", CurrentJob: &job, LastSeen: &seen, LeaseExpiresAt: &seen, Owner: &owner, CordonReason: &reason,
			State: registry.StateDraining, Version: -1},
	} {
		d := nodeDoc{Node: n, Version: n.Version}
		got, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(plain{Node: n, Version: n.Version})
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		var back nodeDoc
		if err := json.Unmarshal(got, &back); err != nil || back.Version != n.Version || back.PK != n.PK {
			t.Fatalf("read back %+v, %v", back, err)
		}
	}
}
