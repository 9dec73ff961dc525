package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/jsonscan"
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

// bodyScan is how request bodies are read: see parseObject.
var bodyScan = jsonscan.Options{MaxDepth: maxBodyDepth, MaxMembers: MaxBodyMembers}

// parseObject decodes exactly one JSON object. Beyond JSON's own grammar it
// refuses duplicate members, more than MaxBodyMembers members, nesting
// deeper than maxBodyDepth, and strings that are not valid Unicode text:
// bytes that are not UTF-8, and \u escapes of UTF-16 surrogates that do not
// form a pair. encoding/json would turn such text into U+FFFD and the
// registry would store something other than what was sent. A bad member
// value is named in the error; a bad member name refuses the body without
// echoing it.
func parseObject(body []byte) (object, error) {
	obj := object{}
	var textErrs registry.FieldErrors
	err := jsonscan.Object(body, bodyScan, func(m jsonscan.Member) error {
		if m.Text != nil {
			textErrs.Add(m.Name, "must be valid Unicode text, but %s", m.Text)
		}
		obj[m.Name] = json.RawMessage(m.Value)
		return nil
	})
	if err != nil {
		return nil, bodyError(err)
	}
	if err := textErrs.Err(); err != nil {
		return nil, err
	}
	return obj, nil
}

// bodyError is the 400 for a body jsonscan refused.
func bodyError(err error) error {
	e, ok := errors.AsType[*jsonscan.Error](err)
	if !ok {
		return badRequest("the request body is not valid JSON")
	}
	switch e.Kind {
	case jsonscan.NotObject:
		return badRequest("the request body must be a JSON object")
	case jsonscan.Trailing:
		return badRequest("the request body must hold a single JSON object and nothing after it")
	case jsonscan.TooDeep:
		return badRequest(fmt.Sprintf("the request body nests arrays and objects more than %d deep", maxBodyDepth))
	case jsonscan.TooManyMembers:
		return badRequest(fmt.Sprintf("the request body has more than %d members; no request takes that many", MaxBodyMembers))
	case jsonscan.Duplicate:
		return fieldError(e.Name, "appears more than once")
	case jsonscan.BadName:
		// Not echoed: the name is not text a problem document can carry.
		return badRequest("a member name of the request body is not valid Unicode text (" + e.Text.Error() + ")")
	}
	return badRequest("the request body is not valid JSON (" + e.Detail + ")")
}

// checkContentType accepts JSON media types (application/json, any
// application/*+json such as merge-patch+json) and a missing header. The
// body is read as UTF-8 (RFC 8259): a charset parameter naming another
// is refused rather than read as what it is not.
func checkContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || (len(mt) > 17 && mt[:12] == "application/" && mt[len(mt)-5:] == "+json")) {
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") && !strings.EqualFold(cs, "us-ascii") {
			return &httpError{status: http.StatusUnsupportedMediaType,
				detail: fmt.Sprintf("the request body must be UTF-8 JSON; charset %q is not read (send Content-Type: application/json)", cs)}
		}
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

// labels reads a node's labels member: an object of label values. In a
// merge (replace false) a null value removes its label. null for the
// whole member removes every label the writer may remove.
func (f *fields) labels(name string, replace bool) registry.LabelPatch {
	v, ok := f.raw(name)
	if !ok {
		return registry.LabelPatch{}
	}
	p := registry.LabelPatch{Set: true, Replace: replace, Values: map[string]*string{}}
	if isNull(v) {
		p.Replace = true
		return p
	}
	what := "must be an object of label values (strings)"
	if !replace {
		what = "must be an object of label values (strings, or null to remove a label)"
	}
	err := jsonscan.Object(v, bodyScan, func(m jsonscan.Member) error {
		if isNull(m.Value) && !replace {
			p.Values[m.Name] = nil
			return nil
		}
		var s string
		if m.Text != nil || len(m.Value) == 0 || m.Value[0] != '"' || json.Unmarshal(m.Value, &s) != nil {
			return errBadLabel
		}
		p.Values[m.Name] = &s
		return nil
	})
	if err != nil {
		if e, ok := errors.AsType[*jsonscan.Error](err); ok && e.Kind == jsonscan.Duplicate {
			what = "names label " + strconv.Quote(e.Name) + " more than once"
		}
		f.errs.Add(name, "%s", what)
		return registry.LabelPatch{}
	}
	return p
}

var errBadLabel = errors.New("not a label value")

// time reads an RFC 3339 timestamp member (nullable).
func (f *fields) time(name string) registry.Optional[time.Time] {
	o := f.stamp(name)
	return registry.Optional[time.Time]{Set: o.Set, Null: o.Null, Value: o.Value.Time}
}

// stamp reads an RFC 3339 timestamp member (nullable) with the precision
// it was written in, for echoes of read-only times.
func (f *fields) stamp(name string) registry.Optional[registry.Stamp] {
	s := f.string(name, true)
	if !s.Set || s.Null {
		return registry.Optional[registry.Stamp]{Set: s.Set, Null: s.Null}
	}
	t, err := time.Parse(time.RFC3339Nano, s.Value)
	if err != nil {
		f.errs.Add(name, "must be an RFC 3339 timestamp")
		return registry.Optional[registry.Stamp]{}
	}
	return registry.Optional[registry.Stamp]{Set: true, Value: registry.Stamp{Time: t, Precision: precision(s.Value)}}
}

// precision is the unit of the last digit of an RFC 3339 timestamp that
// parsed: a second without a fraction, down to a nanosecond with nine
// digits or more. The seconds end at byte 19 ("2006-01-02T15:04:05").
func precision(s string) time.Duration {
	if len(s) <= 20 || (s[19] != '.' && s[19] != ',') {
		return time.Second
	}
	p := time.Second
	for i := 20; i < len(s) && s[i] >= '0' && s[i] <= '9' && p > time.Nanosecond; i++ {
		p /= 10
	}
	return p
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
	out := []int64{}
	var msg string
	err := jsonscan.Elements(v, bodyScan, func(elem []byte) bool {
		n, m := parseInt(elem)
		if m != "" {
			msg = notArray + " (an element " + m + ")"
			return false
		}
		out = append(out, n)
		return len(out) <= limit
	})
	switch {
	case msg != "":
		return nil, msg
	case err != nil:
		return nil, notArray
	}
	return out, ""
}
