package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/registry"
)

// MaxBodyBytes caps every request body; larger bodies get 413.
const MaxBodyBytes = 1 << 20

// MaxBodyMembers caps the members of a request body's object. No object the
// API accepts has more than 16, so this is a rule of the protocol, not a
// capacity knob; it stops a body of 90,000 unknown keys after the 65th key,
// before the keys cost memory or fill an error response.
const MaxBodyMembers = 64

// maxBodyDepth caps how deeply arrays and objects nest inside a body. The
// API's deepest accepted body is an object holding an array of integers.
const maxBodyDepth = 32

// object is a decoded JSON object whose members are still raw, so each field
// can be checked for its exact JSON type and named in errors.
type object map[string]json.RawMessage

// decodeObject reads the request body as one JSON object. It refuses bodies
// over MaxBodyBytes (413), media types other than JSON (415), malformed JSON,
// anything but an object, more than MaxBodyMembers members, duplicate
// members, text that is not valid Unicode and trailing data (400). With
// optional set, an empty body decodes as an empty object.
func decodeObject(w http.ResponseWriter, r *http.Request, optional bool) (object, error) {
	if err := checkContentType(r); err != nil {
		return nil, err
	}
	body, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if optional {
			return object{}, nil
		}
		return nil, badRequest("the request body must be a JSON object")
	}
	return parseObject(body)
}

// readBody reads the whole body into one buffer sized from Content-Length,
// so a 1 MiB body costs 1 MiB, not the several a growing buffer leaves
// behind.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	size := 512
	if r.ContentLength > 0 {
		size = int(min(r.ContentLength, MaxBodyBytes)) + 1 // +1: room to see EOF
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(cap(buf), MaxBodyBytes))
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, &httpError{status: http.StatusRequestEntityTooLarge,
					detail: fmt.Sprintf("the request body is larger than %d bytes", MaxBodyBytes)}
			}
			return nil, &httpError{status: http.StatusBadRequest, detail: "the request body could not be read"}
		}
	}
}

// parseObject decodes exactly one JSON object. Beyond JSON's own grammar it
// refuses duplicate members, more than MaxBodyMembers members, nesting
// deeper than maxBodyDepth, and strings that are not valid Unicode text:
// bytes that are not UTF-8, and \u escapes of UTF-16 surrogates that do not
// form a pair. encoding/json would turn such text into U+FFFD and the
// registry would store something other than what was sent. A bad member
// value is named in the error; a bad member name refuses the body without
// echoing it.
func parseObject(body []byte) (object, error) {
	sc := scanner{data: body}
	sc.skipSpace()
	if sc.pos == len(body) {
		return nil, badRequest("the request body must be a JSON object")
	}
	if c := body[sc.pos]; c != '{' {
		if !startsValue(c) {
			return nil, sc.syntax("looking for the beginning of a value")
		}
		return nil, badRequest("the request body must be a JSON object")
	}
	sc.pos++
	obj := object{}
	var textErrs registry.FieldErrors
	for first := true; ; first = false {
		sc.skipSpace()
		if sc.pos == len(body) {
			return nil, sc.syntax("")
		}
		if first && body[sc.pos] == '}' {
			sc.pos++
			break
		}
		if body[sc.pos] != '"' {
			return nil, sc.syntax("looking for the beginning of a member name")
		}
		if len(obj) == MaxBodyMembers {
			return nil, badRequest(fmt.Sprintf("the request body has more than %d members; no request takes that many", MaxBodyMembers))
		}
		key, bad, err := sc.str(true)
		if err != nil {
			return nil, err
		}
		if bad != "" {
			// Not echoed: the name is not text a problem document can carry.
			return nil, badRequest("a member name of the request body is not valid Unicode text (" + bad + ")")
		}
		name := string(key)
		if _, dup := obj[name]; dup {
			return nil, fieldError(name, "appears more than once")
		}
		sc.skipSpace()
		if sc.pos == len(body) {
			return nil, sc.syntax("")
		}
		if body[sc.pos] != ':' {
			return nil, sc.syntax("after a member name")
		}
		sc.pos++
		sc.skipSpace()
		start := sc.pos
		bad, err = sc.value(1)
		if err != nil {
			return nil, err
		}
		if bad != "" {
			textErrs.Add(name, "must be valid Unicode text, but %s", bad)
		}
		obj[name] = json.RawMessage(body[start:sc.pos])
		sc.skipSpace()
		if sc.pos == len(body) {
			return nil, sc.syntax("")
		}
		if body[sc.pos] == '}' {
			sc.pos++
			break
		}
		if body[sc.pos] != ',' {
			return nil, sc.syntax("after a member value")
		}
		sc.pos++
	}
	sc.skipSpace()
	if sc.pos != len(body) {
		return nil, badRequest("the request body must hold a single JSON object and nothing after it")
	}
	if err := textErrs.Err(); err != nil {
		return nil, err
	}
	return obj, nil
}

