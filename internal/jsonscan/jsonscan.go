// Package jsonscan reads JSON objects more strictly than encoding/json,
// for text that comes from outside: request bodies (internal/api) and the
// header and claims of bearer tokens (internal/auth).
//
// In one pass over the bytes, checking the grammar of RFC 8259, it
// refuses a member name given twice (encoding/json lets the last one
// win), bounds nesting and the number of members before they cost memory,
// and finds strings that are not Unicode text: bytes that are not UTF-8,
// and \u escapes of UTF-16 surrogates without their other half, which
// encoding/json silently turns into U+FFFD. Member values are left raw,
// slices of the input, so that each caller can hold every field to its
// exact JSON type and name it in errors.
//
// It imports only the standard library.
package jsonscan

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Options bound what Object and Elements accept.
type Options struct {
	// MaxDepth is how many levels arrays and objects may nest, the
	// outermost counting as one; required (> 0).
	MaxDepth int
	// MaxMembers bounds the members of the top object; 0 means no bound.
	MaxMembers int
	// NestedDuplicates refuses a member name given twice in objects below
	// the top one too; names of the top object are always unique.
	NestedDuplicates bool
}

// Member is one member of an object.
type Member struct {
	Name  string
	Value []byte // raw JSON, a slice of the input
	// Text is the first string inside Value (or member name inside it)
	// that is not Unicode text, or nil. Object does not refuse such
	// values, so that a caller may name every member that has one.
	Text *TextError
}

// Kind is what an Error is about.
type Kind int

// The kinds of Error.
const (
	Syntax         Kind = iota + 1 // not JSON; Detail says where and what
	NotObject                      // JSON, but not an object (Object)
	NotArray                       // not an array (Elements)
	Trailing                       // something after the value
	TooDeep                        // nested more than Options.MaxDepth levels
	TooManyMembers                 // more than Options.MaxMembers members
	Duplicate                      // the member Name given twice
	BadName                        // a member name of the top object is not Unicode text; see Text
)

// Error says why Object or Elements refused their input.
type Error struct {
	Kind   Kind
	Offset int        // where in the input it was found
	Detail string     // Syntax: e.g. "at byte 7: unexpected '}' after a member name", or "it ends too early"
	Name   string     // Duplicate: the name, decoded
	Text   *TextError // BadName
	Limit  int        // TooDeep, TooManyMembers: the bound passed
}

func (e *Error) Error() string {
	switch e.Kind {
	case Syntax:
		return "jsonscan: not valid JSON (" + e.Detail + ")"
	case NotObject:
		return "jsonscan: not a JSON object"
	case NotArray:
		return "jsonscan: not a JSON array"
	case Trailing:
		return "jsonscan: data after the value"
	case TooDeep:
		return fmt.Sprintf("jsonscan: nests more than %d levels deep", e.Limit)
	case TooManyMembers:
		return fmt.Sprintf("jsonscan: more than %d members", e.Limit)
	case Duplicate:
		return fmt.Sprintf("jsonscan: the member %q is given more than once", e.Name)
	case BadName:
		return "jsonscan: a member name is not Unicode text (" + e.Text.Error() + ")"
	}
	return "jsonscan: invalid input"
}

// TextError describes a string that is not Unicode text.
type TextError struct {
	Offset int
	// Escape is the \u escape of a UTF-16 surrogate found without its
	// other half; 0 when the string holds bytes that are not UTF-8.
	Escape rune
}

func (e *TextError) Error() string {
	switch {
	case e.Escape == 0:
		return "it holds bytes that are not UTF-8"
	case e.Escape >= 0xdc00:
		return fmt.Sprintf("the escape \\u%04x is the second half of a UTF-16 surrogate pair without the first", e.Escape)
	default:
		return fmt.Sprintf("the escape \\u%04x is the first half of a UTF-16 surrogate pair without the second", e.Escape)
	}
}

