package agent

import (
	"strings"
	"unicode"
)

// hardwareNames lists the names under which a GPU model may be known as a
// hardware generation, most specific first: nvidia-smi's product name
// ("NVIDIA H100 80GB HBM3"), the same without the vendor ("H100 80GB
// HBM3"), and the model alone ("H100"), which is what the cloud importers
// name generations after. The model is the first word of the name (cut at
// "-", so "A100-SXM4-80GB" gives "A100"), after "NVIDIA", "Tesla",
// "GeForce" or "Quadro", and only if it holds a digit: a family word such
// as "RTX" (of "NVIDIA RTX A6000") names no generation by itself.
func hardwareNames(product string) []string {
	product = strings.Join(strings.Fields(product), " ")
	if product == "" {
		return nil
	}
	var out []string
	add := func(s string) {
		for _, o := range out {
			if o == s {
				return
			}
		}
		if s != "" {
			out = append(out, s)
		}
	}
	add(product)
	rest, _ := strings.CutPrefix(product, "NVIDIA ")
	add(rest)
	words := strings.Fields(rest)
	for len(words) > 0 {
		switch words[0] {
		case "NVIDIA", "Tesla", "GeForce", "Quadro":
			words = words[1:]
			continue
		}
		break
	}
	if len(words) > 0 {
		model, _, _ := strings.Cut(words[0], "-")
		if strings.ContainsFunc(model, unicode.IsDigit) {
			add(model)
		}
	}
	return out
}