// scanner walks a JSON text. It checks the grammar of RFC 8259 and the
// text of every string, and decodes member names; values are left raw for
// the field readers.
type scanner struct {
	data []byte
	pos  int
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

func startsValue(c byte) bool {
	return c == '{' || c == '[' || c == '"' || c == '-' || c == 't' || c == 'f' || c == 'n' || c >= '0' && c <= '9'
}

// syntax is the error for the byte at s.pos, or for a body that ends early.
func (s *scanner) syntax(context string) error {
	if s.pos >= len(s.data) {
		return badRequest("the request body is not valid JSON (it ends too early)")
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
	return badRequest(fmt.Sprintf("the request body is not valid JSON (at byte %d: %s)", s.pos, msg))
}

// value scans one value at s.pos. bad describes the first string inside it
// that is not valid Unicode text, or is "".
func (s *scanner) value(depth int) (bad string, err error) {
	if s.pos == len(s.data) {
		return "", s.syntax("")
	}
	switch c := s.data[s.pos]; {
	case c == '"':
		_, bad, err := s.str(false)
		return bad, err
	case c == '{' || c == '[':
		if depth >= maxBodyDepth {
			return "", badRequest(fmt.Sprintf("the request body nests arrays and objects more than %d deep", maxBodyDepth))
		}
		return s.composite(depth)
	case c == '-' || c >= '0' && c <= '9':
		return "", s.number()
	case c == 't':
		return "", s.literal("true")
	case c == 'f':
		return "", s.literal("false")
	case c == 'n':
		return "", s.literal("null")
	}
	return "", s.syntax("looking for the beginning of a value")
}

// composite scans an array or object nested in a member's value.
func (s *scanner) composite(depth int) (bad string, err error) {
	isObject := s.data[s.pos] == '{'
	end := byte(']')
	if isObject {
		end = '}'
	}
	s.pos++
	for first := true; ; first = false {
		s.skipSpace()
		if s.pos == len(s.data) {
			return "", s.syntax("")
		}
		if first && s.data[s.pos] == end {
			s.pos++
			return bad, nil
		}
		if isObject {
			if s.data[s.pos] != '"' {
				return "", s.syntax("looking for the beginning of a member name")
			}
			_, b, err := s.str(false)
			if err != nil {
				return "", err
			}
			bad = cmp.Or(bad, b)
			s.skipSpace()
			if s.pos == len(s.data) {
				return "", s.syntax("")
			}
			if s.data[s.pos] != ':' {
				return "", s.syntax("after a member name")
			}
			s.pos++
			s.skipSpace()
		}
		b, err := s.value(depth + 1)
		if err != nil {
			return "", err
		}
		bad = cmp.Or(bad, b)
		s.skipSpace()
		if s.pos == len(s.data) {
			return "", s.syntax("")
		}
		switch s.data[s.pos] {
		case end:
			s.pos++
			return bad, nil
		case ',':
			s.pos++
		default:
			return "", s.syntax("after a value")
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
// text. bad describes the first thing in it that is not valid Unicode
// text (bytes that are not UTF-8, a surrogate escape without its other
// half), or is "".
func (s *scanner) str(decode bool) (text []byte, bad string, err error) {
	s.pos++ // the opening quote
	for {
		// Plain ASCII runs, most of any string, need no decision per byte.
		i := s.pos
		for i < len(s.data) && s.data[i] >= 0x20 && s.data[i] < utf8.RuneSelf && s.data[i] != '"' && s.data[i] != '\\' {
			i++
		}
		if decode {
			text = append(text, s.data[s.pos:i]...)
		}
		s.pos = i
		if s.pos == len(s.data) {
			return nil, "", s.syntax("")
		}
		switch c := s.data[s.pos]; {
		case c == '"':
			s.pos++
			return text, bad, nil
		case c < 0x20:
			return nil, "", s.syntax("in a string (control characters must be escaped)")
		case c == '\\':
			r, b, err := s.escape()
			if err != nil {
				return nil, "", err
			}
			bad = cmp.Or(bad, b)
			if decode {
				text = utf8.AppendRune(text, r)
			}
		default:
			r, size := utf8.DecodeRune(s.data[s.pos:])
			if r == utf8.RuneError && size == 1 {
				bad = cmp.Or(bad, "it holds bytes that are not UTF-8")
			}
			if decode {
				text = append(text, s.data[s.pos:s.pos+size]...)
			}
			s.pos += size
		}
	}
}

// escape reads the escape sequence at s.pos (at its backslash). A high
// surrogate escape takes the low one that must follow it.
func (s *scanner) escape() (r rune, bad string, err error) {
	s.pos++
	if s.pos == len(s.data) {
		return 0, "", s.syntax("")
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
			return 0, "", err
		}
		switch {
		case r >= 0xdc00 && r < 0xe000: // a low surrogate with no high one before it
			return utf8.RuneError, fmt.Sprintf("the escape \\u%04x is the second half of a UTF-16 surrogate pair without the first", r), nil
		case r >= 0xd800 && r < 0xdc00: // a high surrogate: its low one must follow
			if s.pos+1 < len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
				save := s.pos
				s.pos += 2
				r2, err := s.hex4()
				if err != nil {
					return 0, "", err
				}
				if r2 >= 0xdc00 && r2 < 0xe000 {
					return utf16.DecodeRune(r, r2), "", nil
				}
				s.pos = save // not a pair: the next escape is read on its own
			}
			return utf8.RuneError, fmt.Sprintf("the escape \\u%04x is the first half of a UTF-16 surrogate pair without the second", r), nil
		}
		return r, "", nil
	default:
		return 0, "", s.syntax("in an escape sequence")
	}
	s.pos++
	return r, "", nil
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

// checkContentType accepts JSON media types (application/json, any
// application/*+json such as merge-patch+json) and a missing header.
func checkContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || (len(mt) > 17 && mt[:12] == "application/" && mt[len(mt)-5:] == "+json")) {
		return nil
	}
	return &httpError{status: http.StatusUnsupportedMediaType,
		detail: fmt.Sprintf("the request body must be JSON; send Content-Type: application/json (got %q)", ct)}
}

func fieldError(field, msg string) error {
	var fe registry.FieldErrors
	fe.Add(field, "%s", msg)
	return fe.Err()
}

// fields reads typed members out of an object, collecting one error per bad
// member so a client learns about every mistake at once.
type fields struct {
	obj  object
	errs registry.FieldErrors
	used map[string]bool
}

func newFields(obj object) *fields {
	return &fields{obj: obj, used: make(map[string]bool, len(obj))}
}

// raw returns the member's bytes and whether it is present, marking it known.
func (f *fields) raw(name string) (json.RawMessage, bool) {
	f.used[name] = true
	v, ok := f.obj[name]
	return v, ok
}

func isNull(v json.RawMessage) bool { return string(v) == "null" }

// nullable records an error for a null member of a non-nullable field.
func (f *fields) nullable(name string, v json.RawMessage, allowNull bool) (null, ok bool) {
	if !isNull(v) {
		return false, true
	}
	if !allowNull {
		f.errs.Add(name, "must not be null")
		return true, false
	}
	return true, true
}

// int64 reads an integer member. Fractions, exponents, strings and numbers
// beyond int64 are errors, never silently rounded.
func (f *fields) int64(name string, allowNull bool) registry.Optional[int64] {
	v, ok := f.raw(name)
	if !ok {
		return registry.Optional[int64]{}
	}
	null, ok := f.nullable(name, v, allowNull)
	if !ok {
		return registry.Optional[int64]{}
	}
	if null {
		return registry.Optional[int64]{Set: true, Null: true}
	}
	n, msg := parseInt(v)
	if msg != "" {
		f.errs.Add(name, "%s", msg)
		return registry.Optional[int64]{}
	}
	return registry.Optional[int64]{Set: true, Value: n}
}

func parseInt(v json.RawMessage) (int64, string) {
	s := string(v)
	switch {
	case s == "":
		return 0, "must be an integer"
	case s[0] == '"':
		return 0, "must be an integer, not a string"
	case s[0] != '-' && (s[0] < '0' || s[0] > '9'):
		return 0, "must be an integer"
	case bytes.ContainsAny(v, ".eE"):
		return 0, "must be an integer, not a fractional or exponent number"
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, "is out of range for a 64-bit integer"
		}
		return 0, "must be an integer"
	}
	return n, ""
}

// int reads an integer member that must also fit an int.
func (f *fields) int(name string) registry.Optional[int] {
	o := f.int64(name, false)
	if !o.Set {
		return registry.Optional[int]{}
	}
	if o.Value < -1<<31 || o.Value > 1<<31-1 {
		f.errs.Add(name, "must be between 0 and %d", registry.MaxIndex)
		return registry.Optional[int]{}
	}
	return registry.Optional[int]{Set: true, Value: int(o.Value)}
}

func (f *fields) string(name string, allowNull bool) registry.Optional[string] {
	v, ok := f.raw(name)
	if !ok {
		return registry.Optional[string]{}
	}
	null, ok := f.nullable(name, v, allowNull)
	if !ok {
		return registry.Optional[string]{}
	}
	if null {
		return registry.Optional[string]{Set: true, Null: true}
	}
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		f.errs.Add(name, "must be a string")
		return registry.Optional[string]{}
	}
	return registry.Optional[string]{Set: true, Value: s}
}

