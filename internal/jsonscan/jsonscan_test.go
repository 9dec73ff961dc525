package jsonscan

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// members runs Object and returns what it read, or its error.
func members(data string, opts Options) ([]Member, error) {
	var got []Member
	err := Object([]byte(data), opts, func(m Member) error {
		got = append(got, m)
		return nil
	})
	return got, err
}

func TestObject(t *testing.T) {
	t.Parallel()
	opts := Options{MaxDepth: 3, MaxMembers: 3}
	got, err := members(` {"a" : [1, {"b": null}], "\u0063": "x\ud83d\ude00", "d": -1.5e3 } `, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{
		{Name: "a", Value: []byte(`[1, {"b": null}]`)},
		{Name: "c", Value: []byte(`"x\ud83d\ude00"`)},
		{Name: "d", Value: []byte(`-1.5e3`)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("members (-want +got):\n%s", diff)
	}
}

// Every refusal has its kind, and the details a caller needs to say why.
func TestObjectRefuses(t *testing.T) {
	t.Parallel()
	opts := Options{MaxDepth: 3, MaxMembers: 3}
	nested := Options{MaxDepth: 3, NestedDuplicates: true}
	for _, tc := range []struct {
		name, data string
		opts       Options
		want       Error
	}{
		{"empty", "  ", opts, Error{Kind: Syntax, Offset: 2, Detail: "it ends too early"}},
		{"garbage", "x", opts, Error{Kind: Syntax, Detail: "at byte 0: unexpected 'x' looking for the beginning of a value"}},
		{"array", "[1]", opts, Error{Kind: NotObject}},
		{"unterminated", `{"a":1`, opts, Error{Kind: Syntax, Offset: 6, Detail: "it ends too early"}},
		{"trailing comma", `{"a":1,}`, opts, Error{Kind: Syntax, Offset: 7, Detail: "at byte 7: unexpected '}' looking for the beginning of a member name"}},
		{"leading zero", `{"a":01}`, opts, Error{Kind: Syntax, Offset: 6, Detail: "at byte 6: unexpected '1' after a member value"}},
		{"control character", "{\"a\":\"\x01\"}", opts, Error{Kind: Syntax, Offset: 6, Detail: "at byte 6: unexpected byte 0x01 in a string (control characters must be escaped)"}},
		{"bad escape", `{"a":"\x"}`, opts, Error{Kind: Syntax, Offset: 7, Detail: `at byte 7: unexpected 'x' in an escape sequence`}},
		{"trailing", `{} {}`, opts, Error{Kind: Trailing, Offset: 3}},
		{"too deep", `{"a":[[[1]]]}`, opts, Error{Kind: TooDeep, Offset: 7, Limit: 3}},
		{"too many", `{"a":1,"b":2,"c":3,"d":4}`, opts, Error{Kind: TooManyMembers, Offset: 19, Limit: 3}},
		{"duplicate", `{"a":1,"\u0061":2}`, opts, Error{Kind: Duplicate, Offset: 7, Name: "a"}},
		{"name not UTF-8", "{\"a\xff\":1}", opts, Error{Kind: BadName, Offset: 3, Text: &TextError{Offset: 3}}},
		{"name with a lone surrogate", `{"\udc00":1}`, opts, Error{Kind: BadName, Offset: 2, Text: &TextError{Offset: 2, Escape: 0xdc00}}},
		{"nested duplicate", `{"a":[{"b":1,"b":2}]}`, nested, Error{Kind: Duplicate, Offset: 13, Name: "b"}},
	} {
		_, err := members(tc.data, tc.opts)
		e, ok := errors.AsType[*Error](err)
		if !ok {
			t.Errorf("%s: %v, want an *Error", tc.name, err)
			continue
		}
		if diff := cmp.Diff(tc.want, *e); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
		if !strings.HasPrefix(e.Error(), "jsonscan: ") {
			t.Errorf("%s: %q", tc.name, e.Error())
		}
	}
	// MaxDepth levels, the top object counting as one, are fine.
	if _, err := members(`{"a":[[1]]}`, opts); err != nil {
		t.Errorf("exactly MaxDepth levels: %v", err)
	}
	// Without NestedDuplicates, only the top object's names are compared.
	if _, err := members(`{"a":[{"b":1,"b":2}]}`, opts); err != nil {
		t.Errorf("a nested duplicate without NestedDuplicates: %v", err)
	}
}

// Text that is not Unicode is reported on the member holding it, first
// one first, wherever it is inside the value; the scan goes on.
func TestObjectText(t *testing.T) {
	t.Parallel()
	got, err := members(`{"a":"ok","b":["\ud800x","\udc00"],"c":{"\ud800\u0041":1},"d":"`+"\xc3"+`"}`, Options{MaxDepth: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"a": "",
		"b": `the escape \ud800 is the first half of a UTF-16 surrogate pair without the second`,
		"c": `the escape \ud800 is the first half of a UTF-16 surrogate pair without the second`,
		"d": "it holds bytes that are not UTF-8",
	}
	for _, m := range got {
		text := ""
		if m.Text != nil {
			text = m.Text.Error()
		}
		if text != want[m.Name] {
			t.Errorf("member %q: text %q, want %q", m.Name, text, want[m.Name])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d members, want %d", len(got), len(want))
	}
}

// An error from the caller's function ends the scan and comes back as is.
func TestObjectStopsOnCallerError(t *testing.T) {
	t.Parallel()
	stop := errors.New("enough")
	n := 0
	err := Object([]byte(`{"a":1,"b":2,"c":`), Options{MaxDepth: 2}, func(Member) error { n++; return stop })
	if err != stop || n != 1 {
		t.Fatalf("err %v after %d members, want %v after 1", err, n, stop)
	}
}

func TestElements(t *testing.T) {
	t.Parallel()
	opts := Options{MaxDepth: 2}
	var got []string
	collect := func(e []byte) bool { got = append(got, string(e)); return true }
	if err := Elements([]byte(` [ 1 , "two" , [3] , {"4":4} ] `), opts, collect); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"1", `"two"`, "[3]", `{"4":4}`}, got); diff != "" {
		t.Fatalf("elements (-want +got):\n%s", diff)
	}
	// Stopping early reads nothing beyond: the broken tail goes unseen.
	got = nil
	if err := Elements([]byte(`[1,2,x`), opts, func(e []byte) bool { collect(e); return len(got) < 2 }); err != nil {
		t.Fatalf("stopped early: %v", err)
	}
	for data, kind := range map[string]Kind{`{}`: NotArray, `[1,]`: Syntax, `[[[1]]]`: TooDeep, `[1] 2`: Trailing} {
		err := Elements([]byte(data), opts, func([]byte) bool { return true })
		if e, ok := errors.AsType[*Error](err); !ok || e.Kind != kind {
			t.Errorf("%s: %v, want kind %d", data, err, kind)
		}
	}
}
