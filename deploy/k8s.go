package deploy

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	psa "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The kinds the manifests may hold; anything else is refused.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict decodes YAML into the API types, refusing unknown and duplicate
// fields, as `kubectl apply --validate=strict` does.
var strict = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{Yaml: true, Strict: true})

// DecodeStrict decodes one Kubernetes object.
func DecodeStrict(doc []byte) (runtime.Object, error) {
	obj, _, err := strict.Decode(doc, nil, nil)
	return obj, err
}

// SplitDocuments splits a multi-document YAML file, dropping empty ones.
func SplitDocuments(b []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if strings.TrimSpace(stripComments(cur.String())) != "" {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if strings.TrimRight(sc.Text(), " ") == "---" {
			flush()
			continue
		}
		cur.WriteString(sc.Text() + "\n")
	}
	flush()
	return docs
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Kustomization reads kustomization.yaml strictly.
func Kustomization(files fs.FS) (types.Kustomization, error) {
	var k types.Kustomization
	b, err := fs.ReadFile(files, "kustomization.yaml")
	if err != nil {
		return k, err
	}
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		return k, fmt.Errorf("kustomization.yaml: %w", err)
	}
	return k, nil
}

// Build checks that every manifest file decodes strictly, names its
// images by a tag other than latest or by a digest, and is listed in the
// kustomization, then builds the kustomization as `kubectl apply -k`
// would (in memory, with secretFiles standing in for the files under
// secrets/ that operators create) and decodes what it makes strictly.
func Build(files fs.FS, secretFiles map[string]string) ([]runtime.Object, error) {
	k, err := Kustomization(files)
	if err != nil {
		return nil, err
	}
	mem := filesys.MakeFsInMemory()
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, err
	}
	var manifests []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := fs.ReadFile(files, e.Name())
		if err != nil {
			return nil, err
		}
		if err := mem.WriteFile(path.Join("/k8s", e.Name()), b); err != nil {
			return nil, err
		}
		if !strings.HasSuffix(e.Name(), ".yaml") || e.Name() == "kustomization.yaml" {
			continue
		}
		manifests = append(manifests, e.Name())
		for i, doc := range SplitDocuments(b) {
			obj, err := DecodeStrict(doc)
			if err == nil {
				err = errors.Join(unpinnedImages(obj)...)
			}
			if err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", e.Name(), i+1, err)
			}
		}
	}
	for _, m := range manifests {
		if !slices.Contains(k.Resources, m) {
			return nil, fmt.Errorf("%s is not among kustomization.yaml's resources %v", m, k.Resources)
		}
	}
	for name, content := range secretFiles {
		if err := mem.WriteFile(path.Join("/k8s", name), []byte(content)); err != nil {
			return nil, err
		}
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/k8s")
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	var objs []runtime.Object
	for _, r := range res.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		obj, err := DecodeStrict(b)
		if err != nil {
			return nil, fmt.Errorf("kustomize's %s/%s: %w", r.GetKind(), r.GetName(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// Settings reads one of settings/*.txt: the environment variables a
// registryd command reads (kept true by cmd/registryd's TestSettingsFiles).
func Settings(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	return names, nil
}

// runtimeEnv are variables that are not registryd's but the Go runtime's,
// which the server's containers may set too.
var runtimeEnv = []string{"GOMEMLIMIT", "GOMAXPROCS", "GOGC"}

// Check returns every problem with the built objects: what a reviewer of
// a deployment of registryd would look for.
func Check(objs []runtime.Object, server, agent []string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	var deploys []*appsv1.Deployment
	var daemons []*appsv1.DaemonSet
	var services []*corev1.Service
	var pdbs []*policyv1.PodDisruptionBudget
	var netpols []*networkingv1.NetworkPolicy
	var ingresses []*networkingv1.Ingress
	namespaces := map[string]*corev1.Namespace{}
	configMaps := map[string]*corev1.ConfigMap{} // by namespace/name
	secrets := map[string]*corev1.Secret{}       // by namespace/name
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			deploys = append(deploys, o)
		case *appsv1.DaemonSet:
			daemons = append(daemons, o)
		case *corev1.Service:
			services = append(services, o)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
		case *networkingv1.NetworkPolicy:
			netpols = append(netpols, o)
		case *networkingv1.Ingress:
			ingresses = append(ingresses, o)
		case *corev1.ConfigMap:
			configMaps[o.Namespace+"/"+o.Name] = o
		case *corev1.Secret:
			secrets[o.Namespace+"/"+o.Name] = o
		case *corev1.Namespace:
			namespaces[o.Name] = o
		}
	}
	for _, o := range objs {
		for _, err := range unpinnedImages(o) {
			bad("%v", err)
		}
		if m, ok := o.(interface{ GetNamespace() string }); ok {
			if _, isNS := o.(*corev1.Namespace); !isNS && namespaces[m.GetNamespace()] == nil {
				bad("%T is in namespace %q, which the kustomization does not make", o, m.GetNamespace())
			}
		}
	}
	if len(deploys) != 1 || len(daemons) != 1 || len(services) != 1 || len(pdbs) != 1 {
		bad("want one Deployment, DaemonSet, Service and PodDisruptionBudget; have %d, %d, %d, %d", len(deploys), len(daemons), len(services), len(pdbs))
		return problems
	}
	d := deploys[0]
	pod := d.Spec.Template.Spec
	checkNetworkPolicy(d, netpols, bad)

	// Every Secret a pod uses is one the kustomization makes, with the key.
	secretKey := func(where, ns, name, key string, optional *bool) {
		s, ok := secrets[ns+"/"+name]
		switch {
		case !ok:
			bad("%s uses Secret %q, which the kustomization does not make in namespace %s (it makes %v)", where, name, ns, keys(secrets))
		case key != "" && s.Data[key] == nil && !(optional != nil && *optional):
			bad("%s uses key %q of Secret %q, which has %v", where, key, name, keys(s.Data))
		}
	}
	checkSecrets := func(kind, ns string, spec corev1.PodSpec) {
		for _, v := range spec.Volumes {
			if v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				secretKey(kind+" volume "+v.Name, ns, v.Secret.SecretName, "", v.Secret.Optional)
			}
			for _, it := range v.Secret.Items {
				secretKey(kind+" volume "+v.Name, ns, v.Secret.SecretName, it.Key, v.Secret.Optional)
			}
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					secretKey(kind+" "+c.Name+" "+e.Name, ns, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key, e.ValueFrom.SecretKeyRef.Optional)
				}
			}
			for _, ef := range c.EnvFrom {
				if ef.SecretRef != nil {
					secretKey(kind+" "+c.Name+" envFrom", ns, ef.SecretRef.Name, "", nil)
				}
				if ef.ConfigMapRef != nil && configMaps[ns+"/"+ef.ConfigMapRef.Name] == nil {
					bad("%s %s uses ConfigMap %q, which the kustomization does not make", kind, c.Name, ef.ConfigMapRef.Name)
				}
			}
		}
	}
	checkSecrets("Deployment", d.Namespace, pod)
	checkSecrets("DaemonSet", daemons[0].Namespace, daemons[0].Spec.Template.Spec)

	// Every pod is one its namespace's Pod Security admission lets in, and
	// registryd's namespace enforces "restricted".
	if ns := namespaces[d.Namespace]; ns == nil || ns.Labels[psa.EnforceLevelLabel] != string(psa.LevelRestricted) {
		bad("registryd's namespace %q does not enforce the restricted Pod Security Standard", d.Namespace)
	}
	podSecurity("Deployment", namespaces[d.Namespace], &d.Spec.Template.ObjectMeta, &pod, bad)
	podSecurity("DaemonSet", namespaces[daemons[0].Namespace], &daemons[0].Spec.Template.ObjectMeta, &daemons[0].Spec.Template.Spec, bad)

	// Every variable set is one the command reads.
	envOf := func(c corev1.Container) map[string]string {
		env := map[string]string{}
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil && configMaps[d.Namespace+"/"+ef.ConfigMapRef.Name] != nil {
				for k, v := range configMaps[d.Namespace+"/"+ef.ConfigMapRef.Name].Data {
					env[k] = v
				}
			}
			if ef.SecretRef != nil && secrets[d.Namespace+"/"+ef.SecretRef.Name] != nil {
				for k := range secrets[d.Namespace+"/"+ef.SecretRef.Name].Data {
					env[k] = "(secret)"
				}
			}
		}
		for _, e := range c.Env {
			env[e.Name] = e.Value
			if e.ValueFrom != nil {
				env[e.Name] = "(from " + e.Name + ")"
			}
		}
		return env
	}
	checkNames := func(where string, env map[string]string, reads []string, others ...string) {
		for name := range env {
			if !slices.Contains(reads, name) && !slices.Contains(others, name) {
				bad("%s sets %s, which it does not read", where, name)
			}
		}
	}

	// The Deployment.
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		bad("Deployment replicas %v: want at least 2", d.Spec.Replicas)
	}
	if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		bad("Deployment strategy %+v: want a rolling update with maxUnavailable 0", d.Spec.Strategy)
	}
	podLabels := d.Spec.Template.Labels
	if !matches(d.Spec.Selector.MatchLabels, podLabels) {
		bad("Deployment selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, podLabels)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("Deployment pod securityContext %+v: want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		bad("Deployment mounts a service account token registryd has no use for")
	}
	spread := false
	for _, t := range pod.TopologySpreadConstraints {
		if t.TopologyKey == "kubernetes.io/hostname" && t.WhenUnsatisfiable == corev1.DoNotSchedule && t.LabelSelector != nil && matches(t.LabelSelector.MatchLabels, podLabels) {
			spread = true
		}
	}
	if a := pod.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if t.TopologyKey == "kubernetes.io/hostname" && t.LabelSelector != nil && matches(t.LabelSelector.MatchLabels, podLabels) {
				spread = true
			}
		}
	}
	if !spread {
		bad("Deployment replicas are not kept on different nodes (topology spread or anti-affinity on kubernetes.io/hostname)")
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		sc := c.SecurityContext
		nonRoot := (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot) && (sc == nil || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot)
		if sc == nil || !nonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
			!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
			(sc.Privileged != nil && *sc.Privileged) || (sc.RunAsUser != nil && *sc.RunAsUser == 0) {
			bad("container %s securityContext %+v: want non-root, a read-only root, no privilege escalation, every capability dropped", c.Name, sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			bad("container %s resources %+v: want CPU and memory requests and a memory limit", c.Name, c.Resources)
		}
		checkNames("Deployment container "+c.Name, envOf(c), server, runtimeEnv...)
	}
	if len(pod.InitContainers) != 1 || !slices.Equal(pod.InitContainers[0].Args, []string{"migrate", "up"}) {
		bad("Deployment init containers %v: want one that runs `migrate up`", pod.InitContainers)
	} else if envOf(pod.InitContainers[0])["REGISTRY_DATABASE_URL"] == "" {
		bad("the migrate init container has no REGISTRY_DATABASE_URL")
	}
	if len(pod.Containers) != 1 {
		bad("Deployment containers: %d, want 1", len(pod.Containers))
		return problems
	}
	c := pod.Containers[0]
	env := envOf(c)
	if !slices.Equal(c.Args, []string{"serve"}) {
		bad("container args %v: want serve", c.Args)
	}
	if v := env["REGISTRY_MIGRATE"]; v != "" && v != "false" {
		bad("REGISTRY_MIGRATE=%s: migrations are the init container's, not every replica's", v)
	}
	if env["REGISTRY_DATABASE_URL"] != "(from REGISTRY_DATABASE_URL)" {
		bad("REGISTRY_DATABASE_URL must come from a Secret")
	}
	for _, name := range []string{"REGISTRY_JWT_SECRET", "REGISTRY_SCP_ACCESS_KEY", "REGISTRY_SCP_SECRET_KEY", "REGISTRY_E2E_API_KEY", "REGISTRY_E2E_TOKEN"} {
		if v, ok := env[name]; ok && v != "(secret)" && !strings.HasPrefix(v, "(from ") {
			bad("%s has its value in the manifest; it belongs in a Secret", name)
		}
	}
	if f := env["REGISTRY_JWT_SECRET_FILE"]; f == "" {
		bad("no REGISTRY_JWT_SECRET_FILE: every replica needs the token key")
	} else if v, ok := mountedVolume(pod, c, f); !ok || v.Secret == nil || !slices.ContainsFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return path.Join(mountOf(c, v.Name), it.Path) == f }) {
		bad("REGISTRY_JWT_SECRET_FILE %s is not a key of a mounted Secret", f)
	}
	_, listenPort, _ := strings.Cut(env["REGISTRY_LISTEN"], ":")
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return fmt.Sprint(p.ContainerPort) == listenPort }) {
		bad("REGISTRY_LISTEN %q is on no container port %v", env["REGISTRY_LISTEN"], c.Ports)
	}
	servesTLS := env["REGISTRY_TLS_CERT_FILE"] != ""
	probe := func(name string, p *corev1.Probe, want string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			bad("no %s probe with httpGet", name)
		case p.HTTPGet.Path != want:
			bad("%s probe asks %s, want %s", name, p.HTTPGet.Path, want)
		case fmt.Sprint(portNumber(c, p.HTTPGet.Port)) != listenPort:
			bad("%s probe port %s is not REGISTRY_LISTEN's %s", name, p.HTTPGet.Port.String(), listenPort)
		case (p.HTTPGet.Scheme == corev1.URISchemeHTTPS) != servesTLS:
			bad("%s probe asks over %s, but serve speaks %s", name, cmp.Or(string(p.HTTPGet.Scheme), "HTTP"), map[bool]string{true: "HTTPS (REGISTRY_TLS_CERT_FILE)", false: "plain HTTP"}[servesTLS])
		case p.TimeoutSeconds < 1:
			bad("%s probe has no timeout", name)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	if c.StartupProbe != nil {
		probe("startup", c.StartupProbe, "/healthz")
	}

	// The Service and the budget select the pods.
	svc := services[0]
	if !matches(svc.Spec.Selector, podLabels) || len(svc.Spec.Selector) == 0 {
		bad("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	for _, p := range svc.Spec.Ports {
		if fmt.Sprint(portNumber(c, p.TargetPort)) != listenPort {
			bad("Service port %d targets %s, not registryd's %s", p.Port, p.TargetPort.String(), listenPort)
		}
	}
	pdb := pdbs[0]
	if pdb.Spec.Selector == nil || !matches(pdb.Spec.Selector.MatchLabels, podLabels) {
		bad("PodDisruptionBudget does not select the pods")
	}
	replicas := 0
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	switch {
	case pdb.Spec.MaxUnavailable != nil && pdb.Spec.MaxUnavailable.Type == intstr.Int && (pdb.Spec.MaxUnavailable.IntValue() < 1 || pdb.Spec.MaxUnavailable.IntValue() >= replicas):
		bad("PodDisruptionBudget maxUnavailable %s with %d replicas", pdb.Spec.MaxUnavailable.String(), replicas)
	case pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.Type == intstr.Int && (pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= replicas):
		bad("PodDisruptionBudget minAvailable %s with %d replicas", pdb.Spec.MinAvailable.String(), replicas)
	case pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil:
		bad("PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}

	checkIngress(ingresses, svc, c, agentServer(daemons[0]), bad)

	// The agent DaemonSet.
	problems = append(problems, checkAgent(daemons[0], secrets, agent)...)
	return problems
}

// unpinnedImages are the containers of a Deployment's or DaemonSet's pods
// whose image names no tag, or the tag latest: each must name a release's
// tag or a digest, so every replica, and every restart, runs the same
// build, and a rollout is a change to the manifests.
func unpinnedImages(obj runtime.Object) []error {
	var spec corev1.PodSpec
	switch o := obj.(type) {
	case *appsv1.Deployment:
		spec = o.Spec.Template.Spec
	case *appsv1.DaemonSet:
		spec = o.Spec.Template.Spec
	default:
		return nil
	}
	var errs []error
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		ref, err := name.ParseReference(c.Image, name.StrictValidation)
		if t, ok := ref.(name.Tag); err == nil && ok && t.TagStr() == "latest" {
			err = errors.New("the tag latest")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%T %s: container %s's image %q is not pinned (%v): want a release's tag or a digest", obj, obj.(metav1.Object).GetName(), c.Name, c.Image, err))
		}
	}
	return errs
}

// checkAgent is the agent DaemonSet's review: `registryd agent` on GPU
// nodes' own network, its token a Secret mounted as a whole volume (so a
// rotation reaches the file), its state on the host, hardened, and every
// REGISTRY_ variable one the agent reads.
func checkAgent(ds *appsv1.DaemonSet, secrets map[string]*corev1.Secret, agent []string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork || pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" || pod.NodeSelector["nvidia.com/gpu.present"] != "true" ||
		!slices.ContainsFunc(pod.Tolerations, func(t corev1.Toleration) bool { return t.Key == "nvidia.com/gpu" }) {
		bad("DaemonSet pod: want host network, the nvidia runtime class, GPU nodes and their taint tolerated")
	}
	if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("DaemonSet pod: want seccomp RuntimeDefault")
	}
	if len(pod.Containers) != 1 {
		bad("DaemonSet containers: %d, want 1", len(pod.Containers))
		return problems
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args, []string{"agent"}) {
		bad("DaemonSet args %v: want agent", c.Args)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 || (sc.Privileged != nil && *sc.Privileged) {
		bad("DaemonSet securityContext %+v: want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if strings.HasPrefix(e.Name, "REGISTRY_") && !slices.Contains(agent, e.Name) {
			bad("the DaemonSet sets %s, which the agent does not read", e.Name)
		}
	}
	if env["REGISTRY_SERVER"] == "" || env["NVIDIA_VISIBLE_DEVICES"] != "all" || !strings.Contains(env["NVIDIA_DRIVER_CAPABILITIES"], "utility") {
		bad("DaemonSet env %v: want REGISTRY_SERVER and NVIDIA's utility capability on all devices", env)
	}
	if env["REGISTRY_TOKEN"] != "" {
		bad("the agent's token is in the manifest; it belongs in a Secret")
	}
	tv, ok := mountedVolume(pod, c, env["REGISTRY_TOKEN_FILE"])
	switch {
	case !ok:
		bad("REGISTRY_TOKEN_FILE %q is not in a mounted volume", env["REGISTRY_TOKEN_FILE"])
	case tv.Secret == nil:
		bad("the token's volume %q is not a Secret", tv.Name)
	case secrets[ds.Namespace+"/"+tv.Secret.SecretName] == nil || secrets[ds.Namespace+"/"+tv.Secret.SecretName].Data[path.Base(env["REGISTRY_TOKEN_FILE"])] == nil:
		bad("the token file %s is not a key of a Secret the kustomization makes", env["REGISTRY_TOKEN_FILE"])
	}
	for _, m := range c.VolumeMounts {
		if m.Name == tv.Name && m.SubPath != "" {
			bad("the token is mounted with subPath, which a rotation never updates")
		}
	}
	if sv, ok := mountedVolume(pod, c, env["REGISTRY_AGENT_STATE"]); !ok || sv.HostPath == nil {
		bad("REGISTRY_AGENT_STATE %q is not in a host folder", env["REGISTRY_AGENT_STATE"])
	}
	return problems
}

// agentServer is the REGISTRY_SERVER the agent DaemonSet sets; "" when
// it sets none.
func agentServer(ds *appsv1.DaemonSet) string {
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "REGISTRY_SERVER" {
				return e.Value
			}
		}
	}
	return ""
}

