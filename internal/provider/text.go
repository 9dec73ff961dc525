package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Bounds of the strings the clients keep from a provider's answers, in
// bytes. A provider's string is never kept longer than MaxText; each field
// has its own bound below it, and what a value past that bound does is the
// field's to say (docs/importing.md has the table):
//   - an id (MaxID) fails the pass: a host is found again by its id, so a
//     host that cannot be named cannot be kept either;
//   - a name, address, state, model or size (MaxName, MaxAddress, MaxWord,
//     MaxGPUModel, MaxFabric) skips its host, which keeps its nodes;
//   - the source of an optional label (MaxName) leaves the label out.
const (
	MaxText     = 1024 // any string, e.g. a product's description
	MaxID       = 128  // a host's, cluster's, worker's or product's id
	MaxName     = 255  // a host's or product's name; a label's source
	MaxAddress  = 64   // an IP address as sent (IPv6 with a zone fits)
	MaxWord     = 64   // a state or status, a size as text
	MaxGPUModel = 100  // a GPU model: the registry's hardware generation names
	MaxFabric   = 200  // a fabric id: the registry's fabric
)

// Text is a string from a provider's answer, read with a bound: one longer
// than MaxText bytes is never held, only marked long. The zero Text is "".
type Text struct {
	s    string
	long bool
}

// TextOf is s as a Text.
func TextOf(s string) Text {
	if len(s) > MaxText {
		return Text{long: true}
	}
	return Text{s: s}
}

// DecodeText reads the JSON string b (quotes included), as json.Unmarshal
// hands it to an Unmarshaler. A string longer than MaxText is marked long
// without being decoded when its encoding already says so, so a provider's
// megabytes never become a string here.
func DecodeText(b []byte) (Text, error) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return Text{}, fmt.Errorf("not a JSON string")
	}
	// An escape encodes at least one byte in at most six.
	if len(b)-2 > 6*MaxText {
		return Text{long: true}, nil
	}
	if raw := b[1 : len(b)-1]; bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return TextOf(string(raw)), nil // nothing to unescape
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return Text{}, err
	}
	return TextOf(s), nil
}

// TrimSpace is t without surrounding blanks.
func (t Text) TrimSpace() Text {
	if t.long {
		return t
	}
	return Text{s: strings.TrimSpace(t.s)}
}

// String is the text, or "" when it is long.
func (t Text) String() string { return t.s }

// Empty reports whether the provider sent nothing: "" or blanks.
func (t Text) Empty() bool { return t.s == "" && !t.long }

// Fits reports whether t is at most limit bytes.
func (t Text) Fits(limit int) bool { return !t.long && len(t.s) <= limit }

// Within is t when it fits in limit bytes, else "".
func (t Text) Within(limit int) string {
	if !t.Fits(limit) {
		return ""
	}
	return t.s
}

// TooLong is the reason a field named field is refused for being over
// limit bytes, for a skip or an error.
func TooLong(field string, limit int) string {
	return fmt.Sprintf("%s is longer than %d bytes", field, limit)
}