func (f *fields) bool(name string) registry.Optional[bool] {
	v, ok := f.raw(name)
	if !ok {
		return registry.Optional[bool]{}
	}
	switch string(v) {
	case "true":
		return registry.Optional[bool]{Set: true, Value: true}
	case "false":
		return registry.Optional[bool]{Set: true}
	}
	f.errs.Add(name, "must be true or false")
	return registry.Optional[bool]{}
}

// time reads an RFC 3339 timestamp member (nullable).
func (f *fields) time(name string) registry.Optional[time.Time] {
	s := f.string(name, true)
	if !s.Set || s.Null {
		return registry.Optional[time.Time]{Set: s.Set, Null: s.Null}
	}
	t, err := time.Parse(time.RFC3339Nano, s.Value)
	if err != nil {
		f.errs.Add(name, "must be an RFC 3339 timestamp")
		return registry.Optional[time.Time]{}
	}
	return registry.Optional[time.Time]{Set: true, Value: t}
}

// require records an error for each named member that is absent.
func (f *fields) require(names ...string) {
	for _, n := range names {
		if _, ok := f.obj[n]; !ok && !f.errs.Has(n) {
			f.errs.Add(n, "is required")
		}
	}
}

// check merges the field errors of a domain validation, skipping fields
// that already have one (a missing field need not also be "invalid").
func (f *fields) check(err error) {
	for _, fe := range registry.FieldsOf(err) {
		if !f.errs.Has(fe.Field) {
			f.errs = append(f.errs, fe)
		}
	}
}

