package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/registryd/registryd"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/pgtest"
)

// The documents' conventions, which these tests hold every document to:
// README.md, each docs/*.md and deploy/README.md.
//
//   - Each document is read on its own: its ```sh and ```bash blocks are
//     run, in order, as one bash script (set -Eeuo pipefail) against a
//     registryd of its own on a new registry, as `make run` starts it. So
//     a variable used before the document defines it, a command that fails
//     or a curl that gets an error status fails the test, naming the
//     document's line. A document's first block sets up what it needs.
//   - A block that cannot run here (docker, kubectl, systemd, `make run`
//     itself, a host elsewhere, a measurement) is preceded by the line
//     <!-- readme-check: skip, REASON -->. Keep them few.
//   - A ```json block preceded by <!-- readme-check: schema NAME --> has
//     exactly the members of openapi.yaml's components.schemas.NAME.
//   - A table is one table: a blank line inside it would start a second
//     one, without a header, which renders as text.

// docsDir is where the documents by reader live; README.md links each.
const docsDir = "docs"

var (
	skipMarkRE   = regexp.MustCompile(`^<!-- readme-check: skip, (\S.*\S) -->$`)
	schemaMarkRE = regexp.MustCompile(`^<!-- readme-check: schema (\w+) -->$`)
	anyMarkRE    = regexp.MustCompile(`readme-check`)
	tableSepRE   = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+\s*$`)
)

// document is one markdown file: its path from the module root, its text
// and its fenced blocks.
type document struct {
	name   string
	text   string
	blocks []mdBlock
}

// mdBlock is a fenced code block of a document.
type mdBlock struct {
	lang  string
	start int      // line number (1-based) of the first line inside the fence
	lines []string // the lines inside the fence
	skip  string   // the reason of a skip mark
	// schema names the openapi.yaml schema the block is a sample of.
	schema string
}

// parseMarkdown returns the fenced blocks of the document name, with the
// marks on the line before each, and an error naming name:line for a mark
// that is malformed or marks nothing.
func parseMarkdown(name, text string) ([]mdBlock, error) {
	lines := strings.Split(text, "\n")
	var blocks []mdBlock
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "<!--") && anyMarkRE.MatchString(line) && !skipMarkRE.MatchString(line) && !schemaMarkRE.MatchString(line) {
			return nil, fmt.Errorf("%s:%d: a readme-check mark must be <!-- readme-check: skip, REASON --> or <!-- readme-check: schema NAME -->: %q", name, i+1, line)
		}
		if skipMarkRE.MatchString(line) || schemaMarkRE.MatchString(line) {
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
				return nil, fmt.Errorf("%s:%d: the mark is not directly above a code block", name, i+1)
			}
		}
		if !strings.HasPrefix(line, "```") {
			continue
		}
		b := mdBlock{lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), start: i + 2}
		if i > 0 {
			if m := skipMarkRE.FindStringSubmatch(lines[i-1]); m != nil {
				b.skip = m[1]
			}
			if m := schemaMarkRE.FindStringSubmatch(lines[i-1]); m != nil {
				b.schema = m[1]
			}
		}
		j := i + 1
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			b.lines = append(b.lines, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: a code block is never closed", name, i+1)
		}
		blocks = append(blocks, b)
		i = j
	}
	return blocks, nil
}

func (b mdBlock) shell() bool { return b.lang == "sh" || b.lang == "bash" }

// runnable reports whether the block is run: a shell block without a skip
// mark.
func (b mdBlock) runnable() bool { return b.shell() && b.skip == "" }

// docNames lists the documents, relative to the module root: README.md,
// every docs/*.md, and deploy/README.md.
func docNames(t *testing.T) []string {
	t.Helper()
	root := moduleRoot(t)
	matches, err := filepath.Glob(filepath.Join(root, docsDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(matches) == 0 {
		t.Fatalf("no %s/*.md found under %s", docsDir, root)
	}
	names := []string{"README.md"}
	for _, m := range matches {
		rel, err := filepath.Rel(root, m)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.ToSlash(rel))
	}
	return append(names, "deploy/README.md")
}

// readDocs reads and parses every document.
func readDocs(t *testing.T) []document {
	t.Helper()
	root := moduleRoot(t)
	var docs []document
	for _, name := range docNames(t) {
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseMarkdown(name, string(raw))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, document{name: name, text: string(raw), blocks: blocks})
	}
	return docs
}

