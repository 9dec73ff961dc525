package api_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/registryd/registryd/internal/api"
)

// unknownKeys is a body of n unknown members, {"k000000":0,...}.
func unknownKeys(n int) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%06d":0`, i)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// problemDoc is a problem document with its bounded error list.
type problemDoc struct {
	Detail string `json:"detail"`
	Errors []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
	ErrorsOmitted int `json:"errors_omitted"`
}

// A body of unknown keys must not buy an answer (or server memory) larger
// than itself: decoding stops after MaxBodyMembers members, and a problem
// names at most 20 fields plus a count of the rest.
func TestUnknownKeysAreBounded(t *testing.T) {
	b := setup(t)

	// 1 MiB of ~80,000 keys: refused at the 65th, without naming any.
	huge := unknownKeys(80_000)
	if len(huge) > api.MaxBodyBytes {
		huge = unknownKeys(api.MaxBodyBytes / 12)
	}
	r := b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", huge))
	if len(r.body) > 1024 {
		t.Errorf("a %d-byte body of unknown keys got a %d-byte answer", len(huge), len(r.body))
	}
	var p problemDoc
	r.json(t, &p)
	if len(p.Errors) > 20 || !strings.Contains(p.Detail, fmt.Sprintf("more than %d members", api.MaxBodyMembers)) {
		t.Errorf("problem: %s", r.body)
	}

	// Within the member cap: the first 20 are named, the rest counted.
	for _, n := range []int{21, 40, api.MaxBodyMembers} {
		r = b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", unknownKeys(n)))
		p = problemDoc{}
		r.json(t, &p)
		if len(p.Errors) != 20 || p.ErrorsOmitted != n-20 || p.Errors[0].Field != "k000000" {
			t.Errorf("%d unknown keys: %d listed, %d omitted: %s", n, len(p.Errors), p.ErrorsOmitted, r.body)
		}
		if len(r.body) > 2500 {
			t.Errorf("%d unknown keys: %d-byte answer", n, len(r.body))
		}
	}
	r = b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", unknownKeys(api.MaxBodyMembers+1)))
	if !strings.Contains(string(r.body), "more than 64 members") {
		t.Errorf("65 members: %s", r.body)
	}
	// Exactly 20: all named, nothing omitted.
	r = b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", unknownKeys(20)))
	if p := r.object(t); len(p["errors"].([]any)) != 20 || p["errors_omitted"] != nil {
		t.Errorf("20 unknown keys: %s", r.body)
	}

	// A long unknown name is not echoed whole.
	long := strings.Repeat("é", 50_000)
	r = b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", `{"`+long+`":1}`))
	p = problemDoc{}
	r.json(t, &p)
	if len(p.Errors) != 1 || len(p.Errors[0].Field) > 64+len("…") || !strings.HasSuffix(p.Errors[0].Field, "…") ||
		!utf8.ValidString(p.Errors[0].Field) || len(r.body) > 1024 {
		t.Errorf("long name: %d-byte answer, fields %v", len(r.body), p.Errors)
	}

	// Deep nesting is refused without recursing through it.
	deep := `{"ip":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}`
	r = b.must(http.StatusBadRequest, b.do("POST", "/v1/nodes/list", deep))
	if !strings.Contains(string(r.body), "more than 32 deep") {
		t.Errorf("deep nesting: %s", r.body)
	}
}

// Text that is not valid Unicode is refused naming the field, never stored
// as U+FFFD.
func TestInvalidUnicodeRefused(t *testing.T) {
	b := setup(t)
	pk := b.createNode(nil)
	path := fmt.Sprintf("/v1/nodes/%d", pk)
	node := func(driver string) string {
		return `{"ip":"10.0.0.2","index":0,"cpu_mem":1,"driver_version":"` + driver + `","hardware_generation":null,"gpu_mem":null}`
	}
	for _, tc := range []struct{ name, text string }{
		{"lone high surrogate", `550\ud800`},
		{"lone low surrogate", `\udc00x`},
		{"high surrogate then a letter", `\ud800\u0041`},
		{"two high surrogates", `\ud83d\ud83d`},
		{"two low surrogates", `\ude00\ude00`},
		{"low before high", `\ude00\ud83d`},
		{"high surrogate at the end", `\uD83D`},
		{"invalid byte", "550\xff"},
		{"overlong encoding", "\xc0\xaf"},
		{"UTF-8 encoded surrogate", "\xed\xa0\x80"},
		{"truncated sequence", "\xe2\x82"},
	} {
		for _, req := range []struct{ method, path, body string }{
			{"POST", "/v1/nodes/create", node(tc.text)},
			{"PUT", path, node(tc.text)},
			{"PATCH", path, `{"driver_version":"` + tc.text + `"}`},
		} {
			r := b.do(req.method, req.path, req.body)
			refused(t, tc.name+", "+req.method, r, "driver_version")
			if !utf8.Valid(r.body) {
				t.Errorf("%s, %s: the answer is not UTF-8", tc.name, req.method)
			}
		}
		// A filter string field of the audit list, which any label passes.
		refused(t, tc.name+", audit principal", b.do("POST", "/v1/audit/list", `{"principal":"agent`+tc.text+`"}`), "principal")
		r := b.do("POST", "/v1/nodes/list", `{"ip":"10.0.0.1`+tc.text+`"}`)
		refused(t, tc.name+", list ip", r, "ip")
		if !strings.Contains(string(r.body), "Unicode") {
			t.Errorf("%s, list ip: %s", tc.name, r.body)
		}
	}
	if n := b.countNodes(); n != 1 {
		t.Errorf("%d nodes stored", n)
	}
	got := b.must(http.StatusOK, b.do("GET", path, nil)).object(t)
	if got["driver_version"] != "550.54.15" || got["ip"] != "10.0.0.1" {
		t.Errorf("node changed: %v", got)
	}

	// A surrogate pair is one character, and is kept as sent.
	r := b.must(http.StatusOK, b.do("PATCH", path, `{"driver_version":"550 \ud83d\ude00 é"}`))
	if v := r.object(t)["driver_version"]; v != "550 😀 é" {
		t.Errorf("driver_version %q", v)
	}

	// Member names that are not text refuse the whole body, unechoed.
	for _, body := range []string{"{\"\xff\":1}", `{"\udc00":1}`, "{\"ok\":{\"\xfe\":1}}"} {
		r := b.do("POST", "/v1/nodes/list", body)
		if strings.HasPrefix(body, `{"ok"`) {
			refused(t, fmt.Sprintf("%q", body), r, "ok")
		} else {
			refused(t, fmt.Sprintf("%q", body), r)
		}
		if !utf8.Valid(r.body) || bytes.Contains(r.body, []byte(`\ufffd`)) || bytes.Contains(r.body, []byte("\uFFFD")) {
			t.Errorf("%q: answer echoes the name: %s", body, r.body)
		}
	}
}
