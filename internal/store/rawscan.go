package store

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/registryd/registryd/internal/registry"
)

// Pages of nodes are decoded from the rows' wire bytes here rather than
// through pgx's Scan (why: docs/design.md): a decoded node takes two
// allocations, its strings sharing one and its pointer fields pointing into
// a backing shared with the page's other nodes.

// nodeBacking holds what a decoded node's pointer fields point at.
type nodeBacking struct {
	opt [7]string    // owner, cordon_reason, external_id, provider_state, gpu_model, gpu_uuid, fabric
	i64 [3]int64     // hardware_generation, gpu_mem, current_job
	ts  [2]time.Time // last_seen, lease_expires_at
}

// nodeDecoder decodes the rows of one query.
type nodeDecoder struct {
	backings []nodeBacking // the unused rest of the current chunk
	// labels are the label sets read so far, by their stored text: the
	// nodes of a page share a few.
	labels map[string]registry.Labels
}

// errUndecodable is a value decodeNode does not read (an infinite time, a
// NULL in a column that has none, a length that does not fit its type);
// the row is scanned through pgx instead, which says what is wrong.
var errUndecodable = errors.New("store: value not decodable")

// rawDecodable reports whether rows of this shape can be decoded by
// decodeNode: nodeFields' columns, of their types, every one but text in
// the binary format but text (the same bytes in both) and jsonb (text).
func rawDecodable(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(nodeFields) {
		return false
	}
	for i, fd := range fds {
		var ok bool
		switch fd.DataTypeOID {
		case pgtype.TextOID:
			ok = true // the same bytes in both formats
		case pgtype.JSONBOID:
			ok = fd.Format == pgx.TextFormatCode // pgx asks for jsonb as text
		default:
			ok = fd.Format == pgx.BinaryFormatCode
		}
		if fd.DataTypeOID != nodeFields[i].oid || !ok {
			return false
		}
	}
	return true
}

// scanNodeRow reads the current row into a node: decoded from its bytes
// when raw (see rawDecodable), through pgx's Scan into dests (nodeDests of
// n) otherwise or when the bytes hold something decodeNode leaves to pgx.
// The node's times are in UTC and its state derived, as scanNode's.
func (d *nodeDecoder) scanNodeRow(rows pgx.Rows, raw bool, n *registry.Node, dests []any) error {
	*n = registry.Node{}
	if raw {
		if err := d.decodeNode(rows.RawValues(), n); err == nil {
			n.State = n.DeriveState()
			return nil
		}
		*n = registry.Node{}
	}
	if err := rows.Scan(dests...); err != nil {
		return err
	}
	n.State = n.DeriveState()
	*n = n.UTC()
	return nil
}

// decodedFields is how many of nodeFields decodeNode reads, by position.
// A column added to nodeFields stops the build here until decodeNode reads
// it too.
const decodedFields = 24

var _ [len(nodeFields) - decodedFields]struct{}
var _ [decodedFields - len(nodeFields)]struct{}

