package store_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// Nodes decoded from their rows' bytes equal the same rows scanned through
// pgx, field by field, for every nullable field NULL and set, empty
// strings, extreme numbers, and times before 1970 and 2000, fractional
// and far ahead; and ListNodes' statements are the decoded kind.
func TestDecodeNodeMatchesScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	hw, err := st.CreateHardware(ctx, sys, registry.HardwareSpec{Name: "H100"})
	if err != nil {
		t.Fatal(err)
	}
	var pks []int64
	for i := range 8 {
		spec := registry.NodeSpec{IP: fmt.Sprintf("10.1.0.%d", i), Index: i, CPUMem: int64(i) << 30, DriverVersion: "550.54.15"}
		if i == 7 {
			spec.IP = "2001:db8::7"
		}
		n, _, err := st.CreateNode(ctx, sys, spec)
		if err != nil {
			t.Fatal(err)
		}
		pks = append(pks, n.PK)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// 0: every nullable field NULL (as created).
	// 1: every nullable field set, text with non-ASCII and JSON-special bytes.
	exec(`UPDATE nodes SET hardware_generation = $2, gpu_mem = 80 << 30, current_job = 42,
		lease_expires_at = '2026-12-02 10:11:12.345678+00', owner = 'agent-ü', source = 'scp',
		cordon_reason = 'fan "3" <bad> & hot', external_id = 'i-0abc', provider_state = 'RUNNING',
		lost = true, schedulable = false, gpu_model = 'NVIDIA H100 80GB HBM3', gpu_uuid = 'GPU-ü',
		fabric = 'ib "a"', labels = '{"z": "1", "a.io/b": "", "team": "ml"}' WHERE pk = $1`, pks[1], hw.PK)
	// Rows with one label set share it (the decoder reads it once).
	exec(`UPDATE nodes SET labels = '{"team": "ml", "z": "1", "a.io/b": ""}', fabric = 'f' WHERE pk = ANY($1)`, []int64{pks[5], pks[6]})
	exec(`INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, '2026-12-02 10:00:00.000001+00')`, pks[1])
	// 2: empty strings, not NULL.
	exec(`UPDATE nodes SET driver_version = '', owner = '', external_id = '', provider_state = '' WHERE pk = $1`, pks[2])
	// 3: extreme numbers.
	exec(`UPDATE nodes SET gpu_index = 2147483647, cpu_mem = 9223372036854775807, gpu_mem = 0,
		current_job = -9223372036854775808, version = 9223372036854775807 WHERE pk = $1`, pks[3])
	// 4: times before 1970 and before 2000, with fractions (negative
	// microseconds from PostgreSQL's epoch).
	exec(`UPDATE nodes SET created_at = '1969-12-31 23:59:59.999999+00', updated_at = '1999-12-31 23:59:59.5+00',
		lease_expires_at = '1900-01-01 00:00:00.000001+00', current_job = 7 WHERE pk = $1`, pks[4])
	exec(`INSERT INTO node_liveness (node_pk, last_seen) VALUES ($1, '1999-06-30 12:00:00+00')`, pks[4])
	// 5: far ahead, and a zone other than UTC in the input.
	exec(`UPDATE nodes SET lease_expires_at = '9999-12-31 23:59:59.999999+00', current_job = 8, updated_at = '2030-01-01 08:00:00+08' WHERE pk = $1`, pks[5])
	// 6: the exact epochs.
	exec(`UPDATE nodes SET created_at = '2000-01-01 00:00:00+00', updated_at = '1970-01-01 00:00:00+00' WHERE pk = $1`, pks[6])

	decoded, scanned, raw, err := store.ScanBothWays(ctx, st.Pool())
	if err != nil {
		t.Fatal(err)
	}
	if !raw {
		t.Fatal("the store's select list is not decodable: every page would go through pgx's Scan")
	}
	if len(decoded) != len(pks) {
		t.Fatalf("%d rows, want %d", len(decoded), len(pks))
	}
	for i := range decoded {
		if !reflect.DeepEqual(decoded[i], scanned[i]) {
			t.Errorf("row %d decoded:\n%+v\nscanned:\n%+v", i, show(decoded[i]), show(scanned[i]))
		}
		if got, want := string(decoded[i].AppendJSON(nil)), string(scanned[i].AppendJSON(nil)); got != want {
			t.Errorf("row %d documents differ:\n%s\n%s", i, got, want)
		}
	}
	if decoded[1].Labels.String() != `{"a.io/b":"","team":"ml","z":"1"}` || decoded[5].Labels != decoded[1].Labels {
		t.Errorf("labels decoded as %s and %s", decoded[1].Labels, decoded[5].Labels)
	}
	if decoded[2].Owner == nil || *decoded[2].Owner != "" {
		t.Errorf("an empty owner decoded as %v, want a pointer to \"\"", decoded[2].Owner)
	}

	// Pages share backing storage: a node's pointers stay its own.
	if *decoded[1].CurrentJob != 42 || *decoded[3].CurrentJob != -9223372036854775808 || decoded[0].CurrentJob != nil {
		t.Errorf("current_job across rows: %v %v %v", decoded[0].CurrentJob, *decoded[1].CurrentJob, *decoded[3].CurrentJob)
	}

	// ListNodes decodes its rows, and answers what pgx scans.
	free := true
	for _, f := range []registry.NodeFilter{{}, {Free: &free, Limit: 3}, {SeenWithin: ptr(time.Hour)}} {
		ok, err := store.ListDecodable(ctx, st.Pool(), f)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("ListNodes(%+v) rows are not decoded from their bytes", f)
		}
	}
	listed, err := st.ListNodes(ctx, registry.NodeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(listed, scanned) {
		t.Errorf("ListNodes answered\n%+v\nwant\n%+v", listed, scanned)
	}
}

// An infinite time is left to pgx, which refuses it as before.
func TestDecodeNodeInfinity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})
	n, _, err := st.CreateNode(ctx, sys, registry.NodeSpec{IP: "10.2.0.1", CPUMem: 1, DriverVersion: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE nodes SET lease_expires_at = 'infinity', current_job = 1 WHERE pk = $1`, n.PK); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ListNodes(ctx, registry.NodeFilter{}); err == nil {
		t.Fatal("ListNodes of a node leased until infinity: no error")
	}
}

func show(n registry.Node) string {
	return string(n.AppendJSON(nil)) + fmt.Sprintf(" lost=%v version=%d", n.Lost, n.Version)
}