// err flags members no reader asked for as unknown, then returns every
// recorded problem.
func (f *fields) err() error {
	var unknown []string
	for name := range f.obj {
		if !f.used[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		f.errs.Add(name, "is not a known field")
	}
	return f.errs.Err()
}

// parseIntArray reads a JSON array of integers, each held to the same
// rules as single integer members. It reads at most limit+1 elements: an
// array of half a million costs what one of limit+1 does, and the caller's
// validation refuses the count.
func parseIntArray(v json.RawMessage, limit int) ([]int64, string) {
	const notArray = "must be an array of integers"
	if len(v) == 0 || v[0] != '[' {
		return nil, notArray
	}
	sc := scanner{data: v, pos: 1}
	out := []int64{}
	for first := true; ; first = false {
		sc.skipSpace()
		if first && sc.pos < len(v) && v[sc.pos] == ']' {
			return out, ""
		}
		start := sc.pos
		if _, err := sc.value(1); err != nil {
			return nil, notArray
		}
		n, msg := parseInt(v[start:sc.pos])
		if msg != "" {
			return nil, notArray + " (an element " + msg + ")"
		}
		out = append(out, n)
		if len(out) > limit {
			return out, ""
		}
		sc.skipSpace()
		switch {
		case sc.pos < len(v) && v[sc.pos] == ']':
			return out, ""
		case sc.pos < len(v) && v[sc.pos] == ',':
			sc.pos++
		default:
			return nil, notArray
		}
	}
}
