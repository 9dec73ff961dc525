package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/client"
)

// auditOptions are audit list's flags.
type auditOptions struct {
	viewOptions
	targetType, action, principal, role, since string
	targetPK, after                            int64
	limit                                      int
}

func auditFlags() (*flag.FlagSet, *auditOptions) {
	o := &auditOptions{}
	fs := newFlagSet("audit list")
	fs.StringVar(&o.targetType, "target-type", "", "only entries about a `TYPE` of row: node, hardware, token")
	fs.Int64Var(&o.targetPK, "target-pk", 0, "only entries about the row with this `PK` (node 42: --target-type node --target-pk 42)")
	fs.StringVar(&o.action, "action", "", "only this `ACTION`, such as node.cordon, node.claim, token.revoke")
	fs.StringVar(&o.principal, "principal", "", "only writes by this `PRINCIPAL` (a token's sub)")
	fs.StringVar(&o.role, "role", "", "only writes with this `ROLE`: admin, scheduler, agent, reader, system")
	fs.StringVar(&o.since, "since", "", "only entries from this `TIME` on: RFC 3339, a duration back from now (1h, 90m, 7d), or all; "+
		"without it or --after, the last "+defaultAuditSince+" (the API lists oldest first: the whole log is read to find the newest)")
	fs.Int64Var(&o.after, "after", 0, "only entries after this `ID` (the last one a previous list printed)")
	fs.IntVar(&o.limit, "limit", 100, "the newest `N` entries, printed oldest first (0: every one)")
	tableFlags(fs, &o.viewOptions)
	return fs, o
}

// defaultAuditSince bounds what a plain audit list reads: the API pages
// oldest first, so the newest entries of a year's log would cost every
// page of it.
const defaultAuditSince = "24h"

// filter is the API's audit filter of the flags; now places --since.
func (o *auditOptions) filter(now time.Time) (client.AuditFilter, error) {
	var f client.AuditFilter
	var errs []error
	f.TargetType = enumFlag[client.AuditTargetType]("--target-type", o.targetType, "node, hardware or token", &errs)
	if o.targetPK != 0 {
		f.TargetPK = &o.targetPK
	}
	f.Action = enumFlag[client.AuditAction]("--action", o.action, "an audited action (node.create, node.cordon, token.revoke …)", &errs)
	if o.principal != "" {
		f.Principal = &o.principal
	}
	f.Role = enumFlag[client.AuditRole]("--role", o.role, "admin, scheduler, agent, reader or system", &errs)
	since := o.since
	if since == "" && o.after == 0 {
		since = defaultAuditSince
	}
	if since != "" && since != "all" {
		t, err := parseSince(since, now)
		if err != nil {
			errs = append(errs, err)
		}
		f.Since = &t
	}
	if o.after > 0 {
		f.After = &o.after
	}
	if o.limit < 0 {
		errs = append(errs, errors.New("--limit must not be negative"))
	}
	errs = append(errs, checkOutput(o.output, outTable, outJSON, outYAML))
	return f, errors.Join(errs...)
}

// parseSince reads --since: an RFC 3339 time, or a duration back from
// now, in Go's units (90m, 1h30m) or in days (7d).
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, nerr := strconv.Atoi(days)
		d, err = time.Duration(n)*24*time.Hour, nerr
		if n > 100*365 {
			err = errors.New("too far back")
		}
	}
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 1h or 7d", s)
	}
	return now.Add(-d), nil
}

// pageThrough lists by pages of at most size() items, each after the key
// of the previous page's last item (the first after start), handing each
// page to keep, until a page comes back short or keep returns false.
func pageThrough[T any](start *int64, size func() int, fetch func(after *int64, n int) ([]T, error), key func(T) int64, keep func([]T) bool) error {
	after := start
	for {
		n := size()
		page, err := fetch(after, n)
		if err != nil {
			return err
		}
		if !keep(page) || len(page) < n {
			return nil
		}
		k := key(page[len(page)-1])
		after = &k
	}
}

// enumFlag is the value of an enumeration's flag: nil when unset, and an
// error naming what it wants when v is none of its values.
func enumFlag[T interface {
	~string
	Valid() bool
}](name, v, want string, errs *[]error) *T {
	if v == "" {
		return nil
	}
	t := T(v)
	if !t.Valid() {
		*errs = append(*errs, fmt.Errorf("%s %q: want %s", name, v, want))
	}
	return &t
}

// auditPage is how many entries one request asks for.
const auditPage = 500