// checkIngress wants one Ingress, in the Service's namespace, that sends
// every path of its rules to a port the registryd Service has (and so to
// registryd's container port, checked with the Service), serves TLS for
// the host of the agents' REGISTRY_SERVER (an https URL) from a Secret
// that cert-manager fills (an issuer annotation), and has a rule for that
// host.
func checkIngress(ingresses []*networkingv1.Ingress, svc *corev1.Service, c corev1.Container, server string, bad func(string, ...any)) {
	if len(ingresses) != 1 {
		bad("want one Ingress; have %d", len(ingresses))
		return
	}
	ing := ingresses[0]
	if ing.Namespace != svc.Namespace {
		bad("Ingress %s is in namespace %s, not the Service's %s", ing.Name, ing.Namespace, svc.Namespace)
	}
	backend := func(where string, b *networkingv1.IngressBackend) {
		if b.Service == nil {
			bad("Ingress %s: %s has no Service backend", ing.Name, where)
			return
		}
		if b.Service.Name != svc.Name {
			bad("Ingress %s: %s sends to Service %q, not %q", ing.Name, where, b.Service.Name, svc.Name)
			return
		}
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
			return b.Service.Port.Name != "" && p.Name == b.Service.Port.Name || b.Service.Port.Name == "" && p.Port == b.Service.Port.Number
		}) {
			bad("Ingress %s: %s sends to port %s of Service %s, which has no such port", ing.Name, where, cmp.Or(b.Service.Port.Name, fmt.Sprint(b.Service.Port.Number)), svc.Name)
		}
	}
	if ing.Spec.DefaultBackend != nil {
		backend("the default backend", ing.Spec.DefaultBackend)
	}
	var hosts []string
	for _, r := range ing.Spec.Rules {
		hosts = append(hosts, r.Host)
		if r.HTTP == nil || len(r.HTTP.Paths) == 0 {
			bad("Ingress %s: the rule for %q has no paths", ing.Name, r.Host)
			continue
		}
		for _, p := range r.HTTP.Paths {
			backend(fmt.Sprintf("path %s of %s", p.Path, r.Host), &p.Backend)
		}
	}
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" {
		bad("the agent's REGISTRY_SERVER %q is not an https URL", server)
		return
	}
	host := u.Hostname()
	if !slices.Contains(hosts, host) {
		bad("Ingress %s has no rule for the agents' host %s (rules for %v)", ing.Name, host, hosts)
	}
	var tlsHosts []string
	for _, t := range ing.Spec.TLS {
		tlsHosts = append(tlsHosts, t.Hosts...)
		if slices.Contains(t.Hosts, host) && t.SecretName == "" {
			bad("Ingress %s: the TLS entry of %s names no Secret", ing.Name, host)
		}
	}
	if !slices.Contains(tlsHosts, host) {
		bad("Ingress %s serves TLS for %v, not for the agents' host %s", ing.Name, tlsHosts, host)
	}
	if ing.Annotations["cert-manager.io/cluster-issuer"] == "" && ing.Annotations["cert-manager.io/issuer"] == "" {
		bad("Ingress %s has no cert-manager.io/cluster-issuer (or issuer) annotation: nothing obtains or renews its certificate", ing.Name)
	}
}

