package bench

import (
	"context"
	"slices"
	"time"
)

// startupRuns is how many times the startup workload restarts the server.
const startupRuns = 3

// StartStats is what the startup workload measured: for each restart of the
// server on its data (the seeded fleet in it), the time from exec until
// it wrote its banner ("registryd is serving on") and until /readyz
// answered 200, and how long the stop before it took (SIGTERM to exit).
type StartStats struct {
	BannerMS       []float64 `json:"banner_ms"`
	ReadyMS        []float64 `json:"ready_ms"`
	StopMS         []float64 `json:"stop_ms"`
	BannerMinMS    float64   `json:"banner_min_ms"`
	BannerMedianMS float64   `json:"banner_median_ms"`
	ReadyMinMS     float64   `json:"ready_min_ms"`
	ReadyMedianMS  float64   `json:"ready_median_ms"`
}

// restarts restarts srv runs times and measures each start. A restart
// that fails ends the workload with its error counted; the server is then
// down and the run stops.
func restarts(ctx context.Context, srv *server, runs int) (*StartStats, Load, error) {
	st := &StartStats{}
	l := Load{ErrorKinds: map[string]int64{}, ErrorSamples: map[string]string{}}
	var ready []time.Duration
	t0 := time.Now()
	for range runs {
		times, err := srv.restart(ctx)
		if err != nil {
			l.Errors++
			l.ErrorKinds["restart failed"]++
			l.ErrorSamples["restart failed"] = err.Error()
			l.Elapsed = time.Since(t0)
			return st, l, err
		}
		st.BannerMS = append(st.BannerMS, ms(times.banner))
		st.ReadyMS = append(st.ReadyMS, ms(times.ready))
		st.StopMS = append(st.StopMS, ms(times.stop))
		ready = append(ready, times.ready)
	}
	l.Elapsed = time.Since(t0)
	l.Ops = int64(len(ready))
	l.Rate = float64(l.Ops) / l.Elapsed.Seconds()
	slices.Sort(ready)
	l.P50, l.P99, l.Max = percentile(ready, 0.5), percentile(ready, 0.99), ready[len(ready)-1]
	st.BannerMinMS, st.BannerMedianMS = minMedian(st.BannerMS)
	st.ReadyMinMS, st.ReadyMedianMS = minMedian(st.ReadyMS)
	return st, l, nil
}

// minMedian of xs (the lower median of an even count).
func minMedian(xs []float64) (float64, float64) {
	s := slices.Sorted(slices.Values(xs))
	return s[0], s[(len(s)-1)/2]
}
