package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/watch"
)

// brokenEnv is an environment no command can start with.
var brokenEnv = map[string]string{
	"REGISTRY_DATABASE_URL": "mysql://u:hunter2-pw@db/registry",
	"REGISTRY_LOG_FORMAT":   "xml",
	"REGISTRY_LISTEN":       "",
	"REGISTRY_SERVER":       "ftp://nowhere",
}

// Every command's --help, -h and `registryd help COMMAND` print its help
// on stdout and succeed, whatever the environment holds, listing each of
// its flags and each variable it reads with its default.
func TestEveryCommandHelp(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		for _, form := range [][]string{
			append(strings.Fields(c.name), "--help"),
			append(strings.Fields(c.name), "-h"),
			append([]string{"help"}, strings.Fields(c.name)...),
		} {
			out, stderr, err := runCmd(t, brokenEnv, form...)
			if err != nil || stderr != "" {
				t.Errorf("%q: %v, stderr %q", form, err, stderr)
				continue
			}
			if !strings.HasPrefix(out, "usage: registryd "+c.synopsis+"\n") || !strings.Contains(out, "-h, --help") {
				t.Errorf("%q: not its help:\n%s", form, out)
			}
			if c.flags != nil {
				c.flags().VisitAll(func(f *flag.Flag) {
					if !strings.Contains(out, "--"+f.Name) {
						t.Errorf("%q: flag --%s not listed", form, f.Name)
					}
				})
			}
			for _, s := range settingsFor(c.reads) {
				if !strings.Contains(out, "  "+s.Name+defaultNote(s)+"\n      "+s.Meaning+"\n") {
					t.Errorf("%q: setting %s not listed with its default and meaning", form, s.Name)
				}
			}
		}
	}
	// serve's lists every setting there is, the agent's as well.
	out, _, _ := runCmd(t, brokenEnv, "serve", "--help")
	for _, s := range settings {
		if !strings.Contains(out, "  "+s.Name+defaultNote(s)+"\n") {
			t.Errorf("serve --help does not list %s with its default", s.Name)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		if out, _, err := runCmd(t, brokenEnv, args...); err != nil || !strings.Contains(out, "commands:") {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
	// A flag's value is not taken for a request of help.
	if _, stderr, err := runCmd(t, map[string]string{"REGISTRY_JWT_SECRET": testSecret}, "token", "--sub", "-h", "--role", "reader"); err != nil {
		t.Errorf("--sub -h: %v %s", err, stderr)
	}
}

// Unknown commands, flags, subcommands and stray arguments are usage
// errors (exit status 2), reported on stderr with the command's usage,
// before any configuration is loaded.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: registryd <command>"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"serve", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"serve", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate"}, "a subcommand is needed"},
		{[]string{"migrate", "sideways"}, `unknown subcommand "sideways"`},
		{[]string{"migrate", "up", "--force"}, "-force"},
		{[]string{"migrate", "status", "now"}, `unexpected argument "now"`},
		{[]string{"token", "--ttl", "soon"}, "invalid value"},
		{[]string{"token", "revoke", "--bogus"}, "usage: registryd token revoke"},
		{[]string{"sync", "--twice"}, "-twice"},
		{[]string{"agent", "--bogus"}, "usage: registryd agent"},
		{[]string{"version", "--short"}, "-short"},
		{[]string{"help", "frobnicate"}, `no command "frobnicate"`},
	} {
		out, stderr, err := runCmd(t, brokenEnv, tc.args...)
		if !errors.Is(err, errUsage) || exitCode(err) != 2 || !strings.Contains(stderr, tc.want) || out != "" {
			t.Errorf("%q: %v (exit %d), stdout %q, stderr %q; want a usage error saying %q", tc.args, err, exitCode(err), out, stderr, tc.want)
		}
	}
	// Usage the flags alone cannot tell comes from the command itself,
	// still as a usage error.
	env := map[string]string{"REGISTRY_JWT_SECRET": testSecret}
	for _, args := range [][]string{{"token", "--sub", "x"}, {"token", "revoke"}, {"sync"}} {
		if _, stderr, err := runCmd(t, env, args...); exitCode(err) != 2 || !strings.Contains(stderr, "usage: registryd "+args[0]) {
			t.Errorf("%q: %v %q", args, err, stderr)
		}
	}
	if exitCode(nil) != 0 || exitCode(errors.New("x")) != 1 {
		t.Error("exitCode")
	}
}

