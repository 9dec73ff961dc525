package registry

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Heartbeats travel between replicas as notification payloads (the store
// sends them with each flush, the node cache reads them): a base time in
// unix microseconds, then one "pk-delta,time-delta" pair per node, both
// base 36, pks ascending. About 8 bytes a node.

// FormatLiveness encodes heartbeats (pks ascending, seen[i] the time of
// pks[i]) as payloads of at most max bytes each.
func FormatLiveness(pks []int64, seen []time.Time, max int) []string {
	var out []string
	var b strings.Builder
	var base, prev int64
	for i, pk := range pks {
		t := seen[i].UnixMicro()
		if b.Len() == 0 {
			base, prev = t, 0
			b.WriteString(strconv.FormatInt(base, 36))
		}
		pair := " " + strconv.FormatInt(pk-prev, 36) + "," + strconv.FormatInt(t-base, 36)
		if b.Len()+len(pair) > max {
			out = append(out, b.String())
			b.Reset()
			base, prev = t, 0
			b.WriteString(strconv.FormatInt(base, 36))
			pair = " " + strconv.FormatInt(pk, 36) + ",0"
		}
		b.WriteString(pair)
		prev = pk
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// ParseLiveness calls fn with each heartbeat of a payload FormatLiveness
// made.
func ParseLiveness(payload string, fn func(pk int64, seen time.Time)) error {
	head, rest, _ := strings.Cut(payload, " ")
	base, err := strconv.ParseInt(head, 36, 64)
	if err != nil {
		return errors.New("liveness payload: bad base time")
	}
	var pk int64
	for rest != "" {
		var pair string
		pair, rest, _ = strings.Cut(rest, " ")
		d, t, ok := strings.Cut(pair, ",")
		dpk, err1 := strconv.ParseInt(d, 36, 64)
		dt, err2 := strconv.ParseInt(t, 36, 64)
		if !ok || err1 != nil || err2 != nil {
			return errors.New("liveness payload: bad pair " + strconv.Quote(pair))
		}
		pk += dpk
		fn(pk, time.UnixMicro(base+dt).UTC())
	}
	return nil
}
