package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/registryd/registryd/client"
)

// Output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
	outName  = "name"
)

// outputFormats are -o's values, for its help and its check.
var outputFormats = []string{outTable, outWide, outJSON, outYAML, outName}

// table is rows of cells under a header, printed with each column as wide
// as its widest cell, two spaces apart. Widths are counted in runes of
// the plain text, so a coloured cell lines up like any other.
type table struct {
	header []string
	rows   [][]string
	// paint, if set, colours column col's cells (after padding).
	paint func(col int, cell string) string
	// widths are the least widths of the columns.
	widths []int
	// keep holds widths as they are: a later cell wider than its column
	// (but the last) is cut to it, so a watch's rows stay lined up with
	// the header it printed first.
	keep bool
}

// identity are the columns that tell nodes apart: a watch never cuts
// them (a row may then stand out of line), or two hosts would read alike.
var identity = map[string]bool{"PK": true, "HOST": true, "JOB": true}

// maxCell is the most runes of a free-text cell (labels, reasons): longer
// ones end in "…" so that a row fits a terminal.
const maxCell = 40

// clip shortens s to maxCell runes.
func clip(s string) string { return clipTo(s, maxCell) }

// clipTo shortens s to n runes, the last of them "…".
func clipTo(s string, n int) string {
	if utf8.RuneCountInString(s) <= n || n < 1 {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func (t *table) measure(headers bool) {
	if t.keep && len(t.widths) > 0 {
		return
	}
	if len(t.widths) < len(t.header) {
		t.widths = append(t.widths, make([]int, len(t.header)-len(t.widths))...)
	}
	grow := func(row []string) {
		for i, c := range row {
			t.widths[i] = max(t.widths[i], utf8.RuneCountInString(c))
		}
	}
	if headers {
		grow(t.header)
	}
	for _, r := range t.rows {
		grow(r)
	}
}

// write prints the table (the header unless noHeaders) and empties rows.
func (t *table) write(w io.Writer, noHeaders bool) {
	t.measure(!noHeaders)
	if !noHeaders {
		t.line(w, t.header, false)
	}
	for _, r := range t.rows {
		t.line(w, r, true)
	}
	t.rows = nil
}

func (t *table) line(w io.Writer, cells []string, paint bool) {
	var b strings.Builder
	for i, c := range cells {
		last := i == len(cells)-1
		if t.keep && !last && !identity[t.header[i]] {
			c = clipTo(c, t.widths[i])
		}
		pad := ""
		if !last {
			pad = strings.Repeat(" ", max(t.widths[i]-utf8.RuneCountInString(c), 0)+2)
		}
		if paint && t.paint != nil {
			c = t.paint(i, c)
		}
		b.WriteString(c + pad)
	}
	fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
}

// colours of the node states on a terminal (ANSI SGR).
var stateColours = map[string]string{
	string(client.StateFree):     "32", // green
	string(client.StateBusy):     "34", // blue
	string(client.StateCordoned): "33", // yellow
	string(client.StateDraining): "35", // magenta
	string(client.StateLost):     "31", // red
	string(client.StateGone):     "90", // grey
	"deleted":                    "90",
}

// colourful says whether w is a terminal and NO_COLOR
// (https://no-color.org) is unset: only then are states coloured.
func colourful(w io.Writer, rawenv func(string) string) bool {
	f, ok := w.(*os.File)
	if !ok || rawenv("NO_COLOR") != "" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// paintState colours a state cell.
func paintState(cell string) string {
	code, ok := stateColours[strings.TrimSpace(cell)]
	if !ok {
		return cell
	}
	return "\x1b[" + code + "m" + cell + "\x1b[0m"
}

// ago is how long before now t was, for people: "12s ago", "3m ago",
// "5h ago", "4d ago", "-" for never. A time ahead of now (clocks differ)
// reads "now".
func ago(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := now.Sub(*t)
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d ago"
}

// until is how long from now t is, for leases: "in 9m", "-" for none.
func until(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := t.Sub(now)
	switch {
	case d <= 0:
		return "expired"
	case d < time.Minute:
		return "in " + strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return "in " + strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return "in " + strconv.Itoa(int(d/time.Hour)) + "h"
}

// bytesText is a size in binary units, as GPU memory is sold: 80Gi.
func bytesText(n *int64) string {
	if n == nil {
		return "-"
	}
	v := *n
	for _, u := range []struct {
		name string
		size int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if v >= u.size && v%u.size == 0 {
			return strconv.FormatInt(v/u.size, 10) + u.name
		}
	}
	if v >= 1<<30 {
		return strconv.FormatFloat(float64(v)/(1<<30), 'f', 1, 64) + "Gi"
	}
	return strconv.FormatInt(v, 10)
}

// parseBytes reads a size: bytes, or a number with a binary unit (K, M, G,
// T, with or without "i" and "B": 80G, 80Gi and 80GiB are all 80 GiB).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "B"), "i")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K', 'k':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size (bytes, or with K, M, G, T: 80Gi)", s)
	}
	return n * mult, nil
}

// dash is s, or "-" when nil or empty.
func dash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

// intDash is n, or "-" when nil.
func intDash(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

// writeDocument prints v, a value of the client's (audit entries,
// hardware, fabrics), as writeRaw prints a document: its members in the
// order of the client's type.
func writeDocument(w io.Writer, format string, v any) error {
	b, err := marshalJSON(v)
	if err != nil {
		return err
	}
	return writeRaw(w, format, b)
}

// marshalJSON is v as JSON, with <, > and & as they are (the API sends
// them so).
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(b.Bytes()), nil
}