// The real process: help exits 0 on stdout, usage errors 2, failures 1,
// and a failure's message names the variable without its secret value.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args       []string
		env        []string
		status     int
		out, noOut string
	}{
		{[]string{"serve", "--help"}, nil, 0, "REGISTRY_WATCH_BUFFER_BYTES (default: 1048576 (1 MiB))", ""},
		{[]string{"migrate", "status", "--help"}, nil, 0, "usage: registryd migrate status", ""},
		{[]string{"--version"}, nil, 0, "go:", ""},
		{[]string{"serve", "--bogus"}, nil, 2, "", ""},
		{[]string{"frobnicate"}, nil, 2, "", ""},
		{[]string{"migrate", "status"}, []string{"REGISTRY_DATABASE_URL=postgres://registry:Hunter2-Secret@db:port/registry"}, 1,
			"REGISTRY_DATABASE_URL: bad port", "Hunter2-Secret"},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append([]string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "REGISTRY_DATABASE_URL=mysql://x:Hunter2-Secret@y/z"}, tc.env...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		status := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			status = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		both := stdout.String() + stderr.String()
		if status != tc.status || !strings.Contains(both, tc.out) || (tc.noOut != "" && strings.Contains(both, tc.noOut)) {
			t.Errorf("%q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", tc.args, status, tc.status, stdout.String(), stderr.String())
		}
		if tc.status == 0 && stderr.Len() > 0 {
			t.Errorf("%q: stderr %q", tc.args, stderr.String())
		}
	}
}

// moduleRoot is the repository's root, two levels up from this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return root
}

var settingNameRE = regexp.MustCompile(`REGISTRY_[A-Z0-9_]*`)