// The documents the tests read are all there are: every markdown file
// under docs/ (at any depth, in any case) is one of them, the documents by
// reader the README promises exist, and README's "where to go next" links
// each, so no document is left unread by the tests or by readers.
func TestDocsPickedUp(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	names := docNames(t)
	err := filepath.WalkDir(filepath.Join(root, docsDir), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.EqualFold(filepath.Ext(path), ".md") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if !slices.Contains(names, filepath.ToSlash(rel)) {
			t.Errorf("%s is not among the documents the tests run (%v): keep documents at docs/NAME.md", rel, names)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scheduling", "agent", "operating", "security", "api", "design", "importing", "benchmarks", "benchmarks-history"} {
		if !slices.Contains(names, docsDir+"/"+want+".md") {
			t.Errorf("%s/%s.md was not found by the glob (found %v)", docsDir, want, names)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, docsDir+"/") && !strings.Contains(string(readme), "]("+name+")") {
			t.Errorf("README.md does not link %s (its list of where to go next is the documents' index)", name)
		}
	}
}

// curlRE finds curl commands; each must fail visibly.
var curlRE = regexp.MustCompile(`(^|[\s;(|&$])curl\s`)

// lintShell holds the runnable blocks of the document name to the
// conventions that make a failure visible: curl shows errors (-S) and
// fails on an error status (--fail-with-body), rather than printing
// nothing.
func lintShell(name string, blocks []mdBlock) []string {
	var problems []string
	for _, b := range blocks {
		if !b.runnable() {
			continue
		}
		for i, line := range b.lines {
			code, _, _ := strings.Cut(line, " #")
			if !curlRE.MatchString(code) {
				continue
			}
			visible := strings.Contains(code, "--fail-with-body") || strings.Contains(code, "%{http_code}")
			if !visible || !regexp.MustCompile(`\s-[a-zA-Z]*S`).MatchString(code) {
				problems = append(problems, fmt.Sprintf("%s:%d: curl needs -S and --fail-with-body (or -w '%%{http_code}' to show the status), or a failure prints nothing: %s", name, b.start+i, line))
			}
		}
	}
	return problems
}

// lintTables finds table rows that are not under a header: a run of lines
// starting with | must open with a header and its separator, and a blank
// line inside a table makes the rest a run without one.
func lintTables(name, text string) []string {
	var problems []string
	lines := strings.Split(text, "\n")
	inFence := false
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(lines[i], "|") || (i > 0 && strings.HasPrefix(lines[i-1], "|")) {
			continue
		}
		if i+1 >= len(lines) || !tableSepRE.MatchString(lines[i+1]) {
			problems = append(problems, fmt.Sprintf("%s:%d: table rows without a header (a blank line splitting a table?): %.80s", name, i+1, lines[i]))
		}
	}
	return problems
}