// decodeNode decodes vals, a row of nodeFields in rawDecodable's formats,
// into n.
func (d *nodeDecoder) decodeNode(vals [][]byte, n *registry.Node) error {
	if len(vals) != len(nodeFields) {
		return errUndecodable
	}
	if len(d.backings) == 0 {
		d.backings = make([]nodeBacking, 32)
	}
	r := rowDecoder{b: &d.backings[0]}
	*r.b = nodeBacking{}
	size := 0
	for i, f := range nodeFields {
		if f.oid == pgtype.TextOID {
			size += len(vals[i])
		}
	}
	r.text.Grow(size) // one string for all of the row's text
	n.PK = r.int8(vals[0])
	n.IP = r.str(vals[1])
	n.Index = int(r.int4(vals[2]))
	n.CPUMem = r.int8(vals[3])
	n.DriverVersion = r.str(vals[4])
	n.HardwareGeneration = r.optInt(vals[5], 0)
	n.GPUMem = r.optInt(vals[6], 1)
	n.GPUModel = r.optStr(vals[7], 4)
	n.GPUUUID = r.optStr(vals[8], 5)
	n.Fabric = r.optStr(vals[9], 6)
	n.Labels = d.labelsOf(&r, vals[10])
	n.LastSeen = r.optTime(vals[11], 0)
	n.CurrentJob = r.optInt(vals[12], 2)
	n.LeaseExpiresAt = r.optTime(vals[13], 1)
	n.Owner = r.optStr(vals[14], 0)
	n.Source = r.str(vals[15])
	n.Schedulable = r.bool(vals[16])
	n.Lost = r.bool(vals[17])
	n.CordonReason = r.optStr(vals[18], 1)
	n.ExternalID = r.optStr(vals[19], 2)
	n.ProviderState = r.optStr(vals[20], 3)
	n.CreatedAt = r.time(vals[21])
	n.UpdatedAt = r.time(vals[22])
	n.Version = r.int8(vals[23])
	if r.err != nil {
		return r.err
	}
	d.backings = d.backings[1:]
	return nil
}

// labelsOf decodes the text of a jsonb of labels, reusing the set of an
// earlier row with the same text.
func (d *nodeDecoder) labelsOf(r *rowDecoder, text []byte) registry.Labels {
	if text == nil {
		r.fail()
		return registry.Labels{}
	}
	if string(text) == "{}" {
		return registry.Labels{}
	}
	if l, ok := d.labels[string(text)]; ok {
		return l
	}
	l, err := registry.ParseLabels(text)
	if err != nil {
		r.fail()
		return registry.Labels{}
	}
	if d.labels == nil {
		d.labels = map[string]registry.Labels{}
	}
	d.labels[string(text)] = l
	return l
}

// rowDecoder decodes one row's values; the first value it cannot decode
// is its err.
type rowDecoder struct {
	b    *nodeBacking
	text strings.Builder
	err  error
}

func (r *rowDecoder) fail() { r.err = errUndecodable }

func (r *rowDecoder) int8(v []byte) int64 {
	if len(v) != 8 {
		r.fail()
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

func (r *rowDecoder) int4(v []byte) int32 {
	if len(v) != 4 {
		r.fail()
		return 0
	}
	return int32(binary.BigEndian.Uint32(v))
}

func (r *rowDecoder) bool(v []byte) bool {
	if len(v) != 1 {
		r.fail()
		return false
	}
	return v[0] != 0
}

// str is a NOT NULL text value, sharing the row's one string.
func (r *rowDecoder) str(v []byte) string {
	if v == nil {
		r.fail()
		return ""
	}
	at := r.text.Len()
	r.text.Write(v)
	return r.text.String()[at:]
}

// time is a NOT NULL binary timestamptz, in UTC. Infinities are left to
// pgx.
func (r *rowDecoder) time(v []byte) time.Time {
	us := r.int8(v)
	if us == math.MaxInt64 || us == math.MinInt64 {
		r.fail()
		return time.Time{}
	}
	// time.Unix takes the negative nanoseconds of a time before 2000.
	return time.Unix(pgEpochUnix+us/1e6, us%1e6*1e3).UTC()
}

func (r *rowDecoder) optStr(v []byte, slot int) *string {
	if v == nil {
		return nil
	}
	r.b.opt[slot] = r.str(v)
	return &r.b.opt[slot]
}

func (r *rowDecoder) optInt(v []byte, slot int) *int64 {
	if v == nil {
		return nil
	}
	r.b.i64[slot] = r.int8(v)
	return &r.b.i64[slot]
}

func (r *rowDecoder) optTime(v []byte, slot int) *time.Time {
	if v == nil {
		return nil
	}
	r.b.ts[slot] = r.time(v)
	return &r.b.ts[slot]
}

// pgEpochUnix is 2000-01-01 00:00:00 UTC, the zero of a binary
// timestamptz (microseconds from it), in Unix seconds.
const pgEpochUnix = 946684800