// Every REGISTRY_ variable a string literal anywhere in the code names is
// in the settings table (a name ending in _ is a prefix, as in
// "REGISTRY_SCP_*"), and every setting of the table is named somewhere.
func TestSettingsTableCoversTheSources(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	named := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() && path != root {
			// A module of its own (deploy/) is not registryd's code: its
			// tests name wrong variables on purpose.
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(gotoken.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == gotoken.STRING {
				for _, name := range settingNameRE.FindAllString(lit.Value, -1) {
					if !strings.HasSuffix(name, "_") {
						named[name] = strings.TrimPrefix(path, root+"/")
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(named) < 30 {
		t.Fatalf("found only %d names; is the walk broken?", len(named))
	}
	for name, file := range named {
		if _, ok := lookupSetting(name); !ok {
			t.Errorf("%s (named in %s) is not in the settings table (settings.go)", name, file)
		}
	}
	for _, s := range settings {
		if _, ok := named[s.Name]; !ok && strings.HasPrefix(s.Name, "REGISTRY_") && !strings.HasSuffix(s.Name, "_FILE") {
			t.Errorf("%s is in the settings table but no code names it", s.Name)
		}
	}
}

// configurationDoc is the document whose configuration table lists every
// setting.
const configurationDoc = "docs/operating.md"

// documentedSettings reads the configuration table of configurationDoc:
// each variable with its default cell, without markdown.
func documentedSettings(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(moduleRoot(t), filepath.FromSlash(configurationDoc)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "## Configuration":
			in = true
		case in && strings.HasPrefix(line, "## "):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(line, "|")[1:]
			if len(cells) < 3 {
				t.Fatalf("%s configuration row: %q", configurationDoc, line)
			}
			def := strings.TrimSpace(strings.NewReplacer("`", "", "*", "").Replace(cells[1]))
			names := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`").FindAllStringSubmatch(cells[0], -1)
			for _, m := range names {
				out[m[1]] = def
				if strings.Contains(cells[0], "…_FILE") {
					out[m[1]+"_FILE"] = def
				}
			}
		}
	}
	if len(out) < 30 {
		t.Fatalf("read only %d settings from the configuration table of %s", len(out), configurationDoc)
	}
	return out
}

// The documented configuration table and the settings table name the
// same variables with the same defaults.
func TestSettingsTableMatchesDocs(t *testing.T) {
	t.Parallel()
	documented := documentedSettings(t)
	for _, s := range settings {
		def, ok := documented[s.Name]
		switch {
		case s.Name == "PATH":
		case !ok:
			t.Errorf("%s is missing from the configuration table of %s", s.Name, configurationDoc)
		case def != s.Default:
			t.Errorf("%s: %s gives the default %q, the code %q", s.Name, configurationDoc, def, s.Default)
		}
	}
	for name := range documented {
		if _, ok := lookupSetting(name); !ok {
			t.Errorf("the configuration table of %s has %s, which registryd does not read", configurationDoc, name)
		}
	}
}

// The loaders take their defaults from the table, and the table's agree
// with the packages' own; each literal default is the one --help shows.
func TestSettingsDefaults(t *testing.T) {
	t.Parallel()
	for _, s := range settings {
		if s.value != "" && !strings.HasPrefix(s.Default, s.value) {
			t.Errorf("%s: default %q does not show the value %q", s.Name, s.Default, s.value)
		}
	}
	cfg, err := loadConfig(envFunc(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.DataDir != "./.data" || cfg.DataDirSet || cfg.Migrate ||
		cfg.ShutdownTimeout != 15*time.Second || cfg.AcquireTimeout != 10*time.Second || cfg.StatementTimeout != 30*time.Second ||
		cfg.WatchRetention != 24*time.Hour || cfg.SyncInterval != 5*time.Minute || cfg.SyncTimeout != 10*time.Minute ||
		cfg.LogFormat != "json" || cfg.LogLevel.String() != "INFO" {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.TokenLifetimes.Max != auth.DefaultMaxTTL || cfg.TokenLifetimes.Admin != auth.DefaultAdminMaxTTL ||
		cfg.WatchMaxPerPrincipal != watch.DefaultMaxPerPrincipal || cfg.WatchBufferBytes != watch.DefaultMaxPending {
		t.Errorf("the table's defaults differ from the packages': %+v %+v", cfg.TokenLifetimes, cfg.limits)
	}
	// The settings table's value is the one used: change it, and the
	// loaded default changes.
	ac, err := loadAgentConfig(envFunc(map[string]string{"REGISTRY_SERVER": "https://r.example", "REGISTRY_TOKEN": "a.b.c"}))
	if err != nil || ac.Interval != 10*time.Second || ac.StatePath != defaultAgentState || ac.LogFormat != "text" {
		t.Errorf("agent defaults: %v %+v", err, ac)
	}
}

// Each command reads its own settings and no other: a broken setting of
// another command neither stops nor changes it, and no loader reads a
// variable the table does not list.
func TestCommandsReadTheirOwnSettings(t *testing.T) {
	t.Parallel()
	for _, cmd := range []cmdSet{cmdServe, cmdMigrate, cmdToken, cmdRevoke, cmdSync} {
		var unlisted []string
		loadCommandConfig(cmd, func(name string) string {
			if s, ok := lookupSetting(name); !ok || s.Cmds&cmd == 0 {
				unlisted = append(unlisted, name)
			}
			return ""
		})
		if len(unlisted) > 0 {
			t.Errorf("command %b reads %v, which the table does not list for it", cmd, unlisted)
		}
	}
	bad := map[string]string{"REGISTRY_SCP_GPU_TABLE": "H100=lots", "REGISTRY_SYNC_INTERVAL": "often", "REGISTRY_LISTEN": "elsewhere:1"}
	if _, err := loadCommandConfig(cmdMigrate, envFunc(bad)); err != nil {
		t.Errorf("migrate stopped at settings it does not read: %v", err)
	}
	cfg, err := loadCommandConfig(cmdServe, envFunc(bad))
	if err == nil || !strings.Contains(err.Error(), "REGISTRY_SCP_GPU_TABLE") || !strings.Contains(err.Error(), "REGISTRY_SYNC_INTERVAL") {
		t.Errorf("serve: %v", err)
	}
	if cfg.Listen != "elsewhere:1" {
		t.Errorf("serve's listen: %q", cfg.Listen)
	}
	if cfg, _ := loadCommandConfig(cmdMigrate, envFunc(bad)); cfg.Listen != "127.0.0.1:8080" {
		t.Errorf("migrate saw REGISTRY_LISTEN: %q", cfg.Listen)
	}
}

// serve logs JSON and every other command text, unless
// REGISTRY_LOG_FORMAT says otherwise: checked on the configuration and on
// what a real `token revoke` and a real serve write to stderr.
func TestLogFormatByCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd  cmdSet
		env  string
		want string
	}{
		{cmdServe, "", "json"}, {cmdMigrate, "", "text"}, {cmdToken, "", "text"}, {cmdRevoke, "", "text"},
		{cmdSync, "", "text"}, {cmdServe, "text", "text"}, {cmdMigrate, "json", "json"},
	} {
		cfg, err := loadCommandConfig(tc.cmd, envFunc(map[string]string{"REGISTRY_LOG_FORMAT": tc.env}))
		if err != nil || cfg.LogFormat != tc.want {
			t.Errorf("command %b, REGISTRY_LOG_FORMAT=%q: %v %q, want %q", tc.cmd, tc.env, err, cfg.LogFormat, tc.want)
		}
	}

	// token revoke on an empty database with REGISTRY_MIGRATE logs each
	// migration.
	for _, format := range []string{"", "json"} {
		env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.NewEmpty(t), "REGISTRY_MIGRATE": "true", "REGISTRY_LOG_FORMAT": format}
		_, stderr, err := runCmd(t, env, "token", "revoke", "--sub", "someone")
		if err != nil {
			t.Fatalf("revoke: %v\n%s", err, stderr)
		}
		first, _, _ := strings.Cut(stderr, "\n")
		isJSON := json.Valid([]byte(first))
		if (format == "json") != isJSON || (format == "" && !strings.Contains(first, "level=INFO msg=migrated")) {
			t.Errorf("REGISTRY_LOG_FORMAT=%q: token revoke logged %q", format, first)
		}
	}

	s := startServer(t, map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret})
	lines := strings.Split(strings.TrimSpace(s.stderr.String()), "\n")
	if len(lines) == 0 || !json.Valid([]byte(lines[0])) {
		t.Errorf("serve did not log JSON: %q", lines)
	}
}

// Secret values never appear in a configuration error, however they are
// wrong, and the errors name the variable.
func TestConfigErrorsDoNotEchoSecrets(t *testing.T) {
	t.Parallel()
	const marker = "Sekr3t-Value-xyz"
	cases := []map[string]string{
		{"REGISTRY_JWT_SECRET": marker},
		{"REGISTRY_JWT_SECRET": marker, "REGISTRY_JWT_SECRET_FILE": "/nonexistent"},
		{"REGISTRY_SCP_ENDPOINT": "https://scp.example", "REGISTRY_SCP_ACCESS_KEY": marker},
		{"REGISTRY_SCP_ENDPOINT": "https://scp.example", "REGISTRY_SCP_SECRET_KEY": marker, "REGISTRY_SCP_SECRET_KEY_FILE": "/x"},
		{"REGISTRY_E2E_ENDPOINT": "https://e2e.example", "REGISTRY_E2E_API_KEY": marker},
		{"REGISTRY_E2E_ENDPOINT": "https://e2e.example", "REGISTRY_E2E_TOKEN": marker + " x", "REGISTRY_E2E_TOKEN_FILE": "/x"},
		{"REGISTRY_DATABASE_URL": "postgres://u:" + marker + "@h:x/db"},
	}
	// Every secret setting, set to the marker next to broken neighbours.
	for _, s := range settings {
		if s.Secret {
			cases = append(cases, map[string]string{s.Name: marker + " \n", "REGISTRY_LOG_LEVEL": "loud", s.Name + "_FILE": "/nonexistent"})
		}
	}
	for _, env := range cases {
		for _, cmd := range []cmdSet{cmdServe, cmdToken, cmdSync} {
			_, err := loadCommandConfig(cmd, envFunc(env))
			if err != nil && strings.Contains(err.Error(), marker) {
				t.Errorf("command %b, %v: the error shows the secret: %v", cmd, env, err)
			}
		}
		if _, err := loadAgentConfig(envFunc(env)); err != nil && strings.Contains(err.Error(), marker) {
			t.Errorf("agent, %v: the error shows the secret: %v", env, err)
		}
	}
	// The agent's server URL may carry credentials by mistake: refused
	// without quoting them.
	_, err := loadAgentConfig(envFunc(map[string]string{"REGISTRY_SERVER": "https://agent:" + marker + "@registry.example", "REGISTRY_TOKEN": "a.b.c"}))
	if err == nil || strings.Contains(err.Error(), marker) || !strings.Contains(err.Error(), "REGISTRY_SERVER") {
		t.Errorf("REGISTRY_SERVER with a password: %v", err)
	}
	// main's net redacts whatever a message might still quote.
	if got := redactSecrets("x "+marker+" y", envFunc(map[string]string{"REGISTRY_E2E_TOKEN": marker})); strings.Contains(got, marker) {
		t.Errorf("redactSecrets: %q", got)
	}
}

// An unusable REGISTRY_DATABASE_URL stops every command that reads it
// with what is wrong, never the password.
func TestDatabaseURLErrors(t *testing.T) {
	t.Parallel()
	const pw = "Hunter2-Secret"
	for _, tc := range []struct{ url, want string }{
		{"mysql://u:" + pw + "@db/registry", `scheme must be postgres or postgresql, not "mysql"`},
		{"POSTGRES://u:" + pw + "@db/registry", "scheme must be postgres or postgresql"},
		{"postgres://u:" + pw + "@/registry", "missing host"},
		{"postgres://u:" + pw + "@db:port/registry", "bad port"},
		{"postgres://u:" + pw + "@db:99999/registry", "bad port"},
		{"postgres://u:" + pw + "@db:5432,:5433/registry", "missing host"},
		{"postgres://u:" + pw + "@db/registry?sslmod=require", `unknown parameter "sslmod" (did you mean sslmode?)`},
		{"postgres://u:" + pw + "@db/registry?pool_max=4", `unknown parameter "pool_max"`},
		{"postgres://u:" + pw + "@db/registry?sslmode=sometimes", "sslmode is invalid"},
		{"postgres://u:" + pw + "@db/registry?connect_timeout=soon", "invalid connect_timeout"},
		{"postgres://u:" + pw + "@db/registry?pool_max_conns=lots", "pool_max_conns"},
		{"postgres://u:" + pw + "@db/registry?target_session_attrs=fast", "target_session_attrs"},
		// Unescaped characters in the password make it the "host".
		{"postgres://u:Hunter2/Secret@db/registry", "percent-encode"},
		{"postgres://u:Hunter2#Secret@db/registry", "percent-encode"},
		{"postgres://u:Hunter2?Secret@db/registry", "percent-encode"},
		{"postgres://u:Hunter2%Secret@db/registry", "%25"},
		{"postgres://u:Hunter 2-Secret@db/registry", ""},
		{"db.example:5432/registry", "neither a URL"},
		{"host=db password=" + pw + " sslmode=sometimes", "sslmode is invalid"},
		{"host=db password='" + pw + " dbname=x", "unterminated quoted string"},
	} {
		msg := databaseURLProblem(tc.url)
		if msg == "" || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %q, want %q", tc.url, msg, tc.want)
		}
		for _, p := range []string{pw, "Hunter2", "Secret"} {
			if strings.Contains(msg, p) {
				t.Errorf("%s: the message shows (part of) the password: %q", tc.url, msg)
			}
		}
	}
	for _, ok := range []string{
		"postgres://registry:" + pw + "@db:5432/registry?sslmode=require",
		"postgresql://registry@db1:5432,db2:5432/registry?target_session_attrs=read-write&application_name=registryd",
		"postgres:///registry?host=/var/run/postgresql",
		"postgres://u:p%40ss@[::1]:5432/registry?pool_max_conns=8&search_path=public",
		"host=db user=registry password=" + pw + " dbname=registry",
	} {
		if msg := databaseURLProblem(ok); msg != "" {
			t.Errorf("%s: %q", ok, msg)
		}
	}
	// The last net: what might be a password, however malformed the URL.
	for raw, want := range map[string]string{
		"postgres://u:Hunter2/Secret@db/x":      "Hunter2/Secret",
		"postgres://u:Hunter2%2FSecret@db/x":    "Hunter2/Secret",
		"host=db password='Hunter2 Secret' x=y": "Hunter2 Secret",
		"postgres://db/x?password=Hunter2&a=b":  "Hunter2",
	} {
		if got := passwordsIn(raw); !slices.Contains(got, want) {
			t.Errorf("passwordsIn(%s) = %q, want %q among them", raw, got, want)
		}
	}
	// Through a command: the variable named, the password absent.
	env := map[string]string{"REGISTRY_DATABASE_URL": "postgres://u:" + pw + "@db:port/registry"}
	for _, args := range [][]string{{"migrate", "status"}, {"serve"}, {"sync", "--once"}, {"token", "revoke", "--sub", "x"}} {
		_, stderr, err := runCmd(t, env, args...)
		if err == nil || !strings.Contains(err.Error(), "REGISTRY_DATABASE_URL: bad port") || strings.Contains(err.Error()+stderr, pw) {
			t.Errorf("%q: %v %q", args, err, stderr)
		}
	}
}

// closestKnownParam flags likely typos only: server settings pass.
func TestClosestKnownParam(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]string{"sslmod": "sslmode", "connect_timout": "connect_timeout", "hots": "",
		"pool_size": "pool_max_conns", "application_name": "", "work_mem": "", "statement_timeout": "", "lock_timeout": ""} {
		if got := closestKnownParam(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if slices.Contains(knownParams, "") {
		t.Error("empty known parameter")
	}
}
