package deploy

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"testing"
	"testing/fstest"
)

// secretFiles stand in for the files under k8s/secrets/ that operators
// create; providers.env is the example with every key filled in, so its
// keys are checked against what registryd reads.
func secretFiles(t *testing.T) map[string]string {
	t.Helper()
	example, err := os.ReadFile("k8s/secrets/providers.env.example")
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, l := range strings.Split(string(example), "\n") {
		if k, _, ok := strings.Cut(strings.TrimPrefix(l, "# "), "="); ok && strings.HasPrefix(k, "REGISTRY_") {
			env = append(env, k+"=x")
		}
	}
	if len(env) == 0 {
		t.Fatal("providers.env.example names no variable")
	}
	return map[string]string{
		"secrets/database-url":  "postgres://registry@db1,db2/registry?target_session_attrs=read-write",
		"secrets/jwt-secret":    strings.Repeat("s", 64),
		"secrets/agent-token":   "eyJ.x.y",
		"secrets/providers.env": strings.Join(env, "\n") + "\n",
	}
}

func settings(t *testing.T) (server, agent []string) {
	t.Helper()
	server, err := Settings("settings/server.txt")
	if err != nil {
		t.Fatal(err)
	}
	agent, err = Settings("settings/agent.txt")
	if err != nil {
		t.Fatal(err)
	}
	return server, agent
}

