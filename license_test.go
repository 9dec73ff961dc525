package registryd_test

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The project is Apache-2.0: the LICENSE file holds the license's terms
// and the API spec says the same (it used to say "Proprietary").
func TestLicense(t *testing.T) {
	b, err := os.ReadFile("LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS"} {
		if !strings.Contains(text, want) {
			t.Errorf("LICENSE lacks %q", want)
		}
	}
	spec, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Info struct {
			License struct {
				Name string `yaml:"name"`
				URL  string `yaml:"url"`
			} `yaml:"license"`
		} `yaml:"info"`
	}
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	if l := doc.Info.License; l.Name != "Apache-2.0" || l.URL != "https://www.apache.org/licenses/LICENSE-2.0" {
		t.Errorf("openapi.yaml info.license = %+v, want Apache-2.0", l)
	}
}
