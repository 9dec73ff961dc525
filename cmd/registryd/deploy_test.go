package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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

// The DaemonSet parses, runs `registryd agent` on the host's network on
// GPU nodes, takes the token from a Secret mounted as a file (so rotation
// reaches it) and keeps the state on the host; every REGISTRY_ variable
// it sets is one the agent reads. No cluster runs it here.
func TestAgentDaemonSet(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "k8s", "registryd-agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type mount struct {
		Name      string
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	}
	type daemonSet struct {
		Kind string
		Spec struct {
			Template struct {
				Spec struct {
					HostNetwork      bool              `yaml:"hostNetwork"`
					RuntimeClassName string            `yaml:"runtimeClassName"`
					NodeSelector     map[string]string `yaml:"nodeSelector"`
					Tolerations      []struct{ Key string }
					Containers       []struct {
						Args []string
						Env  []struct {
							Name      string
							Value     string
							ValueFrom map[string]any `yaml:"valueFrom"`
						}
						VolumeMounts    []mount `yaml:"volumeMounts"`
						SecurityContext struct {
							AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
							ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
							Capabilities             struct{ Drop []string }
						} `yaml:"securityContext"`
					}
					Volumes []struct {
						Name   string
						Secret *struct {
							SecretName string `yaml:"secretName"`
						}
						HostPath *struct{ Path string } `yaml:"hostPath"`
					}
				}
			}
		}
	}
	dec := yaml.NewDecoder(f)
	var kinds []string
	var ds *daemonSet
	for {
		var doc daemonSet
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("the manifest does not parse: %v", err)
		}
		kinds = append(kinds, doc.Kind)
		if doc.Kind == "DaemonSet" {
			ds = &doc
		}
	}
	if ds == nil {
		t.Fatalf("no DaemonSet among %v", kinds)
	}
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork || pod.RuntimeClassName != "nvidia" || pod.NodeSelector["nvidia.com/gpu.present"] != "true" ||
		!slices.ContainsFunc(pod.Tolerations, func(t struct{ Key string }) bool { return t.Key == "nvidia.com/gpu" }) {
		t.Errorf("pod spec: %+v", pod)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %+v", pod.Containers)
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args, []string{"agent"}) {
		t.Errorf("args %v", c.Args)
	}
	sc := c.SecurityContext
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !sc.ReadOnlyRootFilesystem || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("security context: %+v", sc)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if strings.HasPrefix(e.Name, "REGISTRY_") && !slices.Contains(agentSettings, e.Name) {
			t.Errorf("the DaemonSet sets %s, which the agent does not read", e.Name)
		}
	}
	if env["REGISTRY_SERVER"] == "" || env["NVIDIA_VISIBLE_DEVICES"] != "all" || !strings.Contains(env["NVIDIA_DRIVER_CAPABILITIES"], "utility") {
		t.Errorf("env: %v", env)
	}
	// The token file and the state lie in mounts of the right volumes.
	volumeOf := func(file string) (mount, bool) {
		for _, m := range c.VolumeMounts {
			if filepath.Dir(file) == m.MountPath {
				return m, true
			}
		}
		return mount{}, false
	}
	tm, ok := volumeOf(env["REGISTRY_TOKEN_FILE"])
	if !ok || tm.SubPath != "" {
		t.Errorf("REGISTRY_TOKEN_FILE %q is not in a whole mounted volume: %+v", env["REGISTRY_TOKEN_FILE"], c.VolumeMounts)
	}
	sm, ok := volumeOf(env["REGISTRY_AGENT_STATE"])
	if !ok {
		t.Errorf("REGISTRY_AGENT_STATE %q is not in a mounted volume", env["REGISTRY_AGENT_STATE"])
	}
	for _, v := range pod.Volumes {
		switch v.Name {
		case tm.Name:
			if v.Secret == nil {
				t.Errorf("the token's volume %q is not a Secret", v.Name)
			}
		case sm.Name:
			if v.HostPath == nil {
				t.Errorf("the state's volume %q is not on the host", v.Name)
			}
		}
	}
}