// k8sFiles is deploy/k8s as it is, to be changed by a test.
func k8sFiles(t *testing.T) fstest.MapFS {
	t.Helper()
	files := fstest.MapFS{}
	err := fs.WalkDir(os.DirFS("k8s"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path.Join("k8s", p))
		files[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// The manifests, as `kubectl apply -k deploy/k8s` would apply them, decode
// strictly into the Kubernetes API types and pass the review in Check.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	server, agent := settings(t)
	objs, err := Build(k8sFiles(t), secretFiles(t))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		t := fmt.Sprintf("%T", o)
		kinds[t[strings.LastIndex(t, ".")+1:]]++
	}
	t.Logf("built: %v", kinds)
	for _, p := range Check(objs, server, agent) {
		t.Error(p)
	}
	// Three generated Secrets, one ConfigMap, and the rest.
	for kind, n := range map[string]int{"Secret": 3, "ConfigMap": 1, "Deployment": 1, "DaemonSet": 1, "Service": 1,
		"PodDisruptionBudget": 1, "Namespace": 2, "ServiceAccount": 2, "NetworkPolicy": 1, "Ingress": 1} {
		if kinds[kind] != n {
			t.Errorf("%d %s, want %d", kinds[kind], kind, n)
		}
	}
}

// Each way a manifest can go wrong is caught: the review has teeth.
func TestKubernetesManifestsBroken(t *testing.T) {
	t.Parallel()
	server, agent := settings(t)
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"unknown field", "registryd.yaml", "  replicas: 3\n", "  replicas: 3\n  replica: 3\n", `unknown field "spec.replica"`},
		{"misspelt probe field", "registryd.yaml", "            periodSeconds: 5\n", "            periodSecond: 5\n", `unknown field`},
		{"duplicate field", "registryd-config.yaml", "  REGISTRY_LOG_LEVEL: info\n", "  REGISTRY_LOG_LEVEL: info\n  REGISTRY_LOG_LEVEL: debug\n", `already set in map`},
		{"unknown kind", "namespace.yaml", "kind: Namespace", "kind: Namespaces", `no kind "Namespaces"`},
		{"file not in the kustomization", "extra.yaml", "", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", "extra.yaml is not among"},
		{"unknown kustomization field", "kustomization.yaml", "kind: Kustomization\n", "kind: Kustomization\nnamespaces: [x]\n", `unknown field "namespaces"`},
		{"registryd's namespace not restricted", "namespace.yaml", "    pod-security.kubernetes.io/enforce: restricted\n", "    pod-security.kubernetes.io/enforce: baseline\n", "does not enforce the restricted Pod Security Standard"},
		{"the agent among registryd's pods", "registryd-agent.yaml", "kind: DaemonSet\nmetadata:\n  name: registryd-agent\n  namespace: registryd-agent\n", "kind: DaemonSet\nmetadata:\n  name: registryd-agent\n  namespace: registryd\n", `DaemonSet: namespace registryd enforces Pod Security "restricted", which refuses host namespaces`},
		{"a host port", "registryd.yaml", "              containerPort: 8080\n", "              containerPort: 8080\n              hostPort: 8080\n", `which refuses hostPort`},
		{"an object in no namespace made", "registryd-config.yaml", "  namespace: registryd\n", "  namespace: registry\n", `in namespace "registry", which the kustomization does not make`},
		{"readiness on /healthz", "registryd.yaml", "              path: /readyz\n", "              path: /healthz\n", "readiness probe asks /healthz, want /readyz"},
		{"liveness on the wrong port", "registryd.yaml", "          livenessProbe:\n            httpGet:\n              path: /healthz\n              port: http\n", "          livenessProbe:\n            httpGet:\n              path: /healthz\n              port: 9090\n", "liveness probe port 9090"},
		{"listen elsewhere", "registryd-config.yaml", "REGISTRY_LISTEN: 0.0.0.0:8080", "REGISTRY_LISTEN: 0.0.0.0:9000", "REGISTRY_LISTEN \"0.0.0.0:9000\" is on no container port"},
		{"one replica", "registryd.yaml", "  replicas: 3\n", "  replicas: 1\n", "replicas"},
		{"writable root", "registryd.yaml", "            readOnlyRootFilesystem: true\n", "            readOnlyRootFilesystem: false\n", "container migrate securityContext"},
		{"privilege escalation", "registryd.yaml", "            allowPrivilegeEscalation: false\n", "            allowPrivilegeEscalation: true\n", "securityContext"},
		{"root", "registryd.yaml", "        runAsNonRoot: true\n        runAsUser: 65532", "        runAsNonRoot: false\n        runAsUser: 65532", "want runAsNonRoot"},
		{"capabilities kept", "registryd.yaml", "              drop: [\"ALL\"]\n", "              drop: [\"NET_RAW\"]\n", "every capability dropped"},
		{"no seccomp", "registryd.yaml", "        seccompProfile:\n          type: RuntimeDefault\n", "", "seccomp RuntimeDefault"},
		{"no memory limit", "registryd.yaml", "            limits:\n              memory: 512Mi\n", "", "container registryd resources"},
		{"replicas on one node", "registryd.yaml", "          whenUnsatisfiable: DoNotSchedule\n", "          whenUnsatisfiable: ScheduleAnyway\n", "not kept on different nodes"},
		{"variable registryd does not read", "registryd-config.yaml", "  REGISTRY_LOG_LEVEL: info\n", "  REGISTRY_LOG_LEVEL: info\n  REGISTRY_DB_MAXCONNS: \"5\"\n", "sets REGISTRY_DB_MAXCONNS, which it does not read"},
		{"agent variable the agent does not read", "registryd-agent.yaml", "            - name: REGISTRY_AGENT_INTERVAL\n", "            - name: REGISTRY_AGENT_PERIOD\n", "the DaemonSet sets REGISTRY_AGENT_PERIOD"},
		{"every replica migrates", "registryd-config.yaml", "  REGISTRY_LOG_LEVEL: info\n", "  REGISTRY_LOG_LEVEL: info\n  REGISTRY_MIGRATE: \"true\"\n", "REGISTRY_MIGRATE=true"},
		{"no migrate init container", "registryd.yaml", `args: ["migrate", "up"]`, `args: ["migrate", "status"]`, "want one that runs `migrate up`"},
		{"a Secret nobody makes", "registryd.yaml", "                  name: registryd\n                  key: database-url\n            - name: REGISTRY_LOG_FORMAT", "                  name: registryd-db\n                  key: database-url\n            - name: REGISTRY_LOG_FORMAT", `uses Secret "registryd-db"`},
		{"a key the Secret lacks", "registryd.yaml", "              - key: jwt-secret\n", "              - key: jwt-key\n", `uses key "jwt-key"`},
		{"a secret in the manifest", "registryd-config.yaml", "  REGISTRY_LOG_LEVEL: info\n", "  REGISTRY_LOG_LEVEL: info\n  REGISTRY_JWT_SECRET: hunter2hunter2hunter2hunter2hunter2\n", "REGISTRY_JWT_SECRET has its value in the manifest"},
		{"Service selects nothing", "registryd.yaml", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: registryd\n", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: registry\n", "Service selector"},
		{"budget allows every replica down", "registryd.yaml", "  maxUnavailable: 1\n", "  maxUnavailable: 3\n", "PodDisruptionBudget maxUnavailable 3"},
		{"agent token by subPath", "registryd-agent.yaml", "              mountPath: /var/run/secrets/registryd\n", "              mountPath: /var/run/secrets/registryd\n              subPath: token\n", "subPath"},
		{"no network policy", "networkpolicy.yaml", "      app.kubernetes.io/name: registryd\n", "      app.kubernetes.io/name: registry\n", "no NetworkPolicy selects the Deployment's pods"},
		{"network policy without PostgreSQL", "networkpolicy.yaml", "        - port: 5432\n", "        - port: 5433\n", "lacks 5432/TCP"},
		{"network policy open to every port in", "networkpolicy.yaml", "    - ports:\n        - port: http\n          protocol: TCP\n", "    - {}\n", "lets in [every port]"},
		{"network policy open to every port out", "networkpolicy.yaml", "  egress:\n", "  egress:\n    - {}\n", "lets out every port"},
		{"Ingress to another Service", "ingress.yaml", "                name: registryd\n", "                name: registryd-api\n", `sends to Service "registryd-api", not "registryd"`},
		{"Ingress to a port the Service lacks", "ingress.yaml", "                  name: http\n", "                  name: https\n", "sends to port https of Service registryd, which has no such port"},
		{"Ingress to a port number the Service lacks", "ingress.yaml", "                  name: http\n", "                  number: 8080\n", "sends to port 8080 of Service registryd"},
		{"TLS for another host", "ingress.yaml", `hosts: ["registry.example.com"]`, `hosts: ["registry.example.org"]`, "serves TLS for [registry.example.org], not for the agents' host registry.example.com"},
		{"agents elsewhere", "registryd-agent.yaml", "value: https://registry.example.com\n", "value: https://registryd.example.com\n", "no rule for the agents' host registryd.example.com"},
		{"agents over http", "registryd-agent.yaml", "value: https://registry.example.com\n", "value: http://registry.example.com\n", `REGISTRY_SERVER "http://registry.example.com" is not an https URL`},
		{"no certificate issuer", "ingress.yaml", "    cert-manager.io/cluster-issuer: letsencrypt\n", "", "no cert-manager.io/cluster-issuer"},
		{"TLS without a Secret", "ingress.yaml", "      secretName: registryd-tls\n", "", "the TLS entry of registry.example.com names no Secret"},
		{"serve's TLS with probes in clear", "registryd-config.yaml", "  REGISTRY_LOG_LEVEL: info\n", "  REGISTRY_LOG_LEVEL: info\n  REGISTRY_TLS_CERT_FILE: /tls/tls.crt\n  REGISTRY_TLS_KEY_FILE: /tls/tls.key\n", "readiness probe asks over HTTP, but serve speaks HTTPS"},
		{"probes over https to plain HTTP", "registryd.yaml", "              path: /readyz\n", "              path: /readyz\n              scheme: HTTPS\n", "readiness probe asks over HTTPS, but serve speaks plain HTTP"},
		{"an image by the tag latest", "kustomization.yaml", "  - name: ghcr.io/registryd/registryd\n    newTag: v0.1.0\n", "  - name: ghcr.io/registryd/registryd\n    newTag: latest\n", `container registryd's image "ghcr.io/registryd/registryd:latest" is not pinned`},
		{"an image without a tag", "registryd-agent.yaml", "image: ghcr.io/registryd/registryd-agent:v0.1.0", "image: registry.example.com/registryd-agent", `registryd-agent.yaml, document 2: *v1.DaemonSet registryd-agent: container agent's image "registry.example.com/registryd-agent" is not pinned`},
		{"a manifest's image latest", "registryd.yaml", "image: ghcr.io/registryd/registryd:v0.1.0\n          args: [\"migrate\", \"up\"]", "image: ghcr.io/registryd/registryd:latest\n          args: [\"migrate\", \"up\"]", `container migrate's image "ghcr.io/registryd/registryd:latest" is not pinned`},
		{"agent token in the manifest", "registryd-agent.yaml", "            - name: REGISTRY_AGENT_INTERVAL\n", "            - name: REGISTRY_TOKEN\n              value: eyJ.x.y\n            - name: REGISTRY_AGENT_INTERVAL\n", "token is in the manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := k8sFiles(t)
			if tc.old == "" {
				files[tc.file] = &fstest.MapFile{Data: []byte(tc.new)}
			} else {
				f, ok := files[tc.file]
				if !ok || !strings.Contains(string(f.Data), tc.old) {
					t.Fatalf("%s does not contain %q", tc.file, tc.old)
				}
				files[tc.file] = &fstest.MapFile{Data: []byte(strings.Replace(string(f.Data), tc.old, tc.new, 1))}
			}
			objs, err := Build(files, secretFiles(t))
			var got string
			if err != nil {
				got = err.Error()
			} else {
				got = strings.Join(Check(objs, server, agent), "\n")
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("broken manifest: want a complaint containing %q, got:\n%s", tc.want, got)
			}
		})
	}
}

