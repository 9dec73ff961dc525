package main

import (
	"strings"
	"testing"
)

// p is the settings' prefix.
const p = "REGISTRY_"

// A REGISTRY_ variable no command reads is a warning naming the setting
// it most likely misspells; one that is near none is named alone; known
// ones (any command's) and other variables say nothing.
func TestUnknownSettings(t *testing.T) {
	// The wrong names are built, so that no literal names a setting that
	// does not exist (TestSettingsTableCoversTheSources).
	got := unknownSettings([]string{p + "LISTN=:8080", p + "NOTHING_LIKE_IT=1", "REGISTRY_LISTEN=:8080",
		"REGISTRY_AGENT_FABRIC=f1", "PATH=/bin", p + "SCP_ENDPIONT=https://scp.example"})
	want := []string{
		p + "LISTN is not a setting registryd reads; it is ignored; did you mean REGISTRY_LISTEN?",
		p + "NOTHING_LIKE_IT is not a setting registryd reads; it is ignored",
		p + "SCP_ENDPIONT is not a setting registryd reads; it is ignored; did you mean REGISTRY_SCP_ENDPOINT?",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A command says so in its log at start (the finding: a misspelt
// REGISTRY_LISTN was ignored silently). Not parallel: it swaps environ.
func TestCommandWarnsOfUnknownSettings(t *testing.T) {
	saved := environ
	t.Cleanup(func() { environ = saved })
	environ = func() []string { return []string{p + "LISTN=127.0.0.1:9999"} }
	_, stderr, err := runCmd(t, map[string]string{"REGISTRY_JWT_SECRET": testSecret}, "token", "--sub", "someone", "--role", "reader")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, p+"LISTN is not a setting registryd reads") || !strings.Contains(stderr, "did you mean REGISTRY_LISTEN?") {
		t.Errorf("stderr lacks the warning:\n%s", stderr)
	}
}

// A command whose configuration fails, as a misspelt required setting
// makes it, still names the misspelling (its logger never started).
func TestFailedConfigWarnsOfUnknownSettings(t *testing.T) {
	saved := environ
	t.Cleanup(func() { environ = saved })
	environ = func() []string { return []string{p + "SCP_SECRT_KEY=sk"} }
	_, stderr, err := runCmd(t, map[string]string{"REGISTRY_SCP_ENDPOINT": "https://scp.invalid", "REGISTRY_SCP_ACCESS_KEY": "ak"}, "sync", "--once")
	if err == nil || !strings.Contains(err.Error(), "REGISTRY_SCP_SECRET_KEY") {
		t.Fatalf("sync --once without the secret key: %v", err)
	}
	if !strings.Contains(stderr, "registryd: warning: "+p+"SCP_SECRT_KEY is not a setting registryd reads") ||
		!strings.Contains(stderr, "did you mean REGISTRY_SCP_SECRET_KEY?") {
		t.Errorf("stderr lacks the warning:\n%s", stderr)
	}
}
