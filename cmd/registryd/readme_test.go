package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// README.md's conventions, which these tests hold it to:
//
//   - Every ```sh or ```bash block is run, in order, as one bash script
//     (set -Eeuo pipefail) against a real registryd: so a variable used
//     before it is defined, a command that fails or a curl that gets an
//     error status fails the test, naming the README line.
//   - A block that cannot run here (docker, kubectl, systemd, `make run`
//     itself, a host elsewhere) is preceded by the line
//     <!-- readme-check: skip, REASON -->. Keep them few.
//   - A ```json block preceded by <!-- readme-check: schema NAME --> has
//     exactly the members of openapi.yaml's components.schemas.NAME.
//   - A table is one table: a blank line inside it would start a second
//     one, without a header, which renders as text.
const readmePath = "../../README.md"

var (
	skipMarkRE   = regexp.MustCompile(`^<!-- readme-check: skip, (\S.*\S) -->$`)
	schemaMarkRE = regexp.MustCompile(`^<!-- readme-check: schema (\w+) -->$`)
	anyMarkRE    = regexp.MustCompile(`readme-check`)
)

// mdBlock is a fenced code block of README.md.
type mdBlock struct {
	lang  string
	start int      // line number (1-based) of the first line inside the fence
	lines []string // the lines inside the fence
	skip  string   // the reason of a skip mark
	// schema names the openapi.yaml schema the block is a sample of.
	schema string
}

// parseMarkdown returns README's fenced blocks, with the marks on the line
// before each, and an error for a mark that is malformed or marks nothing.
func parseMarkdown(text string) ([]mdBlock, error) {
	lines := strings.Split(text, "\n")
	var blocks []mdBlock
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "<!--") && anyMarkRE.MatchString(line) && !skipMarkRE.MatchString(line) && !schemaMarkRE.MatchString(line) {
			return nil, fmt.Errorf("README.md:%d: a readme-check mark must be <!-- readme-check: skip, REASON --> or <!-- readme-check: schema NAME -->: %q", i+1, line)
		}
		if skipMarkRE.MatchString(line) || schemaMarkRE.MatchString(line) {
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
				return nil, fmt.Errorf("README.md:%d: the mark is not directly above a code block", i+1)
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
			return nil, fmt.Errorf("README.md:%d: a code block is never closed", i+1)
		}
		blocks = append(blocks, b)
		i = j
	}
	return blocks, nil
}

func (b mdBlock) shell() bool { return b.lang == "sh" || b.lang == "bash" }

func readREADME(t *testing.T) (string, []mdBlock) {
	t.Helper()
	raw, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseMarkdown(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw), blocks
}

// curlRE finds curl commands; each must fail visibly.
var curlRE = regexp.MustCompile(`(^|[\s;(|&$])curl\s`)

// lintShell holds the runnable blocks to the conventions that make a
// failure visible: curl shows errors (-S) and fails on an error status
// (--fail-with-body), rather than printing nothing.
func lintShell(blocks []mdBlock) []string {
	var problems []string
	for _, b := range blocks {
		if !b.shell() || b.skip != "" {
			continue
		}
		for i, line := range b.lines {
			code, _, _ := strings.Cut(line, " #")
			if !curlRE.MatchString(code) {
				continue
			}
			visible := strings.Contains(code, "--fail-with-body") || strings.Contains(code, "%{http_code}")
			if !visible || !regexp.MustCompile(`\s-[a-zA-Z]*S`).MatchString(code) {
				problems = append(problems, fmt.Sprintf("README.md:%d: curl needs -S and --fail-with-body (or -w '%%{http_code}' to show the status), or a failure prints nothing: %s", b.start+i, line))
			}
		}
	}
	return problems
}

