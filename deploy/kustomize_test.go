package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/upstream"
)

// The kustomizations to render: the base and every overlay.
var kustomizations = []string{"k8s/base", "k8s/overlays/production"}

// rendered is a kustomization's output, each object decoded into its
// Kubernetes type.
type rendered struct {
	deployments []*appsv1.Deployment
	jobs        []*batchv1.Job
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
	namespaces  []*corev1.Namespace
	// inNamespaces are the namespaces the objects name.
	inNamespaces map[string]bool
}

// render builds the kustomization at dir of fsys, as `kustomize build`
// would.
func render(fsys filesys.FileSystem, dir string) (resmap.ResMap, error) {
	return krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
}

// decode decodes every object into its k8s.io/api type, strictly: a field
// the type does not have (a typo, a field of another API version, a
// misplaced key) is an error, as the API server's strict field validation
// would make it. A kind not listed here is an error too.
func decode(m resmap.ResMap) (*rendered, error) {
	out := &rendered{inNamespaces: map[string]bool{}}
	for _, r := range m.Resources() {
		if ns := r.GetNamespace(); ns != "" && r.GetKind() != "Namespace" {
			out.inNamespaces[ns] = true
		}
		raw, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		var obj any
		switch r.GetKind() {
		case "Deployment":
			d := &appsv1.Deployment{}
			out.deployments, obj = append(out.deployments, d), d
		case "Job":
			j := &batchv1.Job{}
			out.jobs, obj = append(out.jobs, j), j
		case "Service":
			s := &corev1.Service{}
			out.services, obj = append(out.services, s), s
		case "ConfigMap":
			c := &corev1.ConfigMap{}
			out.configMaps, obj = append(out.configMaps, c), c
		case "PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			out.pdbs, obj = append(out.pdbs, p), p
		case "Namespace":
			n := &corev1.Namespace{}
			out.namespaces, obj = append(out.namespaces, n), n
		default:
			// A Secret in particular: keys are never written in manifests.
			return nil, fmt.Errorf("%s %s: kind not expected in arap's manifests", r.GetKind(), r.GetName())
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, fmt.Errorf("%s %s: %w", r.GetKind(), r.GetName(), err)
		}
	}
	return out, nil
}

// secretEnv names the settings that are secrets: they may only come from a
// Secret, never as a literal value in a manifest.
var secretEnv = regexp.MustCompile(`^(DATABASE_URL|ARAP_(PEP_)?MASTER_KEY|ARAP_BACKEND_TOKEN|ARAP_WEBHOOK_SECRETS|ARAP_.*(SECRET|PASSWORD|TOKEN).*)$`)

// keyFileEnv names the settings that point at a master key file, which
// must lie in a mounted Secret.
var keyFileEnv = map[string]string{"serve": "ARAP_MASTER_KEY_FILE", "mcp": "ARAP_PEP_MASTER_KEY_FILE"}

// listenEnv names the listen address setting of each process.
var listenEnv = map[string]string{"serve": "ARAP_ADDR", "mcp": "ARAP_MCP_ADDR"}