// auditList is `registryd audit list`: it pages through the log by id
// to its end and prints the newest --limit entries (oldest first),
// saying on stderr when there were more.
func auditList(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, o := auditFlags()
	var f client.AuditFilter
	cl, err := startFlagsOnly(ctx, e, c, fs, args, func() (err error) {
		f, err = o.filter(time.Now())
		return err
	})
	if err != nil {
		return err
	}
	var entries []client.AuditEntry
	var raws []json.RawMessage // the entries as the API sent them, while every page's are known
	rawKnown := true
	total := 0
	err = pageThrough(f.After, func() int { return auditPage },
		func(after *int64, n int) ([]client.AuditEntry, error) {
			f.After, f.Limit = after, &n
			page, err := cl.ListAudit(ctx, f)
			if raw := e.docs.lastList(len(page)); raw != nil {
				raws = append(raws, raw...)
			} else {
				rawKnown = false
			}
			return page, err
		},
		func(a client.AuditEntry) int64 { return a.ID },
		func(page []client.AuditEntry) bool {
			total += len(page)
			entries = append(entries, page...)
			if o.limit > 0 && len(entries) > o.limit {
				entries = slices.Delete(entries, 0, len(entries)-o.limit)
				if rawKnown {
					raws = slices.Delete(raws, 0, len(raws)-o.limit)
				}
			}
			return true
		})
	if err != nil {
		return err
	}
	if total > len(entries) {
		fmt.Fprintf(e.stderr, "showing the newest %d of %d entries; --limit 0 shows every one, --after ID those after one, --since a span\n", len(entries), total)
	}
	if o.output != outTable {
		if rawKnown && len(raws) == len(entries) {
			return writeRaw(e.stdout, o.output, jsonList(raws))
		}
		if entries == nil {
			entries = []client.AuditEntry{}
		}
		return writeDocument(e.stdout, o.output, entries)
	}
	t := &table{header: []string{"ID", "AT", "PRINCIPAL", "ROLE", "ACTION", "TARGET", "REQUEST"}}
	now := time.Now()
	for _, a := range entries {
		target := a.TargetType
		if a.TargetPK != nil {
			target += "/" + strconv.FormatInt(*a.TargetPK, 10)
		}
		t.rows = append(t.rows, []string{strconv.FormatInt(a.ID, 10), ago(&a.At, now), a.Principal, a.Role, a.Action, target, a.RequestID})
	}
	t.write(e.stdout, o.noHeaders)
	return nil
}

// tableFlags adds -o (table, json or yaml) and --no-headers.
func tableFlags(fs *flag.FlagSet, v *viewOptions) {
	outputFlag(fs, &v.output, outTable, outJSON, outYAML)
	fs.BoolVar(&v.noHeaders, "no-headers", false, "tables without their header line, for scripts")
}

func fabricsFlags() (*flag.FlagSet, *filterOptions, *viewOptions) {
	fs := newFlagSet("fabrics list")
	fo, v := &filterOptions{}, &viewOptions{}
	fo.add(fs, allFilters)
	tableFlags(fs, v)
	return fs, fo, v
}

func hardwareFlags() (*flag.FlagSet, *string, *viewOptions) {
	fs := newFlagSet("hardware list")
	v := &viewOptions{}
	name := fs.String("name", "", "only the generation of this `NAME`")
	tableFlags(fs, v)
	return fs, name, v
}

// fabricsList is `registryd fabrics list`: per fabric, the hosts and the
// nodes by state of the nodes the filters select.
func fabricsList(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, fo, v := fabricsFlags()
	cl, err := startFlagsOnly(ctx, e, c, fs, args, func() error {
		return errors.Join(fo.check(), checkOutput(v.output, outTable, outJSON, outYAML))
	})
	if err != nil {
		return err
	}
	f, err := fo.filter(ctx, cl)
	if err != nil {
		return err
	}
	fabrics, err := cl.ListFabrics(ctx, fabricFilterOf(f))
	if err != nil {
		return err
	}
	if v.output != outTable {
		if raw := e.docs.lastList(len(fabrics)); raw != nil {
			return writeRaw(e.stdout, v.output, jsonList(raw))
		}
		return writeDocument(e.stdout, v.output, fabrics)
	}
	t := &table{header: []string{"FABRIC", "HOSTS", "FREE", "BUSY", "CORDONED", "DRAINING", "LOST", "GONE", "FREE:HOSTS"}}
	for _, fc := range fabrics {
		n := fc.Nodes
		// free_hosts as FREE:HOSTS pairs: "0:3 8:2" is three hosts with
		// no free node and two with eight, what a per_host claim can find.
		var groups []string
		for _, g := range fc.FreeHosts {
			groups = append(groups, fmt.Sprintf("%d:%d", g.Free, g.Hosts))
		}
		whole := clip(strings.Join(groups, " "))
		name := "(none)"
		if fc.Fabric != nil {
			name = *fc.Fabric
		}
		t.rows = append(t.rows, []string{name, i64(fc.Hosts), i64(n.Free), i64(n.Busy), i64(n.Cordoned), i64(n.Draining), i64(n.Lost), i64(n.Gone), whole})
	}
	t.write(e.stdout, v.noHeaders)
	return nil
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// hardwareList is `registryd hardware list`.
func hardwareList(ctx context.Context, e *cliEnv, c command, args []string) error {
	fs, name, v := hardwareFlags()
	cl, err := startFlagsOnly(ctx, e, c, fs, args, func() error {
		return checkOutput(v.output, outTable, outJSON, outYAML)
	})
	if err != nil {
		return err
	}
	var f client.HardwareFilter
	if *name != "" {
		f.Name = name
	}
	hw, err := cl.ListHardware(ctx, f)
	if err != nil {
		return err
	}
	if v.output != outTable {
		if raw := e.docs.lastList(len(hw)); raw != nil {
			return writeRaw(e.stdout, v.output, jsonList(raw))
		}
		return writeDocument(e.stdout, v.output, hw)
	}
	t := &table{header: []string{"PK", "NAME", "NODES", "AGE"}}
	now := time.Now()
	for _, h := range hw {
		t.rows = append(t.rows, []string{i64(h.PK), h.Name, i64(h.Nodes), ago(&h.CreatedAt, now)})
	}
	t.write(e.stdout, v.noHeaders)
	return nil
}
