package metrics_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd/internal/metrics"
)

// The monitoring kit (deploy/monitoring: alert rules, dashboard) parses,
// and every expression in it names only families registryd exports: a
// renamed metric fails here, not in someone's pager at night.
func TestMonitoringKitNamesExist(t *testing.T) {
	t.Parallel()
	families := metrics.AllFamilies()
	for _, want := range []string{"registryd_fleet_nodes", "registryd_db_pool_max_connections", "registryd_heartbeats_pending", "registryd_claims_total"} {
		if !slices.Contains(families, want) { // AllFamilies itself has teeth
			t.Fatalf("AllFamilies lacks %s: %v", want, families)
		}
	}
	exists := func(name string) bool {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(families, base) {
				return true
			}
		}
		return false
	}
	dir := filepath.Join("..", "..", "deploy", "monitoring")
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	exprs := 0
	alerts := 0
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		switch filepath.Ext(path) {
		case ".json":
			err = json.Unmarshal(b, &doc)
		case ".yaml":
			err = yaml.Unmarshal(b, &doc)
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		walk(doc, func(key string, v any) {
			if key == "alert" {
				alerts++
			}
			s, ok := v.(string)
			if key != "expr" || !ok {
				return
			}
			exprs++
			names := metricNameRE.FindAllString(s, -1)
			if len(names) == 0 {
				t.Errorf("%s: %q names no registryd metric", filepath.Base(path), s)
			}
			for _, n := range names {
				if !exists(n) {
					t.Errorf("%s: %s is not a metric registryd exports (in %q)", filepath.Base(path), n, s)
				}
			}
		})
	}
	if exprs < 15 || alerts < 5 {
		t.Errorf("found %d expressions and %d alerts; is the walk broken?", exprs, alerts)
	}
}

var metricNameRE = regexp.MustCompile(`registryd_[a-z0-9_]+`)

// walk calls fn for every member of every object in doc, depth first.
func walk(doc any, fn func(key string, v any)) {
	switch d := doc.(type) {
	case map[string]any:
		for k, v := range d {
			fn(k, v)
			walk(v, fn)
		}
	case []any:
		for _, v := range d {
			walk(v, fn)
		}
	}
}