// An image pinned by its digest rather than a tag passes the review.
func TestKubernetesImageByDigest(t *testing.T) {
	t.Parallel()
	server, agent := settings(t)
	files := k8sFiles(t)
	k := string(files["kustomization.yaml"].Data)
	pinned := strings.Replace(k, "  - name: ghcr.io/registryd/registryd\n    newTag: v0.1.0\n", "  - name: ghcr.io/registryd/registryd\n    digest: sha256:"+strings.Repeat("0123456789abcdef", 4)+"\n", 1)
	if pinned == k {
		t.Fatal("kustomization.yaml does not pin ghcr.io/registryd/registryd by newTag v0.1.0")
	}
	files["kustomization.yaml"] = &fstest.MapFile{Data: []byte(pinned)}
	objs, err := Build(files, secretFiles(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Check(objs, server, agent) {
		t.Error(p)
	}
}

// Without the secret files the operator creates, the build fails saying
// which is missing.
func TestKubernetesSecretsRequired(t *testing.T) {
	t.Parallel()
	secrets := secretFiles(t)
	delete(secrets, "secrets/jwt-secret")
	if _, err := Build(k8sFiles(t), secrets); err == nil || !strings.Contains(err.Error(), "jwt-secret") {
		t.Errorf("build without secrets/jwt-secret: %v", err)
	}
}