// Object reads data as exactly one JSON object, optionally surrounded by
// whitespace, calling member with each of its members in order. It
// refuses, with an *Error: anything but JSON, a value that is not an
// object, anything after it, nesting beyond opts.MaxDepth, more than
// opts.MaxMembers members, a member name given twice, and a member name
// that is not Unicode text. Strings in values that are not Unicode text
// are reported in their Member's Text, not refused. An error member
// returns ends the scan and is returned as it is.
func Object(data []byte, opts Options, member func(Member) error) error {
	s := scanner{data: data, opts: opts}
	s.skipSpace()
	if s.pos == len(data) {
		return s.syntax("")
	}
	if c := data[s.pos]; c != '{' {
		if !startsValue(c) {
			return s.syntax("looking for the beginning of a value")
		}
		return &Error{Kind: NotObject, Offset: s.pos}
	}
	if opts.MaxDepth < 1 {
		return &Error{Kind: TooDeep, Offset: s.pos, Limit: opts.MaxDepth}
	}
	err := s.object(1, func(name string, value []byte, text *TextError) error {
		return member(Member{Name: name, Value: value, Text: text})
	})
	if err != nil {
		return err
	}
	return s.end()
}

// Elements reads data as one JSON array, optionally surrounded by
// whitespace, calling fn with each element (raw JSON, a slice of data) in
// turn until fn returns false. It refuses what Object would, NotArray
// instead of NotObject, but not strings that are not Unicode text. It
// reads nothing after the element for which fn returned false: a caller
// that needs only the first few elements of a long array pays for those
// alone.
func Elements(data []byte, opts Options, fn func(elem []byte) bool) error {
	s := scanner{data: data, opts: opts}
	s.skipSpace()
	if s.pos == len(data) {
		return s.syntax("")
	}
	if c := data[s.pos]; c != '[' {
		if !startsValue(c) {
			return s.syntax("looking for the beginning of a value")
		}
		return &Error{Kind: NotArray, Offset: s.pos}
	}
	if opts.MaxDepth < 1 {
		return &Error{Kind: TooDeep, Offset: s.pos, Limit: opts.MaxDepth}
	}
	stopped := false
	_, err := s.array(1, func(elem []byte) bool {
		if !fn(elem) {
			stopped = true
		}
		return !stopped
	})
	if err != nil || stopped {
		return err
	}
	return s.end()
}