// validate checks what the manifests promise (docs/operations.md).
func validate(r *rendered) error {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	processes := map[string]bool{}
	keySecrets := map[string]string{}
	var images []string
	for _, d := range r.deployments {
		spec := d.Spec.Template.Spec
		name := d.Name
		if len(spec.Containers) != 1 {
			fail("%s: want one container, got %d", name, len(spec.Containers))
			continue
		}
		c := spec.Containers[0]
		images = append(images, c.Image)
		if len(c.Args) != 1 || (c.Args[0] != "serve" && c.Args[0] != "mcp") {
			fail("%s: args %q, want serve or mcp", name, c.Args)
			continue
		}
		proc := c.Args[0]
		processes[proc] = true
		checkPod(fail, name, spec, c)
		// Probes on the port the process listens on.
		listen := envValue(c, listenEnv[proc])
		_, port, _ := strings.Cut(listen, ":")
		if !strings.HasPrefix(listen, "0.0.0.0:") {
			fail("%s: %s=%q: a pod must listen on all interfaces (0.0.0.0:PORT)", name, listenEnv[proc], listen)
		}
		for what, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			want := map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"}[what]
			if p == nil || p.HTTPGet == nil {
				fail("%s: no %s (HTTP GET %s)", name, what, want)
				continue
			}
			if p.HTTPGet.Path != want {
				fail("%s: %s path %q, want %q", name, what, p.HTTPGet.Path, want)
			}
			if got := containerPort(c, p.HTTPGet.Port.String()); fmt.Sprint(got) != port {
				fail("%s: %s port %s is container port %d, but the process listens on %q", name, what, p.HTTPGet.Port.String(), got, listen)
			}
		}
		// preStop: the kubelet's sleep, shorter than the grace period.
		grace := int64(30)
		if spec.TerminationGracePeriodSeconds != nil {
			grace = *spec.TerminationGracePeriodSeconds
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
			fail("%s: no preStop sleep", name)
		} else if s := c.Lifecycle.PreStop.Sleep.Seconds; s+20 > grace {
			fail("%s: preStop sleeps %d s of a %d s grace period: too little left to drain", name, s, grace)
		}
		// The master key: a file in a mounted Secret of this process alone.
		file := envValue(c, keyFileEnv[proc])
		secret := secretMountedAt(spec, c, file)
		if secret == "" {
			fail("%s: %s=%q is not in a mounted Secret", name, keyFileEnv[proc], file)
		}
		keySecrets[proc] = secret
		if secret != "" && !keyReadableByPodOnly(spec, volumeAt(spec, c, file).Secret) {
			fail("%s: the master key must be readable by the pod's group only (defaultMode 0440 and fsGroup), not by others, and not root's alone", name)
		}
		// arapd serve: the policy from the ConfigMap, and it must load.
		if proc == "serve" {
			checkPolicy(fail, r, spec, c)
		}
		// arapd mcp: the upstreams from the ConfigMap, and never the demo
		// tools.
		if proc == "mcp" {
			checkUpstreams(fail, r, spec, c)
		}
		// The Service in front, on the same named port.
		if !slices.ContainsFunc(r.services, func(s *corev1.Service) bool {
			return s.Spec.Selector["app.kubernetes.io/name"] == d.Spec.Template.Labels["app.kubernetes.io/name"] &&
				len(s.Spec.Ports) == 1 && s.Spec.Ports[0].TargetPort.String() == "http" && containerPort(c, "http") > 0
		}) {
			fail("%s: no Service targeting its http port", name)
		}
	}
	for _, p := range []string{"serve", "mcp"} {
		if !processes[p] {
			fail("no Deployment runs arapd %s", p)
		}
	}
	if keySecrets["serve"] != "" && keySecrets["serve"] == keySecrets["mcp"] {
		fail("arapd serve and arapd mcp mount their master keys from one Secret %q: each must see only its own", keySecrets["serve"])
	}
	migrates := 0
	for _, j := range r.jobs {
		spec := j.Spec.Template.Spec
		if len(spec.Containers) != 1 {
			fail("job %s: want one container", j.Name)
			continue
		}
		c := spec.Containers[0]
		images = append(images, c.Image)
		if slices.Equal(c.Args, []string{"migrate"}) {
			migrates++
		}
		checkPod(fail, "job "+j.Name, spec, c)
	}
	// A namespace the objects are in is created with them.
	for ns := range r.inNamespaces {
		if !slices.ContainsFunc(r.namespaces, func(n *corev1.Namespace) bool { return n.Name == ns }) {
			fail("the objects are in namespace %q, which the manifests do not create", ns)
		}
	}
	if migrates != 1 {
		fail("want one Job running `arapd migrate`, got %d", migrates)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(images)))) != 1 {
		fail("the Deployments and the Job run different images %q: the migration must be the version that runs", images)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d problems:\n  %s", len(errs), strings.Join(errs, "\n  "))
	}
	return nil
}

// checkPod checks what every arap pod needs: non-root, read-only root,
// no privilege escalation, no capabilities, resources, and secrets only
// from Secrets.
func checkPod(fail func(string, ...any), name string, spec corev1.PodSpec, c corev1.Container) {
	nonRoot := spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot
	if c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil {
		nonRoot = *c.SecurityContext.RunAsNonRoot
	}
	if !nonRoot {
		fail("%s: runAsNonRoot is not set", name)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		fail("%s: readOnlyRootFilesystem is not set", name)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		fail("%s: allowPrivilegeEscalation is not false", name)
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		fail("%s: capabilities are not dropped", name)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		fail("%s: resources need cpu and memory requests and a memory limit", name)
	}
	for _, e := range c.Env {
		if secretEnv.MatchString(e.Name) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			fail("%s: %s must come from a Secret (secretKeyRef), never a literal value", name, e.Name)
		}
	}
	if len(c.EnvFrom) > 0 {
		fail("%s: envFrom hides which settings come from where; name each", name)
	}
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func containerPort(c corev1.Container, port string) int32 {
	for _, p := range c.Ports {
		if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
			return p.ContainerPort
		}
	}
	return 0
}

// volumeAt returns the volume mounted where file lies, or nil.
func volumeAt(spec corev1.PodSpec, c corev1.Container, file string) *corev1.Volume {
	for _, m := range c.VolumeMounts {
		if file == "" || !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == m.Name {
				return &spec.Volumes[i]
			}
		}
	}
	return nil
}

