package registry

import (
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"unique"
)

// MaxLabels bounds the labels admins and agents give one node. Labels an
// import sets (see ReservedLabel) come on top: a provider sets a handful.
const MaxLabels = 32

// MaxStoredLabels bounds a node's labels of every kind; the database holds
// rows to it.
const MaxStoredLabels = 48

// ReservedDomain is the label prefix domain of the imports: a key whose
// prefix is it or one of its subdomains (scp.registryd.io/region) is set
// only by an import.
const ReservedDomain = "registryd.io"

// ProviderLabelPrefix is the prefix of the labels the import of source
// sets: scp.registryd.io/ for scp.
func ProviderLabelPrefix(source string) string { return source + "." + ReservedDomain + "/" }

// ReservedLabel reports whether key belongs to an import: its prefix is
// ReservedDomain or a subdomain of it.
func ReservedLabel(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	return ok && (prefix == ReservedDomain || strings.HasSuffix(prefix, "."+ReservedDomain))
}

// Labels is a node's set of labels: keys and values in Kubernetes label
// syntax (CheckLabelKey, CheckLabelValue). It is held as its document, a
// JSON object with keys in byte order; label syntax needs no escapes. The
// zero value has no labels; equal sets are equal values (==). Texts are
// interned, so the many nodes of one host or pool share one.
type Labels struct{ text string }

// MakeLabels validates m and returns it as Labels. The error names the
// first bad key in key order.
func MakeLabels(m map[string]string) (Labels, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	pairs := make([]Label, len(keys))
	for i, k := range keys {
		pairs[i] = Label{k, m[k]}
	}
	return makeLabels(pairs)
}

// Label is one label.
type Label struct{ Key, Value string }

// makeLabels builds Labels from pairs sorted by key, keys distinct.
func makeLabels(pairs []Label) (Labels, error) {
	if len(pairs) > MaxStoredLabels {
		return Labels{}, fmt.Errorf("a node has at most %d labels", MaxStoredLabels)
	}
	if len(pairs) == 0 {
		return Labels{}, nil
	}
	size := 1
	for _, p := range pairs {
		if msg := CheckLabelKey(p.Key); msg != "" {
			return Labels{}, fmt.Errorf("label key %q %s", p.Key, msg)
		}
		if msg := CheckLabelValue(p.Value); msg != "" {
			return Labels{}, fmt.Errorf("the value of label %q %s", p.Key, msg)
		}
		size += len(p.Key) + len(p.Value) + 6
	}
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, p := range pairs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, p.Key...)
		b = append(b, `":"`...)
		b = append(b, p.Value...)
		b = append(b, '"')
	}
	b = append(b, '}')
	return Labels{unique.Make(string(b)).Value()}, nil
}

// ParseLabels reads a JSON object of string values as Labels: the body of
// a write (after its checks), a stored document or PostgreSQL's text of a
// jsonb column. null is no labels.
func ParseLabels(b []byte) (Labels, error) {
	if pairs, ok := scanPlainObject(b); ok {
		slices.SortFunc(pairs, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
		for i := 1; i < len(pairs); i++ {
			if pairs[i].Key == pairs[i-1].Key {
				return Labels{}, fmt.Errorf("label key %q appears more than once", pairs[i].Key)
			}
		}
		return makeLabels(pairs)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return Labels{}, fmt.Errorf("labels must be an object of strings")
	}
	return MakeLabels(m)
}

// scanPlainObject reads an object of strings without escapes (every
// stored label set), blanks allowed; false for anything else, which
// ParseLabels leaves to encoding/json.
func scanPlainObject(b []byte) ([]Label, bool) {
	i := 0
	blanks := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	str := func() (string, bool) {
		if i >= len(b) || b[i] != '"' {
			return "", false
		}
		start := i + 1
		for j := start; j < len(b); j++ {
			switch c := b[j]; {
			case c == '"':
				i = j + 1
				return string(b[start:j]), true
			case c == '\\' || c < 0x20:
				return "", false
			}
		}
		return "", false
	}
	blanks()
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i++
	blanks()
	var pairs []Label
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			blanks()
			k, ok := str()
			if !ok {
				return nil, false
			}
			blanks()
			if i >= len(b) || b[i] != ':' {
				return nil, false
			}
			i++
			blanks()
			v, ok := str()
			if !ok {
				return nil, false
			}
			pairs = append(pairs, Label{k, v})
			blanks()
			if i >= len(b) {
				return nil, false
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return nil, false
			}
			i++
		}
	}
	blanks()
	return pairs, i == len(b)
}

