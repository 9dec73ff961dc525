package main

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd/client"
)

// nodeDocs are the node documents the API sent a command, by pk, as it
// sent them: -o json and yaml print these, so the output has the API's
// members in the API's order, members this build does not know
// included, rather than the client's decoding of them.
type nodeDocs struct {
	mu   sync.Mutex
	byPK map[int64]json.RawMessage
	// last is the body of the last JSON answer read whole.
	last []byte
}

// lastList is the elements of the last JSON answer, as the API sent them,
// when it was a list of n; else nil. A command that prints what one
// request (a page) returned prints these rather than the client's
// decoding of them: the API's members in its order, unknown ones kept.
func (d *nodeDocs) lastList(n int) []json.RawMessage {
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	var list []json.RawMessage
	if json.Unmarshal(last, &list) != nil || len(list) != n {
		return nil
	}
	return list
}

// nodeKeys are the members that make an object a node document.
type nodeKeys struct {
	PK      *int64  `json:"pk"`
	IP      *string `json:"ip"`
	Version *int64  `json:"version"`
}

// add records the node documents of an answer's body: the body itself,
// the elements of a list, or of a list one of its members holds (a
// claim's nodes, a release's released).
func (d *nodeDocs) add(body []byte) {
	var candidates []json.RawMessage
	var top json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return
	}
	var list []json.RawMessage
	var obj map[string]json.RawMessage
	switch {
	case json.Unmarshal(top, &list) == nil:
		candidates = list
	case json.Unmarshal(top, &obj) == nil:
		candidates = append(candidates, top)
		for _, m := range obj {
			if json.Unmarshal(m, &list) == nil {
				candidates = append(candidates, list...)
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = body
	for _, c := range candidates {
		var k nodeKeys
		if json.Unmarshal(c, &k) != nil || k.PK == nil || k.IP == nil || k.Version == nil {
			continue
		}
		if d.byPK == nil {
			d.byPK = map[int64]json.RawMessage{}
		}
		d.byPK[*k.PK] = c
	}
}

// set records doc as the document of node pk (a watch's event).
func (d *nodeDocs) set(pk int64, doc json.RawMessage) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byPK == nil {
		d.byPK = map[int64]json.RawMessage{}
	}
	d.byPK[pk] = doc
}

// doc is n's document as the API sent it, when it sent this version of
// it; else the client's encoding of n.
func (d *nodeDocs) doc(n client.Node) (json.RawMessage, error) {
	if d != nil {
		d.mu.Lock()
		raw, ok := d.byPK[n.PK]
		d.mu.Unlock()
		var k nodeKeys
		if ok && json.Unmarshal(raw, &k) == nil && k.Version != nil && *k.Version == n.Version {
			return raw, nil
		}
	}
	return marshalJSON(n)
}

// maxRecordedBody bounds the answer a recordTransport keeps.
const maxRecordedBody = 256 << 20

// recordTransport hands the JSON bodies of successful answers to docs
// once they are read and closed.
type recordTransport struct {
	next http.RoundTripper
	docs *nodeDocs
}

func (t *recordTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err != nil || resp.StatusCode/100 != 2 {
		return resp, err
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "application/json" {
		return resp, nil
	}
	resp.Body = &recordBody{ReadCloser: resp.Body, docs: t.docs}
	return resp, nil
}

// recordBody keeps what is read of a body, for docs when it is closed.
type recordBody struct {
	io.ReadCloser
	docs *nodeDocs
	buf  bytes.Buffer
	over bool
}

func (b *recordBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.buf.Len()+n > maxRecordedBody {
		b.over = true
	} else {
		b.buf.Write(p[:n])
	}
	return n, err
}

func (b *recordBody) Close() error {
	if !b.over {
		b.docs.add(b.buf.Bytes())
	}
	return b.ReadCloser.Close()
}

// jsonList is docs as one JSON list.
func jsonList(docs []json.RawMessage) []byte {
	b := []byte{'['}
	for i, d := range docs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, d...)
	}
	return append(b, ']')
}

// writeRaw prints doc, JSON text, as JSON (indented, members and values
// as they are) or as YAML (block style, the same members in the same
// order).
func writeRaw(w io.Writer, format string, doc []byte) error {
	if format == outJSON {
		var b bytes.Buffer
		if err := json.Indent(&b, bytes.TrimSpace(doc), "", "  "); err != nil {
			return err
		}
		b.WriteByte('\n')
		_, err := w.Write(b.Bytes())
		return err
	}
	// JSON is YAML: read it as a YAML tree (which keeps the members'
	// order) and write it back in block style.
	var tree yaml.Node
	if err := yaml.Unmarshal(doc, &tree); err != nil {
		return err
	}
	blockStyle(&tree)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&tree); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle clears the styles JSON gave n and its children (flow
// braces, quoted strings): the encoder quotes only what needs it, and
// strings a YAML 1.1 reader (PyYAML) would take for something else are
// double-quoted.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && yaml11NotString(n.Value) {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// yaml11Sexagesimal is YAML 1.1's base-60 numbers (1:20 is 80).
var yaml11Sexagesimal = regexp.MustCompile(`^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`)

// yaml11NotString says whether a YAML 1.1 reader takes the plain scalar
// s for a boolean or a number, where YAML 1.2 (this encoder) reads a
// string.
func yaml11NotString(s string) bool {
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "on", "off":
		return true
	}
	return yaml11Sexagesimal.MatchString(s)
}
