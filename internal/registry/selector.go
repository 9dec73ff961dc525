package registry

import (
	"fmt"
	"slices"
	"strings"
)

// Label limits, as Kubernetes has them: a key is an optional prefix (a
// DNS subdomain of at most 253 characters) and a slash, then a name of at
// most 63; a value is at most 63 characters, possibly empty.
const (
	MaxLabelPrefix = 253
	MaxLabelName   = 63
	MaxLabelValue  = 63
)

// CheckLabelKey reports what is wrong with k as a label key ("" when
// nothing): [prefix/]name, the name 1 to 63 characters of [A-Za-z0-9-_.]
// that begin and end with a letter or digit, the prefix a lower-case DNS
// subdomain of at most 253 characters.
func CheckLabelKey(k string) string {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if hasPrefix {
		if msg := checkDNSSubdomain(prefix); msg != "" {
			return "its prefix " + msg
		}
	} else {
		name = prefix
	}
	if name == "" {
		return "has no name"
	}
	if len(name) > MaxLabelName {
		return fmt.Sprintf("its name is longer than %d characters", MaxLabelName)
	}
	return checkLabelChars(name, "its name")
}

// CheckLabelValue reports what is wrong with v as a label value ("" when
// nothing): empty, or 1 to 63 characters of [A-Za-z0-9-_.] that begin and
// end with a letter or digit.
func CheckLabelValue(v string) string {
	if v == "" {
		return ""
	}
	if len(v) > MaxLabelValue {
		return fmt.Sprintf("is longer than %d characters", MaxLabelValue)
	}
	return checkLabelChars(v, "it")
}

func checkLabelChars(s, what string) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isAlnum(c):
		case c == '-' || c == '_' || c == '.':
			if i == 0 || i == len(s)-1 {
				return what + " must begin and end with a letter or digit"
			}
		default:
			return fmt.Sprintf("%s has %q, which is not a letter, digit, '-', '_' or '.'", what, rune(c))
		}
	}
	return ""
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// checkDNSSubdomain reports what is wrong with s as a DNS subdomain:
// dot-separated labels of [a-z0-9-], each 1 to 63 characters beginning and
// ending with a letter or digit, 253 characters in all.
func checkDNSSubdomain(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxLabelPrefix {
		return fmt.Sprintf("is longer than %d characters", MaxLabelPrefix)
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || len(part) > 63 {
			return "must be dot-separated parts of 1 to 63 characters"
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			switch {
			case 'a' <= c && c <= 'z' || '0' <= c && c <= '9':
			case c == '-' && i > 0 && i < len(part)-1:
			default:
				return "must be lower-case letters, digits, '-' and '.' (a DNS subdomain)"
			}
		}
	}
	return ""
}

// SelectorOp is the operator of a selector requirement.
type SelectorOp string

// Selector operators, as Kubernetes label selectors write them (== is
// read as =).
const (
	OpEquals    SelectorOp = "="
	OpNotEquals SelectorOp = "!="
	OpIn        SelectorOp = "in"
	OpNotIn     SelectorOp = "notin"
	OpExists    SelectorOp = "exists"
	OpNotExists SelectorOp = "!"
)

// Requirement is one condition of a selector on the label Key. Values has
// one value for = and !=, one or more (sorted, distinct) for in and
// notin, none for exists and !.
type Requirement struct {
	Key    string
	Op     SelectorOp
	Values []string
}

// Selector is a label selector: every requirement must hold (an empty
// selector selects everything).
type Selector []Requirement

// Matches reports whether labels satisfy every requirement. A key that
// is absent satisfies != and notin, as in Kubernetes.
func (s Selector) Matches(labels Labels) bool { return s.matchesWith(labels.Get) }

// matchesWith is Matches with the labels' lookup given.
func (s Selector) matchesWith(get func(key string) (string, bool)) bool {
	for _, r := range s {
		v, ok := get(r.Key)
		var hold bool
		switch r.Op {
		case OpEquals:
			hold = ok && v == r.Values[0]
		case OpNotEquals:
			hold = !ok || v != r.Values[0]
		case OpIn:
			hold = ok && slices.Contains(r.Values, v)
		case OpNotIn:
			hold = !ok || !slices.Contains(r.Values, v)
		case OpExists:
			hold = ok
		case OpNotExists:
			hold = !ok
		}
		if !hold {
			return false
		}
	}
	return true
}

// Unparsed stands for a selector whose text did not parse, in a filter
// whose reader has already reported why: it is still a criterion (a
// cordon by it does not select by omission), and Normalize refuses it.
var Unparsed = Selector{{Op: OpExists}}

// check reports what makes s a selector ParseSelector could not have
// returned ("" when nothing): for selectors built by hand.
func (s Selector) check() string {
	for _, r := range s {
		if msg := CheckLabelKey(r.Key); msg != "" {
			return "names a label key that " + msg
		}
		want := map[SelectorOp]bool{OpEquals: true, OpNotEquals: true}[r.Op]
		switch {
		case want && len(r.Values) != 1,
			(r.Op == OpIn || r.Op == OpNotIn) && len(r.Values) == 0,
			(r.Op == OpExists || r.Op == OpNotExists) && len(r.Values) != 0:
			return "has a requirement on " + r.Key + " with the wrong number of values"
		case !want && r.Op != OpIn && r.Op != OpNotIn && r.Op != OpExists && r.Op != OpNotExists:
			return "has an unknown operator " + string(r.Op)
		}
		for _, v := range r.Values {
			if msg := CheckLabelValue(v); msg != "" {
				return "has a value that " + msg
			}
		}
	}
	return ""
}

