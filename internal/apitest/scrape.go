package apitest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Samples is one scrape of a Prometheus endpoint, parsed with the
// exposition parser: each sample under its name and labels.
type Samples struct {
	Families map[string]*dto.MetricFamily
}

// Scrape GETs url (without a token) and parses the exposition; it fails
// the test unless the answer is 200 in the text format.
func Scrape(t testing.TB, url string) Samples {
	t.Helper()
	// Not Client: /metrics is no operation of openapi.yaml.
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: status %d", url, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape %s: Content-Type %q", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: parse: %v", url, err)
	}
	return Samples{Families: fams}
}

// Value is the sample of family name whose labels include every
// name=value pair of labels (a counter's or gauge's value, a histogram's
// count); ok is false when there is none. It fails the test when more
// than one sample matches.
func (s Samples) Value(t testing.TB, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	var found []float64
	for _, m := range s.Family(name) {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			found = append(found, m.Counter.GetValue())
		case m.Gauge != nil:
			found = append(found, m.Gauge.GetValue())
		case m.Histogram != nil:
			found = append(found, float64(m.Histogram.GetSampleCount()))
		case m.Untyped != nil:
			found = append(found, m.Untyped.GetValue())
		}
	}
	switch len(found) {
	case 0:
		return 0, false
	case 1:
		return found[0], true
	}
	t.Fatalf("%s%v: %d samples match", name, labels, len(found))
	return 0, false
}

// Get is Value that counts a missing sample as 0.
func (s Samples) Get(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, _ := s.Value(t, name, labels...)
	return v
}

// Family is every sample of name.
func (s Samples) Family(name string) []*dto.Metric {
	if f := s.Families[name]; f != nil {
		return f.Metric
	}
	return nil
}

// LabelValues lists the values label takes in family name.
func (s Samples) LabelValues(name, label string) []string {
	var out []string
	for _, m := range s.Family(name) {
		for _, l := range m.Label {
			if l.GetName() == label && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	if len(pairs)%2 != 0 {
		panic(fmt.Sprintf("labels come in name, value pairs: %v", pairs))
	}
	for i := 0; i < len(pairs); i += 2 {
		ok := false
		for _, l := range m.Label {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				ok = true
			}
		}
		// A label with an empty value is not in the exposition at all.
		if !ok && pairs[i+1] != "" {
			return false
		}
		if !ok {
			for _, l := range m.Label {
				if l.GetName() == pairs[i] {
					return false
				}
			}
		}
	}
	return true
}
