package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The agent reads exactly agentSettings from the environment, so the
// deploy files can be checked against that list.
func TestAgentSettingsList(t *testing.T) {
	t.Parallel()
	var read []string
	loadAgentConfig(func(k string) string {
		if !slices.Contains(read, k) {
			read = append(read, k)
		}
		return ""
	})
	slices.Sort(read)
	want := slices.Sorted(slices.Values(agentSettings))
	if !slices.Equal(read, want) {
		t.Errorf("loadAgentConfig reads %v; agentSettings lists %v", read, want)
	}
}

// The systemd unit runs `registryd agent` hardened, with its settings from
// /etc/registryd/agent.env, its token as a credential file and its state
// where the agent's default puts it; every REGISTRY_ variable it sets is
// one the agent reads. Where systemd-analyze is installed, the unit
// verifies with no complaint.
func TestAgentSystemdUnit(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "deploy", "registryd-agent.service")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("not a setting: %q", line)
		}
		settings[k] = append(settings[k], v)
	}
	for k, v := range map[string]string{
		"ExecStart":               "/usr/local/bin/registryd agent",
		"EnvironmentFile":         "/etc/registryd/agent.env",
		"Restart":                 "on-failure",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"DynamicUser":             "yes",
		"StateDirectory":          "registryd-agent",
		"StateDirectoryMode":      "0700",
		"LoadCredential":          "token:/etc/registryd/agent.token",
		"CapabilityBoundingSet":   "",
		"PrivateTmp":              "yes",
		"ProtectHome":             "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
	} {
		if !slices.Contains(settings[k], v) {
			t.Errorf("%s=%s missing (have %q)", k, v, settings[k])
		}
	}
	if slices.Contains(settings["PrivateDevices"], "yes") {
		t.Error("PrivateDevices=yes hides /dev/nvidia* from nvidia-smi")
	}
	env := map[string]string{}
	for _, e := range settings["Environment"] {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	if env["REGISTRY_TOKEN_FILE"] != "%d/token" {
		t.Errorf("REGISTRY_TOKEN_FILE=%q, want the credential %%d/token", env["REGISTRY_TOKEN_FILE"])
	}
	if env["REGISTRY_AGENT_STATE"] != defaultAgentState || filepath.Dir(defaultAgentState) != "/var/lib/registryd-agent" {
		t.Errorf("state %q is not in the StateDirectory", env["REGISTRY_AGENT_STATE"])
	}
	for k := range env {
		if !slices.Contains(agentSettings, k) {
			t.Errorf("the unit sets %s, which the agent does not read", k)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed; the unit is not verified by systemd")
		return
	}
	// verify wants the binary to exist: point ExecStart at this test's.
	self, _ := os.Executable()
	unit := filepath.Join(t.TempDir(), "registryd-agent.service")
	os.WriteFile(unit, bytes.ReplaceAll(b, []byte("/usr/local/bin/registryd"), []byte(self)), 0o644)
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	// Complaints about the unit name the file; anything else (no systemd
	// running here, say) is not the unit's.
	if err != nil || bytes.Contains(out, []byte(unit)) {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// The agent DaemonSet (deploy/k8s/registryd-agent.yaml) is checked, decoded
// strictly into the Kubernetes API types, by the deploy module
// (deploy/k8s_test.go), against deploy/settings/agent.txt, which
// TestSettingsFiles keeps equal to what the agent reads.