// Len is the number of labels.
func (l Labels) Len() int {
	if l.text == "" {
		return 0
	}
	return strings.Count(l.text, `":"`)
}

// All yields the labels in key order.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if l.text == "" {
			return
		}
		s := l.text[1 : len(l.text)-1] // "k":"v","k2":"v2"
		for s != "" {
			// Keys and values hold no quotes: split at the next three.
			k, rest, _ := strings.Cut(s[1:], `":"`)
			v, rest, _ := strings.Cut(rest, `"`)
			if !yield(k, v) {
				return
			}
			s = strings.TrimPrefix(rest, ",")
		}
	}
}

// Get returns the value of label key and whether the node has it.
func (l Labels) Get(key string) (string, bool) {
	for k, v := range l.All() {
		if k == key {
			return v, true
		}
		if k > key {
			break
		}
	}
	return "", false
}

// Map returns the labels as a new map.
func (l Labels) Map() map[string]string {
	m := make(map[string]string, l.Len())
	for k, v := range l.All() {
		m[k] = v
	}
	return m
}

// String is the labels' document, {} when there are none.
func (l Labels) String() string {
	if l.text == "" {
		return "{}"
	}
	return l.text
}

// AppendJSON appends the labels' document to b.
func (l Labels) AppendJSON(b []byte) []byte { return append(b, l.String()...) }

// MarshalJSON is the labels' document.
func (l Labels) MarshalJSON() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalJSON reads a document written by MarshalJSON (or any object of
// valid labels); null is no labels.
func (l *Labels) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*l = Labels{}
		return nil
	}
	v, err := ParseLabels(b)
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// own counts the labels that are not reserved.
func (l Labels) own() int {
	n := 0
	for k := range l.All() {
		if !ReservedLabel(k) {
			n++
		}
	}
	return n
}

// LabelPatch is a write's labels. A full write (PUT) replaces the node's
// own labels with Values; a merge (PATCH) sets each key of Values and
// removes those whose value is nil. Reserved labels (ReservedLabel) stay
// as the import set them: a write may echo them unchanged, nothing more.
type LabelPatch struct {
	Set     bool // labels was in the body
	Replace bool
	Values  map[string]*string
}

// Apply returns cur with the patch applied, or an error naming the label
// at fault.
func (p LabelPatch) Apply(cur Labels) (Labels, error) {
	if !p.Set {
		return cur, nil
	}
	m := cur.Map()
	if p.Replace {
		for k := range m {
			if !ReservedLabel(k) {
				delete(m, k)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(p.Values)) {
		v := p.Values[k]
		if ReservedLabel(k) {
			old, ok := m[k]
			if v == nil || !ok || old != *v {
				return Labels{}, fmt.Errorf("label %q is set by the import of the node's provider (keys under %s are read-only); send it back unchanged or leave it out", k, ReservedDomain)
			}
			continue
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = *v
		}
	}
	out, err := MakeLabels(m)
	if err != nil {
		return Labels{}, err
	}
	if n := out.own(); n > MaxLabels {
		return Labels{}, fmt.Errorf("a node has at most %d labels besides its provider's; this write leaves %d", MaxLabels, n)
	}
	return out, nil
}

// WithReserved returns l's own labels and imported's reserved ones: what
// an import pass leaves on a node it updates. Reserved labels of l that
// imported lacks are dropped; own labels of imported are ignored.
func (l Labels) WithReserved(imported Labels) Labels {
	if l.own() == 0 && imported.own() == 0 {
		return imported // the common case: an imported node without labels of its own
	}
	var pairs []Label
	for k, v := range l.All() {
		if !ReservedLabel(k) {
			pairs = append(pairs, Label{k, v})
		}
	}
	for k, v := range imported.All() {
		if ReservedLabel(k) {
			pairs = append(pairs, Label{k, v})
		}
	}
	slices.SortFunc(pairs, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	out, err := makeLabels(pairs)
	if err != nil {
		// Both sets were valid and disjoint; only the total can be too
		// many, and an import's own labels win then.
		out, _ = makeLabels(slices.DeleteFunc(pairs, func(p Label) bool { return !ReservedLabel(p.Key) }))
	}
	return out
}

// Equal reports whether l and o are the same labels (l == o), for
// comparisons that cannot see the unexported text (go-cmp).
func (l Labels) Equal(o Labels) bool { return l == o }
