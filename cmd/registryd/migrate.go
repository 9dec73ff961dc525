package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
)

func migrate(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 || (args[0] != "up" && args[0] != "down" && args[0] != "status") {
		fmt.Fprint(stderr, "usage: registryd migrate up|down|status\n")
		return errUsage
	}
	logger := newLogger(cfg, stderr)
	db, err := openDatabase(ctx, cfg, logger, "migrate "+args[0], nil)
	if err != nil {
		return err
	}
	defer db.close()
	m, err := db.store.NewMigrator(nil)
	if err != nil {
		return err
	}
	defer m.Close()
	switch args[0] {
	case "up":
		res, err := m.Up(ctx)
		for _, r := range res {
			fmt.Fprintln(stdout, r.String())
		}
		if err != nil {
			return err
		}
		if len(res) == 0 {
			fmt.Fprintln(stdout, "no pending migrations")
		}
	case "down":
		r, err := m.Down(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, r.String())
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range st {
			at := "-"
			if !s.AppliedAt.IsZero() {
				at = s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, at, s.Source.Path)
		}
		return tw.Flush()
	}
	return nil
}