// keyReadableByPodOnly: Secret volume files belong to root, and to the
// pod's fsGroup when it has one. The process (uid 65532) reads the key
// through the group; others must not read it at all.
func keyReadableByPodOnly(spec corev1.PodSpec, v *corev1.SecretVolumeSource) bool {
	mode := int32(0o644) // Kubernetes' default
	if v.DefaultMode != nil {
		mode = *v.DefaultMode
	}
	for _, it := range v.Items {
		if it.Mode != nil {
			mode = *it.Mode
		}
	}
	sc := spec.SecurityContext
	return mode&0o007 == 0 && mode&0o040 != 0 && sc != nil && sc.FSGroup != nil && sc.RunAsGroup != nil && *sc.FSGroup == *sc.RunAsGroup
}

func secretMountedAt(spec corev1.PodSpec, c corev1.Container, file string) string {
	v := volumeAt(spec, c, file)
	if v == nil || v.Secret == nil {
		return ""
	}
	return v.Secret.SecretName
}

// checkPolicy: ARAP_POLICY lies in a mounted ConfigMap of the output, and
// the policy in it loads.
func checkPolicy(fail func(string, ...any), r *rendered, spec corev1.PodSpec, c corev1.Container) {
	file := envValue(c, "ARAP_POLICY")
	v := volumeAt(spec, c, file)
	if v == nil || v.ConfigMap == nil {
		fail("serve: ARAP_POLICY=%q is not in a mounted ConfigMap", file)
		return
	}
	for _, cm := range r.configMaps {
		if cm.Name == v.ConfigMap.Name {
			doc, ok := cm.Data[path.Base(file)]
			if !ok {
				fail("serve: ConfigMap %s has no %s", cm.Name, path.Base(file))
				return
			}
			if _, err := evaluation.Parse(file, []byte(doc)); err != nil {
				fail("serve: the policy does not load: %v", err)
			}
			return
		}
	}
	fail("serve: ConfigMap %s is not in the output", v.ConfigMap.Name)
}

// checkUpstreams: arapd mcp reads its upstreams from a mounted ConfigMap
// whose file loads, and is never told to offer the demo tools.
func checkUpstreams(fail func(string, ...any), r *rendered, spec corev1.PodSpec, c corev1.Container) {
	if v := envValue(c, "ARAP_DEMO_TOOLS"); v != "" && v != "false" {
		fail("mcp: ARAP_DEMO_TOOLS=%q: the demo tools are never offered in production", v)
	}
	if slices.Contains(c.Args, "--demo-tools") {
		fail("mcp: --demo-tools: the demo tools are never offered in production")
	}
	file := envValue(c, "ARAP_UPSTREAMS")
	v := volumeAt(spec, c, file)
	if file == "" || v == nil || v.ConfigMap == nil {
		fail("mcp: ARAP_UPSTREAMS=%q is not in a mounted ConfigMap (without upstreams arapd mcp does not start)", file)
		return
	}
	for _, cm := range r.configMaps {
		if cm.Name == v.ConfigMap.Name {
			doc, ok := cm.Data[path.Base(file)]
			if !ok {
				fail("mcp: ConfigMap %s has no %s", cm.Name, path.Base(file))
				return
			}
			if _, err := upstream.Parse(file, []byte(doc)); err != nil {
				fail("mcp: the upstreams file does not load: %v", err)
			}
			return
		}
	}
	fail("mcp: ConfigMap %s is not in the output", v.ConfigMap.Name)
}

func TestManifests(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			m, err := render(filesys.MakeFsOnDisk(), dir)
			require.NoError(t, err)
			r, err := decode(m)
			require.NoError(t, err)
			require.NoError(t, validate(r))
		})
	}
}

// TestOverlay: the production overlay pins the image, has its own
// namespace, keeps the Services' names the Deployments use, and gives
// arapd serve an https public URL.
func TestOverlay(t *testing.T) {
	m, err := render(filesys.MakeFsOnDisk(), "k8s/overlays/production")
	require.NoError(t, err)
	r, err := decode(m)
	require.NoError(t, err)
	require.Len(t, r.pdbs, 2)
	for _, d := range r.deployments {
		require.Equal(t, "arap", d.Namespace, d.Name)
		require.Equal(t, int32(3), *d.Spec.Replicas, d.Name)
		c := d.Spec.Template.Spec.Containers[0]
		require.Regexp(t, `^registry\.example\.com/arap:v\d+\.\d+\.\d+$`, c.Image, "a pinned image")
		switch c.Args[0] {
		case "serve":
			require.Equal(t, "https://arap.example.com", envValue(c, "ARAP_PUBLIC_URL"), "the overlay's public URL replaces the base's placeholder")
		case "mcp":
			require.Equal(t, "http://arap-serve:8480", envValue(c, "ARAP_BACKEND_URL"))
			require.Equal(t, "http://arap-mcp.arap.svc:8481", envValue(c, "ARAP_MCP_PUBLIC_URL"))
		}
	}
}