// scanner walks a JSON text.
type scanner struct {
	data []byte
	pos  int
	opts Options
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// end refuses anything but whitespace after the value.
func (s *scanner) end() error {
	s.skipSpace()
	if s.pos != len(s.data) {
		return &Error{Kind: Trailing, Offset: s.pos}
	}
	return nil
}

func startsValue(c byte) bool {
	return c == '{' || c == '[' || c == '"' || c == '-' || c == 't' || c == 'f' || c == 'n' || c >= '0' && c <= '9'
}

// syntax is the error for the byte at s.pos, or for input that ends early.
func (s *scanner) syntax(context string) error {
	if s.pos >= len(s.data) {
		return &Error{Kind: Syntax, Offset: s.pos, Detail: "it ends too early"}
	}
	c := s.data[s.pos]
	what := fmt.Sprintf("byte 0x%02x", c)
	if c >= 0x20 && c < 0x7f {
		what = strconv.QuoteRune(rune(c))
	}
	msg := "unexpected " + what
	if context != "" {
		msg += " " + context
	}
	return &Error{Kind: Syntax, Offset: s.pos, Detail: fmt.Sprintf("at byte %d: %s", s.pos, msg)}
}

// value scans one value at s.pos, at nesting level depth should it be an
// array or object, and returns the first string inside it that is not
// Unicode text.
func (s *scanner) value(depth int) (*TextError, error) {
	if s.pos == len(s.data) {
		return nil, s.syntax("")
	}
	switch c := s.data[s.pos]; {
	case c == '"':
		_, text, err := s.str(false)
		return text, err
	case c == '{' || c == '[':
		if depth > s.opts.MaxDepth {
			return nil, &Error{Kind: TooDeep, Offset: s.pos, Limit: s.opts.MaxDepth}
		}
		if c == '[' {
			return s.array(depth, nil)
		}
		var first *TextError
		err := s.object(depth, func(_ string, _ []byte, text *TextError) error {
			first = firstOf(first, text)
			return nil
		})
		return first, err
	case c == '-' || c >= '0' && c <= '9':
		return nil, s.number()
	case c == 't':
		return nil, s.literal("true")
	case c == 'f':
		return nil, s.literal("false")
	case c == 'n':
		return nil, s.literal("null")
	}
	return nil, s.syntax("looking for the beginning of a value")
}

func firstOf(errs ...*TextError) *TextError {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// object scans the object at s.pos, at nesting level depth, calling
// member with each member once its value is scanned; text is the first
// string in the member's name or value that is not Unicode text. Names are
// decoded, and checked for duplicates, in the top object (depth 1) and,
// with Options.NestedDuplicates, in every object. A name of the top object
// that is not text is refused: the caller could not show it, as a
// duplicate or otherwise.
func (s *scanner) object(depth int, member func(name string, value []byte, text *TextError) error) error {
	top := depth == 1
	decode := top || s.opts.NestedDuplicates
	var seen names
	s.pos++ // {
	for n := 0; ; n++ {
		s.skipSpace()
		if s.pos == len(s.data) {
			return s.syntax("")
		}
		if n == 0 && s.data[s.pos] == '}' {
			s.pos++
			return nil
		}
		if s.data[s.pos] != '"' {
			return s.syntax("looking for the beginning of a member name")
		}
		if top && s.opts.MaxMembers > 0 && n == s.opts.MaxMembers {
			return &Error{Kind: TooManyMembers, Offset: s.pos, Limit: s.opts.MaxMembers}
		}
		at := s.pos
		name, nameText, err := s.str(decode)
		if err != nil {
			return err
		}
		if top && nameText != nil {
			return &Error{Kind: BadName, Offset: nameText.Offset, Text: nameText}
		}
		if decode && seen.add(name) {
			return &Error{Kind: Duplicate, Offset: at, Name: name}
		}
		s.skipSpace()
		if s.pos == len(s.data) {
			return s.syntax("")
		}
		if s.data[s.pos] != ':' {
			return s.syntax("after a member name")
		}
		s.pos++
		s.skipSpace()
		start := s.pos
		text, err := s.value(depth + 1)
		if err != nil {
			return err
		}
		if err := member(name, s.data[start:s.pos], firstOf(nameText, text)); err != nil {
			return err
		}
		s.skipSpace()
		if s.pos == len(s.data) {
			return s.syntax("")
		}
		switch s.data[s.pos] {
		case '}':
			s.pos++
			return nil
		case ',':
			s.pos++
		default:
			return s.syntax("after a member value")
		}
	}
}

// names are the member names of one object seen so far: the first few in
// an array (on the stack, no allocation), all of them in a map once there
// are more.
type names struct {
	few  [16]string
	n    int
	many map[string]struct{}
}

// add records name and reports whether it was there already.
func (ns *names) add(name string) (dup bool) {
	if ns.many == nil {
		if slices.Contains(ns.few[:ns.n], name) {
			return true
		}
		if ns.n < len(ns.few) {
			ns.few[ns.n] = name
			ns.n++
			return false
		}
		ns.many = make(map[string]struct{}, 2*len(ns.few))
		for _, n := range ns.few {
			ns.many[n] = struct{}{}
		}
	}
	if _, ok := ns.many[name]; ok {
		return true
	}
	ns.many[name] = struct{}{}
	return false
}

// array scans the array at s.pos, at nesting level depth, calling elem
// (when not nil) with each element until it returns false.
func (s *scanner) array(depth int, elem func([]byte) bool) (*TextError, error) {
	var first *TextError
	s.pos++ // [
	for i := 0; ; i++ {
		s.skipSpace()
		if s.pos == len(s.data) {
			return nil, s.syntax("")
		}
		if i == 0 && s.data[s.pos] == ']' {
			s.pos++
			return first, nil
		}
		start := s.pos
		text, err := s.value(depth + 1)
		if err != nil {
			return nil, err
		}
		first = firstOf(first, text)
		if elem != nil && !elem(s.data[start:s.pos]) {
			return first, nil
		}
		s.skipSpace()
		if s.pos == len(s.data) {
			return nil, s.syntax("")
		}
		switch s.data[s.pos] {
		case ']':
			s.pos++
			return first, nil
		case ',':
			s.pos++
		default:
			return nil, s.syntax("after a value")
		}
	}
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		for i := 0; i < len(word) && s.pos < len(s.data) && s.data[s.pos] == word[i]; i++ {
			s.pos++
		}
		return s.syntax("in a literal (true, false or null)")
	}
	s.pos += len(word)
	return nil
}

func (s *scanner) number() error {
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.data[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(s.data) && s.data[s.pos] == '0':
		s.pos++
	case digits() == 0:
		return s.syntax("in a number")
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if digits() == 0 {
			return s.syntax("after a decimal point")
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			return s.syntax("in an exponent")
		}
	}
	return nil
}

// str scans the string at s.pos. With decode set it returns its decoded
// text (a string holding no escape costs one copy). text is the first
// thing in it that is not Unicode text, or nil.
func (s *scanner) str(decode bool) (out string, text *TextError, err error) {
	s.pos++ // the opening quote
	start := s.pos
	var buf []byte // the decoded text, once an escape made it differ from the input
	escaped := false
	for {
		// Plain ASCII runs, most of any string, need no decision per byte.
		i := s.pos
		for i < len(s.data) && s.data[i] >= 0x20 && s.data[i] < utf8.RuneSelf && s.data[i] != '"' && s.data[i] != '\\' {
			i++
		}
		if decode && escaped {
			buf = append(buf, s.data[s.pos:i]...)
		}
		s.pos = i
		if s.pos == len(s.data) {
			return "", nil, s.syntax("")
		}
		switch c := s.data[s.pos]; {
		case c == '"':
			end := s.pos
			s.pos++
			switch {
			case !decode:
				return "", text, nil
			case escaped:
				return string(buf), text, nil
			}
			return string(s.data[start:end]), text, nil
		case c < 0x20:
			return "", nil, s.syntax("in a string (control characters must be escaped)")
		case c == '\\':
			if decode && !escaped {
				escaped = true
				buf = append(buf, s.data[start:s.pos]...)
			}
			at := s.pos
			r, bad, err := s.escape()
			if err != nil {
				return "", nil, err
			}
			if bad != 0 && text == nil {
				text = &TextError{Offset: at, Escape: bad}
			}
			if decode {
				buf = utf8.AppendRune(buf, r)
			}
		default:
			r, size := utf8.DecodeRune(s.data[s.pos:])
			if r == utf8.RuneError && size == 1 && text == nil {
				text = &TextError{Offset: s.pos}
			}
			if decode && escaped {
				buf = append(buf, s.data[s.pos:s.pos+size]...)
			}
			s.pos += size
		}
	}
}

// escape reads the escape sequence at s.pos (at its backslash). A high
// surrogate escape takes the low one that must follow it; bad is a
// surrogate escape without its other half, or 0.
func (s *scanner) escape() (r, bad rune, err error) {
	s.pos++
	if s.pos == len(s.data) {
		return 0, 0, s.syntax("")
	}
	switch s.data[s.pos] {
	case '"', '\\', '/':
		r = rune(s.data[s.pos])
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		s.pos++
		r, err = s.hex4()
		if err != nil {
			return 0, 0, err
		}
		switch {
		case r >= 0xdc00 && r < 0xe000: // a low surrogate with no high one before it
			return utf8.RuneError, r, nil
		case r >= 0xd800 && r < 0xdc00: // a high surrogate: its low one must follow
			if s.pos+1 < len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
				save := s.pos
				s.pos += 2
				r2, err := s.hex4()
				if err != nil {
					return 0, 0, err
				}
				if r2 >= 0xdc00 && r2 < 0xe000 {
					return utf16.DecodeRune(r, r2), 0, nil
				}
				s.pos = save // not a pair: the next escape is read on its own
			}
			return utf8.RuneError, r, nil
		}
		return r, 0, nil
	default:
		return 0, 0, s.syntax("in an escape sequence")
	}
	s.pos++
	return r, 0, nil
}

// hex4 reads the four hex digits of a \u escape.
func (s *scanner) hex4() (rune, error) {
	var r rune
	for range 4 {
		if s.pos == len(s.data) {
			return 0, s.syntax("")
		}
		c := s.data[s.pos]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, s.syntax("in a \\u escape (four hex digits)")
		}
		s.pos++
	}
	return r, nil
}