// String is the selector in its canonical text: requirements in the
// order given, no blanks but one after the commas of a set, which
// ParseSelector reads back to the same selector.
func (s Selector) String() string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		switch r.Op {
		case OpExists:
			b.WriteString(r.Key)
		case OpNotExists:
			b.WriteString("!" + r.Key)
		case OpEquals, OpNotEquals:
			b.WriteString(r.Key + string(r.Op) + r.Values[0])
		case OpIn, OpNotIn:
			b.WriteString(r.Key + " " + string(r.Op) + " (" + strings.Join(r.Values, ", ") + ")")
		}
	}
	return b.String()
}

// MaxSelector bounds a selector's text.
const MaxSelector = 4096

// SelectorError is what is wrong with a selector's text, and where: Pos
// is the 1-based position (in bytes) of the character at fault.
type SelectorError struct {
	Pos    int
	Reason string
}

func (e *SelectorError) Error() string { return fmt.Sprintf("at position %d: %s", e.Pos, e.Reason) }

// ParseSelector reads a label selector in Kubernetes' syntax:
// requirements separated by commas, each `key=value` (or `==`),
// `key!=value`, `key in (v1,v2)`, `key notin (v1)`, `key` (the label
// exists) or `!key` (it does not); blanks around the parts are ignored.
// "" (or blanks) selects everything. A *SelectorError says where the text
// is wrong.
func ParseSelector(text string) (Selector, error) {
	if len(text) > MaxSelector {
		return nil, &SelectorError{Pos: MaxSelector + 1, Reason: fmt.Sprintf("a selector is at most %d characters", MaxSelector)}
	}
	p := selectorParser{s: text}
	p.blanks()
	if p.i == len(p.s) {
		return Selector{}, nil
	}
	var sel Selector
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		sel = append(sel, r)
		p.blanks()
		if p.i == len(p.s) {
			return sel, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.fail("expected ',' or the end after a requirement, found %q", p.rest())
		}
		p.i++
		p.blanks()
		if p.i == len(p.s) {
			return nil, p.fail("expected a requirement after ','")
		}
	}
}

type selectorParser struct {
	s string
	i int
}

func (p *selectorParser) fail(format string, args ...any) error {
	return &SelectorError{Pos: p.i + 1, Reason: fmt.Sprintf(format, args...)}
}

// rest is what is left, shortened for a message.
func (p *selectorParser) rest() string {
	r := p.s[p.i:]
	if len(r) > 20 {
		r = r[:20] + "…"
	}
	return r
}

func (p *selectorParser) blanks() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// word reads a run of the characters keys and values are made of.
func (p *selectorParser) word() (string, int) {
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' && c != '/' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], start
}

func (p *selectorParser) key() (string, error) {
	k, at := p.word()
	if k == "" {
		return "", p.fail("expected a label key, found %q", p.rest())
	}
	if msg := CheckLabelKey(k); msg != "" {
		return "", &SelectorError{Pos: at + 1, Reason: fmt.Sprintf("label key %q %s", k, msg)}
	}
	return k, nil
}

func (p *selectorParser) value() (string, error) {
	v, at := p.word()
	if msg := CheckLabelValue(v); msg != "" || strings.Contains(v, "/") {
		if msg == "" {
			msg = "has '/', which a value may not"
		}
		return "", &SelectorError{Pos: at + 1, Reason: fmt.Sprintf("label value %q %s", v, msg)}
	}
	return v, nil
}

func (p *selectorParser) requirement() (Requirement, error) {
	if p.s[p.i] == '!' {
		p.i++
		p.blanks()
		k, err := p.key()
		return Requirement{Key: k, Op: OpNotExists}, err
	}
	k, err := p.key()
	if err != nil {
		return Requirement{}, err
	}
	p.blanks()
	switch {
	case p.i == len(p.s) || p.s[p.i] == ',':
		return Requirement{Key: k, Op: OpExists}, nil
	case strings.HasPrefix(p.s[p.i:], "!="):
		p.i += 2
		p.blanks()
		v, err := p.value()
		return Requirement{Key: k, Op: OpNotEquals, Values: []string{v}}, err
	case strings.HasPrefix(p.s[p.i:], "=="):
		p.i += 2
	case p.s[p.i] == '=':
		p.i++
	default:
		op, at := p.word()
		if op != "in" && op != "notin" {
			p.i = at
			return Requirement{}, p.fail("expected '=', '==', '!=', 'in', 'notin', ',' or the end after the key %q, found %q", k, p.rest())
		}
		values, err := p.set()
		return Requirement{Key: k, Op: SelectorOp(op), Values: values}, err
	}
	p.blanks()
	v, err := p.value()
	return Requirement{Key: k, Op: OpEquals, Values: []string{v}}, err
}

// set reads "(v1, v2, ...)": at least one value; they come back sorted
// and distinct.
func (p *selectorParser) set() ([]string, error) {
	p.blanks()
	if p.i == len(p.s) || p.s[p.i] != '(' {
		return nil, p.fail("expected '(' to open the set of values, found %q", p.rest())
	}
	p.i++
	var values []string
	for {
		p.blanks()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		values = append(values, v)
		p.blanks()
		switch {
		case p.i == len(p.s):
			return nil, p.fail("expected ')' to close the set of values")
		case p.s[p.i] == ',':
			p.i++
		case p.s[p.i] == ')':
			p.i++
			slices.Sort(values)
			return slices.Compact(values), nil
		default:
			return nil, p.fail("expected ',' or ')' in the set of values, found %q", p.rest())
		}
	}
}