// The static rules: visible failures, one table per table, samples that
// match the schema, few skipped blocks.
func TestREADMEConventions(t *testing.T) {
	t.Parallel()
	text, blocks := readREADME(t)
	for _, p := range lintShell(blocks) {
		t.Error(p)
	}

	// A table run (consecutive lines starting with |) must open with a
	// header and its separator; a blank line inside a table makes the rest
	// a run without one.
	lines := strings.Split(text, "\n")
	inFence := false
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(lines[i], "|") || (i > 0 && strings.HasPrefix(lines[i-1], "|")) {
			continue
		}
		if i+1 >= len(lines) || !regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+\s*$`).MatchString(lines[i+1]) {
			t.Errorf("README.md:%d: table rows without a header (a blank line splitting a table?): %.80s", i+1, lines[i])
		}
	}

	// Samples of API documents have exactly the schema's members.
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
	samples := 0
	for _, b := range blocks {
		if b.schema == "" {
			continue
		}
		samples++
		schema, ok := doc.Components.Schemas[b.schema]
		if !ok || len(schema.Properties) == 0 {
			t.Errorf("README.md:%d: openapi.yaml has no schema %s with properties", b.start-1, b.schema)
			continue
		}
		var sample map[string]any
		if err := json.Unmarshal([]byte(strings.Join(b.lines, "\n")), &sample); err != nil {
			t.Errorf("README.md:%d: the %s sample is not a JSON object: %v", b.start, b.schema, err)
			continue
		}
		var want, got []string
		for k := range schema.Properties {
			want = append(want, k)
		}
		for k := range sample {
			got = append(got, k)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			t.Errorf("README.md:%d: the %s sample has members %v; openapi.yaml's %s has %v", b.start, b.schema, got, b.schema, want)
		}
	}
	if samples == 0 {
		t.Error("README.md marks no sample of an API document (<!-- readme-check: schema Node -->)")
	}

	runnable, skipped := 0, 0
	for _, b := range blocks {
		if b.shell() {
			if b.skip != "" {
				skipped++
			} else {
				runnable++
			}
		}
	}
	if runnable == 0 || skipped > runnable/2 {
		t.Errorf("README.md: %d shell blocks run, %d skipped: keep the skipped ones few", runnable, skipped)
	}
}

// The lint has teeth: it catches what the old README did.
func TestREADMELintCatches(t *testing.T) {
	t.Parallel()
	blocks, err := parseMarkdown("```sh\ncurl -s -X POST $R/v1/nodes/list\n" +
		"curl -sS --fail-with-body $R/healthz   # fine\n" +
		"X=$(curl -s $R/readyz)\n```\n<!-- readme-check: skip, a host elsewhere -->\n```sh\ncurl -s $R\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	got := lintShell(blocks)
	if len(got) != 2 || !strings.Contains(got[0], "README.md:2:") || !strings.Contains(got[1], "README.md:4:") {
		t.Errorf("lint: %q", got)
	}
	if _, err := parseMarkdown("<!-- readme-check: skip -->\n```sh\nls\n```\n"); err == nil {
		t.Error("a skip mark without a reason was accepted")
	}
	if _, err := parseMarkdown("<!-- readme-check: skip, why -->\n\n```sh\nls\n```\n"); err == nil {
		t.Error("a skip mark away from its block was accepted")
	}
	if _, err := parseMarkdown("<!-- readme-check: skipped, why -->\n```sh\nls\n```\n"); err == nil {
		t.Error("a misspelt mark was accepted")
	}
	if _, err := parseMarkdown("Mark it `<!-- readme-check: skip, REASON -->` in prose.\n"); err != nil {
		t.Errorf("prose about the mark: %v", err)
	}
}

// shellScript turns README's runnable blocks into one bash script whose
// line numbers are README's, so a failure names the README line.
func shellScript(text string, blocks []mdBlock) string {
	out := make([]string, strings.Count(text, "\n")+1)
	// README's line 1 is its title, never code: the prologue goes there.
	out[0] = `set -Eeuo pipefail; trap 'rc=$?; echo "readme-check: README.md:$LINENO: exit status $rc" >&2' ERR`
	for _, b := range blocks {
		if !b.shell() || b.skip != "" {
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
// numbers are README's.
var failedLineRE = regexp.MustCompile(`readme-check: README\.md:(\d+): (exit status \d+)|readme\.sh: line (\d+): (.*)`)

// README's examples, pasted in order into bash, work: against a real
// `registryd serve` on the embedded default (as `make run` starts it), in
// a shell that has nothing defined but what README tells the reader to
// set (PATH with registryd on it, REGISTRY_DATA_DIR, REGISTRY_LISTEN).
func TestREADMEExamplesRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed: the README check needs it (Debian package %s)", tool, tool)
		}
	}
	text, blocks := readREADME(t)
	script := shellScript(text, blocks)

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
	scriptPath := filepath.Join(work, "readme.sh")
	if err := os.WriteFile(scriptPath, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", scriptPath)
	cmd.Env, cmd.Dir = env, work
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	if err == nil {
		t.Logf("README's examples ran:\n%s", lastBytes(out.String(), 20000))
		return
	}
	where := ""
	if m := failedLineRE.FindStringSubmatch(out.String()); m != nil {
		line, why := m[1], m[2]
		if line == "" {
			line, why = m[3], m[4]
		}
		n, _ := strconv.Atoi(line)
		lines := strings.Split(text, "\n")
		if n >= 1 && n <= len(lines) {
			where = fmt.Sprintf("README.md:%d failed (%s): %s\n", n, why, lines[n-1])
		}
	}
	tail := out.String()
	if len(tail) > 6000 {
		tail = "…" + tail[len(tail)-6000:]
	}
	t.Fatalf("README's examples, run in order, failed: %v\n%soutput:\n%s\nserver log (end):\n%s", err, where, tail, lastBytes(serveLog.String(), 3000))
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