// evaluator holds Kubernetes' own Pod Security Standards checks, as the
// PodSecurity admission plugin runs them.
var evaluator = func() policy.Evaluator {
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		panic(err)
	}
	return e
}()

// podSecurity reports whether ns's Pod Security admission would refuse a
// pod of this template (its enforce level, at the latest version).
func podSecurity(kind string, ns *corev1.Namespace, meta *metav1.ObjectMeta, spec *corev1.PodSpec, bad func(string, ...any)) {
	if ns == nil {
		return // reported above
	}
	p, errs := psa.PolicyToEvaluate(ns.Labels, psa.Policy{
		Enforce: psa.LevelVersion{Level: psa.LevelPrivileged, Version: psa.LatestVersion()},
		Warn:    psa.LevelVersion{Level: psa.LevelPrivileged, Version: psa.LatestVersion()},
		Audit:   psa.LevelVersion{Level: psa.LevelPrivileged, Version: psa.LatestVersion()},
	})
	if len(errs) > 0 {
		bad("namespace %s: Pod Security labels: %v", ns.Name, errs.ToAggregate())
		return
	}
	for _, r := range evaluator.EvaluatePod(p.Enforce, meta, spec) {
		if !r.Allowed {
			bad("%s: namespace %s enforces Pod Security %q, which refuses %s (%s)", kind, ns.Name, p.Enforce.Level, r.ForbiddenReason, r.ForbiddenDetail)
		}
	}
}