// schemaProperties is openapi.yaml's schemas by name, with their members.
func schemaProperties(t *testing.T) map[string][]string {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(registryd.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for name, s := range doc.Components.Schemas {
		for k := range s.Properties {
			out[name] = append(out[name], k)
		}
		slices.Sort(out[name])
	}
	return out
}

// lintSamples checks that each sample marked with a schema has exactly
// that schema's members.
func lintSamples(name string, blocks []mdBlock, schemas map[string][]string) []string {
	var problems []string
	for _, b := range blocks {
		if b.schema == "" {
			continue
		}
		want := schemas[b.schema]
		if len(want) == 0 {
			problems = append(problems, fmt.Sprintf("%s:%d: openapi.yaml has no schema %s with properties", name, b.start-1, b.schema))
			continue
		}
		var sample map[string]any
		if err := json.Unmarshal([]byte(strings.Join(b.lines, "\n")), &sample); err != nil {
			problems = append(problems, fmt.Sprintf("%s:%d: the %s sample is not a JSON object: %v", name, b.start, b.schema, err))
			continue
		}
		var got []string
		for k := range sample {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(want, got) {
			problems = append(problems, fmt.Sprintf("%s:%d: the %s sample has members %v; openapi.yaml's %s has %v", name, b.start, b.schema, got, b.schema, want))
		}
	}
	return problems
}

// The static rules, document by document: visible failures, one table per
// table, samples that match the schema; and, over all documents, a sample
// of the node and few skipped blocks.
func TestDocsConventions(t *testing.T) {
	t.Parallel()
	schemas := schemaProperties(t)
	samples, runnable, skipped := 0, 0, 0
	for _, d := range readDocs(t) {
		var problems []string
		problems = append(problems, lintShell(d.name, d.blocks)...)
		problems = append(problems, lintTables(d.name, d.text)...)
		problems = append(problems, lintSamples(d.name, d.blocks, schemas)...)
		for _, p := range problems {
			t.Error(p)
		}
		run, skip := 0, 0
		for _, b := range d.blocks {
			if b.schema != "" {
				samples++
			}
			switch {
			case b.runnable():
				run++
			case b.shell():
				skip++
			}
		}
		t.Logf("%s: %d shell blocks run, %d skipped", d.name, run, skip)
		runnable += run
		skipped += skip
	}
	if samples == 0 {
		t.Error("no document marks a sample of an API document (<!-- readme-check: schema Node -->)")
	}
	if runnable == 0 || skipped > runnable/2 {
		t.Errorf("the documents have %d shell blocks that run and %d skipped: keep the skipped ones few", runnable, skipped)
	}
}

// The lints have teeth: they catch what the old README did, and name the
// document and line.
func TestREADMELintCatches(t *testing.T) {
	t.Parallel()
	const name = "docs/example.md"
	blocks, err := parseMarkdown(name, "```sh\ncurl -s -X POST $R/v1/nodes/list\n"+
		"curl -sS --fail-with-body $R/healthz   # fine\n"+
		"X=$(curl -s $R/readyz)\n```\n<!-- readme-check: skip, a host elsewhere -->\n```sh\ncurl -s $R\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	got := lintShell(name, blocks)
	if len(got) != 2 || !strings.HasPrefix(got[0], name+":2:") || !strings.HasPrefix(got[1], name+":4:") {
		t.Errorf("lint: %q", got)
	}
	for _, bad := range []string{
		"<!-- readme-check: skip -->\n```sh\nls\n```\n",          // a skip mark without a reason
		"<!-- readme-check: skip, why -->\n\n```sh\nls\n```\n",   // a mark away from its block
		"<!-- readme-check: skipped, why -->\n```sh\nls\n```\n",  // a misspelt mark
		"# title\n\n```sh\nls\n",                                 // a block never closed
		"<!-- readme-check: schema Node -->\nno block follows\n", // a schema mark without a block
	} {
		if _, err := parseMarkdown(name, bad); err == nil || !strings.HasPrefix(err.Error(), name+":") {
			t.Errorf("%q: got %v, want an error naming %s and the line", bad, err, name)
		}
	}
	if _, err := parseMarkdown(name, "Mark it `<!-- readme-check: skip, REASON -->` in prose.\n"); err != nil {
		t.Errorf("prose about the mark: %v", err)
	}

	tables := lintTables(name, "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n```\n| in a fence |\n```\n")
	if len(tables) != 1 || !strings.HasPrefix(tables[0], name+":5:") {
		t.Errorf("tables: %q", tables)
	}

	schemas := schemaProperties(t)
	sample := func(members string) []mdBlock {
		b, err := parseMarkdown(name, "<!-- readme-check: schema Node -->\n```json\n{"+members+"}\n```\n")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var all []string
	for _, k := range schemas["Node"] {
		all = append(all, strconv.Quote(k)+": null")
	}
	if p := lintSamples(name, sample(strings.Join(all, ", ")), schemas); len(p) != 0 {
		t.Errorf("a sample with every member of Node: %q", p)
	}
	if p := lintSamples(name, sample(strings.Join(all[1:], ", ")), schemas); len(p) != 1 || !strings.HasPrefix(p[0], name+":3:") {
		t.Errorf("a sample missing a member of Node: %q", p)
	}
	if p := lintSamples(name, sample(strings.Join(append(all, `"colour": null`), ", ")), schemas); len(p) != 1 {
		t.Errorf("a sample with a member Node lacks: %q", p)
	}
}

// shellScript turns the runnable blocks of a document into one bash
// script whose line numbers are the document's, so a failure names the
// document's line.
func shellScript(d document) string {
	out := make([]string, strings.Count(d.text, "\n")+1)
	// A document's line 1 is its title, never code: the prologue goes there.
	out[0] = fmt.Sprintf(`set -Eeuo pipefail; trap 'rc=$?; echo "readme-check: %s:$LINENO: exit status $rc" >&2' ERR`, d.name)
	for _, b := range d.blocks {
		if !b.runnable() {
			continue
		}
		for i, l := range b.lines {
			out[b.start-1+i] = l
		}
	}
	return strings.Join(out, "\n") + "\n"
}

// failedLineRE finds the failing line: the ERR trap's report, or bash's own
// for an unbound variable (which exits without the trap). The script's line
// numbers are the document's.
var failedLineRE = regexp.MustCompile(`readme-check: \S+:(\d+): (exit status \d+)|doc\.sh: line (\d+): (.*)`)

// Each document's examples, pasted in order into bash, work: against a
// real `registryd serve` of its own on the embedded default (as `make run`
// starts it, on a new data folder), in a shell that has nothing defined
// but what README tells the reader to set (PATH with registryd on it,
// REGISTRY_DATA_DIR, REGISTRY_LISTEN).
func TestDocsExamplesRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed: the documents' check needs it (Debian package %s)", tool, tool)
		}
	}

	// registryd on PATH is this test binary running main (see TestMain);
	// make, docker, kubectl and systemctl are stubs that fail, so a block
	// that should have been marked skip cannot start anything.
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("registryd", fmt.Sprintf("%s=1 exec %s \"$@\"", runMainEnv, strconv.Quote(self)))
	for _, name := range []string{"make", "docker", "kubectl", "systemctl"} {
		write(name, fmt.Sprintf(`echo "readme-check: %s does not run here: mark the block <!-- readme-check: skip, REASON -->" >&2; exit 1`, name))
	}

	ran := 0
	for _, d := range readDocs(t) {
		if !slices.ContainsFunc(d.blocks, mdBlock.runnable) {
			continue
		}
		ran++
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			runDoc(t, d, bin)
		})
	}
	if ran == 0 {
		t.Fatal("no document has a block to run")
	}
}

