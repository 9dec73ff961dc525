package store

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// TestNodeDocJSON holds nodeDoc's hand-written encoding to what
// encoding/json writes for the same fields, "version" last as the change
// log has always stored it, and checks it reads back.
func TestNodeDocJSON(t *testing.T) {
	type plain struct { // nodeDoc without its MarshalJSON
		registry.Node
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
		d := nodeDoc{Node: n}
		got, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(plain{Node: n})
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		if !strings.HasSuffix(string(got), `,"version":`+strconv.FormatInt(n.Version, 10)+"}") {
			t.Fatalf("%s: version is not last", got)
		}
		var back nodeDoc
		if err := json.Unmarshal(got, &back); err != nil || back.Version != n.Version || back.PK != n.PK {
			t.Fatalf("read back %+v, %v", back, err)
		}
	}
}
