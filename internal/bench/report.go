package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Markdown renders rep as the table docs/benchmarks.md takes, with the
// machine, the fleet, peak memory and every error spelled out under it.
func Markdown(rep *Report) string {
	var b strings.Builder
	m := rep.Machine
	how := "seeded through SQL (server restarted on it)"
	switch rep.Seed {
	case SeedAPI:
		how = "created through the API by the server measured (no restart)"
	case SeedSync:
		how = "imported from a fake SCP API by `registryd sync --once` while the server measured ran (no restart)"
	}
	fmt.Fprintf(&b, "%s UTC: %d nodes (%d hosts × 8 GPUs), %s in %.1f s.\n", rep.Started.Format("2006-01-02 15:04"), rep.Nodes, rep.Hosts, how, rep.SeedSeconds)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %d MiB, %s (kernel %s), %s, %s", orUnknown(m.CPU), m.Cores, m.MemoryMB, orUnknown(m.OS), orUnknown(m.Kernel), m.Go, orUnknown(m.PostgreSQL))
	if len(m.Settings) > 0 {
		var kv []string
		for _, k := range durabilitySettings {
			if v, ok := m.Settings[k]; ok {
				kv = append(kv, k+"="+v)
			}
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(kv, ", "))
	}
	fmt.Fprintf(&b, "; load average at start %s.\n\n", orUnknown(m.LoadAvg))

	b.WriteString("| path | clients | registryd rate | p50 | p99 | max | errors | pgbench tps | pgbench latency | ratio |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Results {
		errs := "0"
		if r.Errors > 0 {
			errs = fmt.Sprintf("**%d**", r.Errors)
		}
		tps, lat, ratio := "—", "—", "—"
		rate := thousands(r.Rate) + "/s"
		if r.Rate < 10 { // full lists, restarts: a handful a second
			rate = fmt.Sprintf("%.2f/s", r.Rate)
		}
		if r.Start != nil { // restarts a second, stops included, mean nothing
			rate = fmt.Sprintf("%d starts", len(r.Start.ReadyMS))
		}
		if l := r.List; l != nil && l.PgxReadMS > 0 {
			tps, lat = "one full read (pgx)", fmt.Sprintf("%.1f ms", l.PgxReadMS)
			ratio = fmt.Sprintf("%.2f× (time)", r.Ratio)
		}
		if p := r.Pgbench; p != nil {
			if p.Error != "" {
				tps = "**failed**"
			} else {
				tps = fmt.Sprintf("%s/s", thousands(p.TPS))
				lat = fmt.Sprintf("%.2f ms avg", p.LatencyMS)
				if p.P99MS > 0 {
					lat += fmt.Sprintf(", p99 %.2f ms", p.P99MS)
				}
				if r.Ratio > 0 {
					ratio = fmt.Sprintf("%.2f×", r.Ratio)
				}
			}
		}
		path := r.Path + clientNote(r.Client)
		if r.Phase != "" {
			path = r.Phase + ": " + path
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.2f ms | %.2f ms | %.1f ms | %s | %s | %s | %s |\n",
			path, r.Clients, rate, r.P50MS, r.P99MS, r.MaxMS, errs, tps, lat, ratio)
	}
	b.WriteString("\n")
	for _, r := range rep.Results {
		if r.ServerPeakRSS > 0 {
			fmt.Fprintf(&b, "- %s: registryd peak RSS %d MB", r.Workload, r.ServerPeakRSS>>20)
			if r.PostgresPSS > 0 {
				fmt.Fprintf(&b, ", PostgreSQL PSS after it %d MB", r.PostgresPSS>>20)
			}
			b.WriteString("\n")
		}
	}
	for _, r := range rep.Results {
		if l := r.List; l != nil {
			fmt.Fprintf(&b, "- %s: %.1f MB/s, %s nodes/s (one list: %s nodes, %.1f MB, median %.0f ms)", r.Workload, l.MBPerS, thousands(l.NodesPerS), thousands(float64(l.Nodes)), float64(l.Bytes)/1e6, r.P50MS)
			if l.PgxReadMS > 0 {
				fmt.Fprintf(&b, "; PostgreSQL hands the same rows to pgx in %.0f ms (median of %d)", l.PgxReadMS, l.PgxReads)
			}
			b.WriteString("\n")
			if l.PgxError != "" {
				fmt.Fprintf(&b, "- **%s: PostgreSQL's full read failed**: %s\n", r.Workload, l.PgxError)
			}
		}
		if p := r.Pgbench; p != nil && p.Whole > 0 {
			fmt.Fprintf(&b, "- %s: pgbench's transactions that claimed a whole gang: %d of %d (%s/s); the ratio is against them\n",
				r.Workload, p.Whole, p.Processed, thousands(p.WholeTPS))
		}
		if c := r.Claim; c != nil {
			fmt.Fprintf(&b, "- %s: the claim requests alone: %s/s, p50 %.2f ms, p99 %.2f ms (%d claims)\n",
				r.Workload, thousands(c.Rate), c.P50MS, c.P99MS, c.Claims)
		}
		if rp := r.Replica; rp != nil {
			fmt.Fprintf(&b, "- %s: %s writes/s on A (%d writes); on B consistent reads p50 %.2f ms, p99 %.2f ms, %d stale; with max-stale %s/s, p50 %.2f ms, p99 %.2f ms, %d stale: a consistent read adds %.2f ms at p50, %.2f ms at p99\n",
				r.Workload, thousands(rp.WriteRate), rp.Writes, r.P50MS, r.P99MS, rp.StaleConsistent, thousands(rp.MaxStaleRate), rp.MaxStaleP50MS, rp.MaxStaleP99MS, rp.MaxStaleStale, rp.AddedP50MS, rp.AddedP99MS)
		}
		if ab := r.Abandon; ab != nil {
			fmt.Fprintf(&b, "- %s: the honest schedulers %s/s beside the abandoning clients against %s/s alone (%.2f×); %d of %d claims abandoned, %d nodes held after their release\n",
				r.Workload, thousands(ab.Rate), thousands(ab.UndisturbedRate), ab.Ratio, ab.Abandoned, ab.Sent, ab.HeldAfter)
		}
		if fl := r.Fill; fl != nil {
			var qs []string
			for i, q := range fl.Quarters {
				qs = append(qs, fmt.Sprintf("%d–%d%% full: p50 %.1f ms, p99 %.1f ms (%d)", i*25, i*25+25, q.P50MS, q.P99MS, q.Claims))
			}
			fmt.Fprintf(&b, "- %s: %d of %d gangs placed, %d still fitting after the last refusal, %d refusals; claims by how full the fleet was: %s; then %s releases/s, p50 %.1f ms, p99 %.1f ms\n",
				r.Workload, fl.Placed, fl.Capacity, fl.Left, fl.Refused, strings.Join(qs, "; "), thousands(fl.ReleaseRate), fl.ReleaseP50MS, fl.ReleaseP99MS)
		}
		if k := r.Kept; k != nil {
			fmt.Fprintf(&b, "- %s: %d jobs held %d nodes at the end; then %s releases/s, p50 %.1f ms, p99 %.1f ms\n",
				r.Workload, k.Jobs, k.Nodes, thousands(k.ReleaseRate), k.ReleaseP50MS, k.ReleaseP99MS)
		}
		if rn := r.Renew; rn != nil {
			fmt.Fprintf(&b, "- %s: %d renewals of %d-node jobs: %d renewed events on the watch (%.2f per renewal, listing %d nodes), %.0f bytes of stream per renewal; %d other events meanwhile %v\n",
				r.Workload, rn.Renewals, rn.NodesPerJob, rn.Renewed, rn.EventsPerRenewal, rn.NodesListed, rn.BytesPerRenewal, rn.Other, rn.OtherKinds)
		}
		if s := r.Start; s != nil && len(s.ReadyMS) > 0 {
			_, stopMedian := minMedian(s.StopMS)
			fmt.Fprintf(&b, "- %s with %s nodes: banner after %.0f ms min / %.0f ms median, /readyz 200 after %.0f ms min / %.0f ms median (%d starts); stop (SIGTERM to exit) %.0f ms median\n",
				r.Workload, thousands(float64(r.Nodes)), s.BannerMinMS, s.BannerMedianMS, s.ReadyMinMS, s.ReadyMedianMS, len(s.ReadyMS), stopMedian)
		}
	}
	for _, r := range rep.Results {
		for _, k := range slices.Sorted(maps.Keys(r.ErrorKinds)) {
			fmt.Fprintf(&b, "- **%s: %d × %s**, first: %s\n", r.Workload, r.ErrorKinds[k], k, r.ErrorFirst[k])
		}
		if r.Ops == 0 {
			fmt.Fprintf(&b, "- **%s: no op succeeded in the measured time**\n", r.Workload)
		}
		if r.Pgbench != nil && r.Pgbench.Error != "" {
			fmt.Fprintf(&b, "- **%s: pgbench failed**: %s\n", r.Workload, strings.ReplaceAll(strings.TrimSpace(r.Pgbench.Error), "\n", " / "))
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// thousands formats a rate as an integer with thousands separators.
func thousands(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// clientNote names what sent a workload's requests, in the table.
func clientNote(client string) string {
	if client == "" {
		return ""
	}
	return " [" + client + "]"
}