// runDoc starts a registryd serve of its own for d and runs d's script.
func runDoc(t *testing.T, d document, bin string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	data := filepath.Join(pgtest.TempDir(t), "data")
	work := t.TempDir()
	env := []string{
		"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + work,
		"TMPDIR=" + t.TempDir(), // what examples put under $(mktemp -d) goes with the test
		"LANG=C.UTF-8",
		"REGISTRY_DATA_DIR=" + data,
		"REGISTRY_LISTEN=" + listen,
	}

	// The server, as `make run` starts it.
	serveLog := &apitest.Buffer{}
	serve := exec.Command(filepath.Join(bin, "registryd"), "serve")
	serve.Env = append(slices.Clone(env), "REGISTRY_LOG_FORMAT=text")
	serve.Dir = work
	serve.Stdout, serve.Stderr = serveLog, serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.Wait() }()
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			serve.Process.Kill()
			<-served
			t.Errorf("registryd serve did not stop within 30 s of SIGTERM")
		}
	})
	ready := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-served:
			t.Fatalf("registryd serve exited: %v\n%s", err, serveLog)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(ready) {
			t.Fatalf("registryd serve not ready within 90 s:\n%s", serveLog)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	scriptPath := filepath.Join(work, "doc.sh")
	if err := os.WriteFile(scriptPath, []byte(shellScript(d)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", scriptPath)
	cmd.Env, cmd.Dir = env, work
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	if err == nil {
		t.Logf("%s's examples ran:\n%s", d.name, lastBytes(out.String(), 20000))
		// Run from a checkout, examples must leave it as it was: what
		// they write goes under a temporary folder.
		entries, _ := os.ReadDir(work)
		for _, e := range entries {
			if e.Name() != "doc.sh" && !strings.HasPrefix(e.Name(), ".") {
				t.Errorf("%s's examples wrote %s into the folder they run in; write under $(mktemp -d)", d.name, e.Name())
			}
		}
		return
	}
	where := ""
	if m := failedLineRE.FindStringSubmatch(out.String()); m != nil {
		line, why := m[1], m[2]
		if line == "" {
			line, why = m[3], m[4]
		}
		n, _ := strconv.Atoi(line)
		lines := strings.Split(d.text, "\n")
		if n >= 1 && n <= len(lines) {
			where = fmt.Sprintf("%s:%d failed (%s): %s\n", d.name, n, why, lines[n-1])
		}
	}
	t.Fatalf("%s's examples, run in order, failed: %v\n%soutput:\n%s\nserver log (end):\n%s", d.name, err, where, lastBytes(out.String(), 6000), lastBytes(serveLog.String(), 3000))
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
