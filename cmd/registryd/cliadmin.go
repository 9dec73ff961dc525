package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
	fs.StringVar(&o.since, "since", "", "only entries from this `TIME` on: RFC 3339, or a duration back from now (1h)")
	fs.Int64Var(&o.after, "after", 0, "only entries after this `ID` (the last one a previous list printed)")
	fs.IntVar(&o.limit, "limit", 100, "at most `N` entries, oldest first (0: every one)")
	tableFlags(fs, &o.viewOptions)
	return fs, o
}

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
	if o.since != "" {
		t, err := time.Parse(time.RFC3339, o.since)
		if err != nil {
			d, derr := time.ParseDuration(o.since)
			if derr != nil || d < 0 {
				errs = append(errs, fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 1h", o.since))
			}
			t = now.Add(-d)
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
// until --limit entries or the end.
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
	for {
		want := auditPage
		if o.limit > 0 {
			want = min(want, o.limit-len(entries))
		}
		f.Limit = &want
		page, err := cl.ListAudit(ctx, f)
		if err != nil {
			return err
		}
		entries = append(entries, page...)
		if len(page) < want || o.limit > 0 && len(entries) >= o.limit {
			break
		}
		f.After = &page[len(page)-1].ID
	}
	if o.output != outTable {
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