// mountedVolume is the volume of c whose mount holds file directly.
func mountedVolume(pod corev1.PodSpec, c corev1.Container, file string) (corev1.Volume, bool) {
	for _, m := range c.VolumeMounts {
		if file != "" && path.Dir(file) == path.Clean(m.MountPath) {
			for _, v := range pod.Volumes {
				if v.Name == m.Name {
					return v, true
				}
			}
		}
	}
	return corev1.Volume{}, false
}

func mountOf(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

// portNumber resolves a probe's or Service's port (a number or a
// container port's name) against c's ports; 0 when it names none.
func portNumber(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// checkNetworkPolicy wants one NetworkPolicy of d's namespace selecting
// its pods for both directions: in, the http port only; out, DNS,
// PostgreSQL (5432) and HTTPS (443), and no rule open to every port.
func checkNetworkPolicy(d *appsv1.Deployment, netpols []*networkingv1.NetworkPolicy, bad func(string, ...any)) {
	var np *networkingv1.NetworkPolicy
	for _, p := range netpols {
		if p.Namespace == d.Namespace && matches(p.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
			np = p
		}
	}
	if np == nil {
		bad("no NetworkPolicy selects the Deployment's pods in namespace %s", d.Namespace)
		return
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		bad("NetworkPolicy %s has policyTypes %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
	}
	port := func(p networkingv1.NetworkPolicyPort) string {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if p.Port == nil {
			return "every " + string(proto) + " port"
		}
		return p.Port.String() + "/" + string(proto)
	}
	var in, out []string
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			in = append(in, "every port")
		}
		for _, p := range r.Ports {
			in = append(in, port(p))
		}
	}
	for _, r := range np.Spec.Egress {
		if len(r.Ports) == 0 {
			out = append(out, "every port")
		}
		for _, p := range r.Ports {
			out = append(out, port(p))
		}
	}
	if !slices.Equal(in, []string{"http/TCP"}) {
		bad("NetworkPolicy %s lets in %v, want the http port (http/TCP) only", np.Name, in)
	}
	for _, want := range []string{"53/UDP", "53/TCP", "5432/TCP", "443/TCP"} {
		if !slices.Contains(out, want) {
			bad("NetworkPolicy %s lets out %v, which lacks %s", np.Name, out, want)
		}
	}
	for _, o := range out {
		if strings.HasPrefix(o, "every") {
			bad("NetworkPolicy %s lets out %s", np.Name, o)
		}
	}
}

// matches reports whether the selector selects labels.
func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