// TestValidatorCatchesMutations: each mutation of the base, rendered from
// an in-memory copy, is refused by validate (or by the strict decoding),
// naming what is wrong: the checks above are not vacuous.
func TestValidatorCatchesMutations(t *testing.T) {
	mutations := []struct {
		name, file, from, to, want string
	}{
		{"readiness probe removed", "serve.yaml", "          readinessProbe:\n            httpGet:\n              path: /readyz\n              port: http\n            periodSeconds: 5\n            failureThreshold: 2\n", "", "arap-serve: no readinessProbe"},
		{"liveness probe on the wrong port", "mcp.yaml", "path: /healthz\n              port: http", "path: /healthz\n              port: 8480", "arap-mcp: livenessProbe port 8480"},
		{"preStop removed", "mcp.yaml", "preStop:\n              sleep:\n                seconds: 5", "postStart:\n              sleep:\n                seconds: 5", "arap-mcp: no preStop sleep"},
		{"runs as root", "serve.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "arap-serve: runAsNonRoot"},
		{"writable root", "migrate-job.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "job arap-migrate: readOnlyRootFilesystem"},
		{"no resources", "mcp.yaml", "requests:\n              cpu: 100m\n", "requests:\n", "arap-mcp: resources"},
		{"literal database URL", "migrate-job.yaml", "valueFrom:\n                secretKeyRef:\n                  name: arap-database\n                  key: url", "value: postgres://arap:hunter2@db/arap", "job arap-migrate: DATABASE_URL must come from a Secret"},
		{"master key in a ConfigMap", "serve.yaml", "secret:\n            secretName: arap-master-key\n            defaultMode: 0440", "configMap:\n            name: arap-policy", "ARAP_MASTER_KEY_FILE=\"/run/secrets/arap/master-key\" is not in a mounted Secret"},
		{"key readable by root only", "serve.yaml", "defaultMode: 0440", "defaultMode: 0400", "arap-serve: the master key must be readable by the pod's group only"},
		{"key readable by all", "mcp.yaml", "defaultMode: 0440", "defaultMode: 0444", "arap-mcp: the master key must be readable by the pod's group only"},
		{"no fsGroup", "serve.yaml", "fsGroup: 65532", "supplementalGroups: [65532]", "arap-serve: the master key must be readable by the pod's group only"},
		{"shared key Secret", "mcp.yaml", "secretName: arap-mcp", "secretName: arap-master-key", "one Secret \"arap-master-key\""},
		{"job does not migrate", "migrate-job.yaml", `args: ["migrate"]`, `args: ["serve"]`, "want one Job running `arapd migrate`"},
		{"unknown field", "serve.yaml", "terminationGracePeriodSeconds: 40", "terminationGracePeriodSecond: 40", `unknown field "terminationGracePeriodSecond"`},
		{"a Secret with the key", "kustomization.yaml", "configMapGenerator:", "secretGenerator:\n  - name: arap-master-key\n    literals: [master-key=AAAA]\nconfigMapGenerator:", "Secret arap-master-key"},
		{"loopback listener", "serve.yaml", `value: "0.0.0.0:8480"`, `value: "127.0.0.1:8480"`, "must listen on all interfaces"},
		{"broken policy", "policy.yaml", "effect: request", "effect: maybe", "the policy does not load"},
		{"demo tools", "mcp.yaml", "            - name: ARAP_UPSTREAMS\n", "            - name: ARAP_DEMO_TOOLS\n              value: \"true\"\n            - name: ARAP_UPSTREAMS\n", "the demo tools are never offered in production"},
		{"no upstreams", "mcp.yaml", "- name: ARAP_UPSTREAMS", "- name: ARAP_UPSTREAMS_OFF", "ARAP_UPSTREAMS=\"\" is not in a mounted ConfigMap"},
		{"broken upstreams", "upstreams.yaml", "upstreams: []", "upstreams: [{name: x}]", "the upstreams file does not load"},
	}
	for _, mu := range mutations {
		t.Run(mu.name, func(t *testing.T) {
			fsys := filesys.MakeFsInMemory()
			copied := false
			require.NoError(t, filepath.WalkDir("k8s/base", func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				if filepath.Base(p) == mu.file {
					require.Contains(t, string(b), mu.from, "the mutation no longer applies to %s", p)
					b = []byte(strings.Replace(string(b), mu.from, mu.to, 1))
					copied = true
				}
				return fsys.WriteFile("/"+filepath.ToSlash(p), b)
			}))
			require.True(t, copied, "no file %s", mu.file)
			m, err := render(fsys, "/k8s/base")
			if err == nil {
				var r *rendered
				if r, err = decode(m); err == nil {
					err = validate(r)
				}
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), mu.want)
		})
	}
}
