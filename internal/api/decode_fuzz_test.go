package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"testing"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/registry"
)

// The seed corpora are in testdata/fuzz/<FuzzName>/; run a target with
// go test -run='^$' -fuzz=FuzzParseObject -fuzztime=10s ./internal/api/

// FuzzParseObject holds the body decoder to an independent reading of the
// same body by encoding/json: it accepts exactly the JSON objects with at
// most MaxBodyMembers distinct members, nested at most maxBodyDepth deep,
// whose text is valid Unicode (UTF-8, no unpaired surrogate escapes), and
// reads the same members from them. Whatever it refuses makes a bounded
// problem.
func FuzzParseObject(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		obj, err := parseObject(body)
		want, why := oracleObject(body)
		if err != nil {
			checkBoundedProblem(t, err)
			if want != nil {
				t.Fatalf("refused a body encoding/json reads as a valid object: %v", err)
			}
			return
		}
		if want == nil {
			t.Fatalf("accepted a body it must refuse (%s): %q", why, body)
		}
		if !maps.EqualFunc(obj, want, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("members differ from encoding/json's:\n got %q\nwant %q", obj, want)
		}
	})
}

// FuzzDecodeNode feeds arbitrary bodies through the create decoder. It must
// never panic; whatever it accepts must be a valid node sent as valid text;
// whatever it refuses makes a bounded problem.
func FuzzDecodeNode(f *testing.F) {
	for _, seed := range []string{
		`{"ip":"10.0.0.1","index":0,"cpu_mem":1,"driver_version":"d","hardware_generation":null,"gpu_mem":null}`,
		`{"ip":"2001:DB8::1","index":7,"cpu_mem":9223372036854775807,"driver_version":"","hardware_generation":3,"gpu_mem":0}`,
		`{"ip":1,"index":1.0,"cpu_mem":1e3,"driver_version":null}`,
		`{"a":1,"a":2}`, `[]`, `{`, `null`, `{"index":-0}`, `{"cpu_mem":-9223372036854775809}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		err := decodeNode(body)
		if err != nil {
			checkBoundedProblem(t, err)
			return
		}
		if !utf8.Valid(body) || !surrogatesPaired(body) {
			t.Fatalf("accepted text that is not valid Unicode: %q", body)
		}
	})
}

// decodeNode runs a create body through the same steps as createNode.
func decodeNode(body []byte) error {
	obj, err := parseObject(body)
	if err != nil {
		return err
	}
	spec, err := readNodeCreate(obj)
	if err != nil {
		return err
	}
	if spec.Index < 0 || spec.CPUMem < 0 || (spec.GPUMem != nil && *spec.GPUMem < 0) {
		return fmt.Errorf("%w: %+v", errAcceptedInvalid, spec)
	}
	if ip, err := registry.CanonicalIP(spec.IP); err != nil || ip != spec.IP {
		return fmt.Errorf("%w: a non-canonical ip %q", errAcceptedInvalid, spec.IP)
	}
	return nil
}

// errAcceptedInvalid marks a decoder that let an invalid node through.
var errAcceptedInvalid = errors.New("accepted an invalid node")

// checkBoundedProblem fails unless err makes a problem document of a
// bounded size: at most maxListedErrors fields, each name short and valid
// UTF-8.
func checkBoundedProblem(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, errAcceptedInvalid) {
		t.Fatal(err)
	}
	if he, ok := errors.AsType[*httpError](err); !errors.Is(err, registry.ErrInvalid) && (!ok || he.status != 400) {
		t.Fatalf("an error that is not a 400: %v", err)
	}
	listed, omitted := listFields(registry.FieldsOf(err))
	if len(listed) > maxListedErrors || omitted < 0 {
		t.Fatalf("%d fields listed", len(listed))
	}
	p := problem{Detail: publicMessage(err), Errors: listed, ErrorsOmitted: omitted}
	b, _ := json.Marshal(p)
	if len(b) > 8<<10 {
		t.Fatalf("a %d-byte problem", len(b))
	}
	for _, fe := range listed {
		if len(fe.Field) > maxFieldNameBytes+len("…") || !utf8.ValidString(fe.Field) {
			t.Fatalf("field name %q", fe.Field)
		}
	}
	if !utf8.ValidString(p.Detail) {
		t.Fatalf("detail %q", p.Detail)
	}
}

// oracleObject reads body with encoding/json alone and returns its members
// when parseObject must accept it, or nil and why not.
func oracleObject(body []byte) (object, string) {
	switch {
	case !json.Valid(body):
		return nil, "not JSON"
	case !utf8.Valid(body):
		return nil, "not UTF-8"
	case !surrogatesPaired(body):
		return nil, "an unpaired surrogate escape"
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	depth, maxDepth, members := 0, 0, 0
	seen := map[string]bool{}
	expectKey := false // the next string token at depth 1 is a member name
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "not JSON"
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if depth == 0 && v != '{' {
					return nil, "not an object"
				}
				depth++
				maxDepth = max(maxDepth, depth)
				expectKey = depth == 1
				continue
			case '}', ']':
				depth--
				expectKey = depth == 1
				continue
			}
		case string:
			if depth == 1 && expectKey {
				if seen[v] {
					return nil, "a duplicate member"
				}
				seen[v] = true
				members++
				expectKey = false
				continue
			}
		}
		if depth == 0 {
			return nil, "not an object"
		}
		expectKey = depth == 1
	}
	if members > MaxBodyMembers {
		return nil, "too many members"
	}
	if maxDepth > maxBodyDepth {
		return nil, "nested too deeply"
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, "not an object"
	}
	return m, ""
}

// surrogatesPaired reports whether every \u escape of a UTF-16 surrogate
// in body is a high one directly followed by a low one. Outside strings a
// valid JSON text has no backslashes, so a run of them is an escape when
// its length is odd.
func surrogatesPaired(body []byte) bool {
	hex := func(i int) (rune, bool) {
		if i+4 > len(body) {
			return 0, false
		}
		var r rune
		for _, c := range body[i : i+4] {
			var d byte
			switch {
			case c >= '0' && c <= '9':
				d = c - '0'
			case c >= 'a' && c <= 'f':
				d = c - 'a' + 10
			case c >= 'A' && c <= 'F':
				d = c - 'A' + 10
			default:
				return 0, false
			}
			r = r<<4 | rune(d)
		}
		return r, true
	}
	// escapeAt returns the code unit of a \uXXXX escape whose backslash is
	// at i, if it is one.
	escapeAt := func(i int) (rune, bool) {
		if i+1 >= len(body) || body[i] != '\\' || body[i+1] != 'u' {
			return 0, false
		}
		return hex(i + 2)
	}
	for i := 0; i < len(body); {
		if body[i] != '\\' {
			i++
			continue
		}
		run := 0
		for i+run < len(body) && body[i+run] == '\\' {
			run++
		}
		i += run - 1 // the last backslash of the run starts an escape when run is odd
		if run%2 == 0 {
			i++
			continue
		}
		r, ok := escapeAt(i)
		switch {
		case !ok:
			i++
		case r >= 0xdc00 && r < 0xe000:
			return false
		case r >= 0xd800 && r < 0xdc00:
			low, ok := escapeAt(i + 6)
			if !ok || low < 0xdc00 || low >= 0xe000 {
				return false
			}
			i += 12
		default:
			i += 6
		}
	}
	return true
}
