// Package charttest lints and renders the exa Helm chart (deploy/chart/exa)
// with Helm's own Go packages (the code of `helm lint` and `helm
// template`), and applies the rendered objects to a real kube-apiserver
// (envtest, binaries from e2e/k8s/install.sh) with GIE's InferencePool CRD.
// It is a module of its own so that Helm stays out of the library's go.mod.
//
//	cd deploy/chart/charttest && go test ./...
package charttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const chartDir = "../exa"

// values are the value sets the tests render: the picker for an
// InferencePool it creates, and the gateway following a Service.
var values = map[string]map[string]any{
	"picker": {"mode": "picker", "models": []any{"llama"},
		"pool":    map[string]any{"create": true, "selector": map[string]any{"app": "vllm"}, "targetPorts": []any{8000}},
		"routing": map[string]any{"version": 1, "models": map[string]any{"llama": map[string]any{"mode": "cache_aware"}}}},
	"gateway": {"mode": "gateway", "models": []any{"llama"}, "service": map[string]any{"name": "vllm", "port": "http"}},
	// Three gateways sharing their pending prefill through a headless
	// Service; "qwen" is in the routing configuration, with a peer of its
	// own, "llama" is not.
	"gateway-peers": {"mode": "gateway", "replicas": 3, "models": []any{"llama", "qwen"}, "service": map[string]any{"name": "vllm"},
		"gateway": map[string]any{"peers": true},
		"routing": map[string]any{"models": map[string]any{"qwen": map[string]any{"mode": "load_aware", "peers": []any{"http://other-gw:8080"}}}}},
	// Peers over HTTPS: the gateways serve gw-tls, scrape each other by
	// dns+https and trust its ca.crt (--peer-ca).
	"gateway-peers-tls": {"mode": "gateway", "replicas": 2, "models": []any{"llama"}, "service": map[string]any{"name": "vllm"},
		"gateway": map[string]any{"peers": true, "tlsSecret": "gw-tls"}},
	// The gateway over HTTPS, asking for API keys, a rate per key.
	"gateway-secure": {"mode": "gateway", "models": []any{"llama"}, "service": map[string]any{"name": "vllm"},
		"gateway": map[string]any{"tlsSecret": "gw-tls", "apiKeysSecret": "gw-keys",
			"rateLimit": map[string]any{"perSecond": 5, "burst": 20, "key": "header:Authorization"}}},
	// Three pickers electing a leader on the pool's Lease.
	"picker-ha": {"mode": "picker", "replicas": 3, "models": []any{"llama"}, "pool": map[string]any{"name": "llama"}},
	// The picker with mutual TLS: a client CA Secret and an allowed SAN.
	"picker-mtls": {"mode": "picker", "models": []any{"llama"}, "pool": map[string]any{"name": "llama"},
		"picker": map[string]any{"clientCASecret": "envoy-client-ca", "clientSANs": []any{"spiffe://cluster.local/ns/gw/sa/envoy"},
			"rateLimit": map[string]any{"perSecond": 2.5, "key": "header:x-gateway-inference-fairness-id"}}},
}

// render renders the chart as `helm template exa deploy/chart/exa
// --namespace llm` with vals, returning the manifests by file.
func render(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	return renderAs(t, vals, "exa", "llm")
}

// renderAs renders the chart as `helm template RELEASE deploy/chart/exa
// --namespace NS` with vals.
func renderAs(t *testing.T, vals map[string]any, release, ns string) map[string]string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: ns, IsInstall: true}, nil)
	require.NoError(t, err)
	out, err := engine.Render(ch, rv)
	require.NoError(t, err)
	return out
}

// appliedSets are the value sets TestChartApplies creates: the chart's
// defaults, the tests' own and every documented `helm install`.
func appliedSets(t *testing.T) []docSet {
	sets := []docSet{{where: "values.yaml defaults", release: "exa", values: map[string]any{}}}
	for _, name := range []string{"picker", "gateway", "picker-mtls", "picker-ha", "gateway-peers", "gateway-peers-tls", "gateway-secure"} {
		sets = append(sets, docSet{where: "chart_test.go " + name, release: "exa", values: values[name]})
	}
	return append(sets, docSets(t)...)
}

// objects decodes the rendered manifests into objects.
func objects(t *testing.T, files map[string]string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(text)), 4096)
		for {
			var m map[string]any
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "%s", name)
			if len(m) == 0 {
				continue
			}
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

func TestChartLints(t *testing.T) {
	for name, v := range values {
		lr := lint.AllWithKubeVersion(chartDir, v, "llm", nil)
		for _, m := range lr.Messages {
			require.Less(t, m.Severity, support.WarningSev, "%s: %s", name, m)
		}
	}
}

func TestChartRenders(t *testing.T) {
	kinds := func(vals map[string]any) map[string]*unstructured.Unstructured {
		got := map[string]*unstructured.Unstructured{}
		for _, o := range objects(t, render(t, vals)) {
			got[o.GetKind()] = o
		}
		return got
	}
	p := kinds(values["picker"])
	require.Contains(t, p, "InferencePool")
	require.Contains(t, p, "ConfigMap")
	c := p["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	require.Subset(t, c["args"], []any{"serve", "picker", "--pool-name=exa", "--pool-namespace=llm", "--pool-model=llama",
		"--config=/etc/exa/config/routing.json", "--grpc-health-port=9003", "--secure-serving=true"})
	require.Equal(t, "readiness", c["readinessProbe"].(map[string]any)["grpc"].(map[string]any)["service"])
	ref := p["InferencePool"].Object["spec"].(map[string]any)["endpointPickerRef"]
	require.Equal(t, map[string]any{"name": "exa-picker", "port": map[string]any{"number": float64(9002)}, "failureMode": "FailOpen"}, ref)
	// The gateway creating its pool names the picker a release named
	// after the pool would run (the CRD requires a picker).
	gp := kinds(map[string]any{"mode": "gateway", "pool": map[string]any{"name": "llama", "create": true, "selector": map[string]any{"app": "vllm"}}})
	ref = gp["InferencePool"].Object["spec"].(map[string]any)["endpointPickerRef"]
	require.Equal(t, map[string]any{"name": "llama-picker", "port": map[string]any{"number": float64(9002)}, "failureMode": "FailOpen"}, ref)
	g := kinds(values["gateway"])
	require.NotContains(t, g, "InferencePool")
	c = g["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	require.Subset(t, c["args"], []any{"serve", "gateway", "--service=vllm", "--service-port=http", "--listen=0.0.0.0:8080"})
	require.NotContains(t, c["args"], "--tls-client-ca=/etc/exa/client-ca/ca.crt")
	// Peers: a headless Service of the gateway pods, named in each model's
	// peer list.
	gw := kinds(values["gateway-peers"])
	var svc *unstructured.Unstructured
	for _, o := range objects(t, render(t, values["gateway-peers"])) {
		if o.GetKind() == "Service" && o.GetName() == "exa-gateway-peers" {
			svc = o
		}
	}
	require.NotNil(t, svc, "the peers Service")
	require.Equal(t, "None", svc.Object["spec"].(map[string]any)["clusterIP"])
	require.Equal(t, map[string]any{"app.kubernetes.io/name": "exa", "app.kubernetes.io/instance": "exa", "app.kubernetes.io/component": "gateway"},
		svc.Object["spec"].(map[string]any)["selector"])
	var routing map[string]any
	require.NoError(t, json.Unmarshal([]byte(gw["ConfigMap"].Object["data"].(map[string]any)["routing.json"].(string)), &routing))
	peer := []any{"dns+http://exa-gateway-peers.llm.svc:8080"}
	require.Equal(t, map[string]any{"version": float64(1), "models": map[string]any{
		"llama": map[string]any{"mode": "cache_aware", "peers": peer},
		"qwen":  map[string]any{"mode": "load_aware", "peers": []any{"http://other-gw:8080", peer[0]}},
	}}, routing)
	c = gw["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	require.Contains(t, c["args"], "--config=/etc/exa/config/routing.json")
	for _, a := range c["args"].([]any) {
		require.NotContains(t, a, "--peer-ca", "peers over plain HTTP trust no CA")
	}
	// Peers with the gateway over HTTPS: dns+https, and the Secret's CA
	// trusted for the scrapes.
	gt := kinds(values["gateway-peers-tls"])
	require.Contains(t, gt, "Service")
	routing = nil
	require.NoError(t, json.Unmarshal([]byte(gt["ConfigMap"].Object["data"].(map[string]any)["routing.json"].(string)), &routing))
	require.Equal(t, map[string]any{"version": float64(1), "models": map[string]any{
		"llama": map[string]any{"mode": "cache_aware", "peers": []any{"dns+https://exa-gateway-peers.llm.svc:8080"}},
	}}, routing)
	pt := gt["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c = pt["containers"].([]any)[0].(map[string]any)
	require.Subset(t, c["args"], []any{"--config=/etc/exa/config/routing.json", "--tls-cert=/etc/exa/tls/tls.crt",
		"--tls-key=/etc/exa/tls/tls.key", "--peer-ca=/etc/exa/tls/ca.crt"})
	require.Contains(t, c["volumeMounts"], map[string]any{"name": "tls", "mountPath": "/etc/exa/tls", "readOnly": true})
	require.Contains(t, pt["volumes"], map[string]any{"name": "tls", "secret": map[string]any{"secretName": "gw-tls"}})
	// In another namespace and release the name follows both.
	for _, o := range objects(t, renderAs(t, values["gateway-peers-tls"], "edge", "prod")) {
		if o.GetKind() == "ConfigMap" {
			require.Contains(t, o.Object["data"].(map[string]any)["routing.json"], `"peers":["dns+https://edge-gateway-peers.prod.svc:8080"]`)
		}
	}
	// Mutual TLS: the CA Secret mounted and named by --tls-client-ca.
	m := kinds(values["picker-mtls"])["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c = m["containers"].([]any)[0].(map[string]any)
	require.Subset(t, c["args"], []any{"--secure-serving=true", "--tls-client-ca=/etc/exa/client-ca/ca.crt",
		"--tls-client-san=spiffe://cluster.local/ns/gw/sa/envoy", "--rate-limit=2.5", "--rate-limit-burst=0", "--rate-limit-key=header:x-gateway-inference-fairness-id"})
	require.Contains(t, c["volumeMounts"], map[string]any{"name": "client-ca", "mountPath": "/etc/exa/client-ca", "readOnly": true})
	require.Contains(t, m["volumes"], map[string]any{"name": "client-ca", "secret": map[string]any{"secretName": "envoy-client-ca"}})
	// The gateway over HTTPS with API keys and a rate limit: the Secrets
	// mounted and named, the probes over HTTPS.
	sec := kinds(values["gateway-secure"])["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c = sec["containers"].([]any)[0].(map[string]any)
	require.Subset(t, c["args"], []any{"--tls-cert=/etc/exa/tls/tls.crt", "--tls-key=/etc/exa/tls/tls.key",
		"--api-keys-file=/etc/exa/api-keys/keys", "--rate-limit=5", "--rate-limit-burst=20", "--rate-limit-key=header:Authorization"})
	require.Subset(t, c["volumeMounts"], []any{map[string]any{"name": "tls", "mountPath": "/etc/exa/tls", "readOnly": true},
		map[string]any{"name": "api-keys", "mountPath": "/etc/exa/api-keys", "readOnly": true}})
	require.Subset(t, sec["volumes"], []any{map[string]any{"name": "tls", "secret": map[string]any{"secretName": "gw-tls"}},
		map[string]any{"name": "api-keys", "secret": map[string]any{"secretName": "gw-keys"}}})
	require.Equal(t, "HTTPS", c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any)["scheme"])
	require.Equal(t, "HTTPS", c["livenessProbe"].(map[string]any)["httpGet"].(map[string]any)["scheme"])
	c = kinds(values["gateway"])["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	require.NotContains(t, c["readinessProbe"].(map[string]any)["httpGet"], "scheme", "plain HTTP by default")
	for _, a := range c["args"].([]any) {
		require.NotContains(t, a, "--tls-", "no TLS by default")
		require.NotContains(t, a, "--rate-limit", "no rate limit by default")
		require.NotContains(t, a, "--api-keys-file", "no API keys by default")
		require.NotContains(t, a, "--peer-ca", "no peer CA by default")
	}
	for _, a := range kinds(values["picker"])["Deployment"].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["args"].([]any) {
		require.NotContains(t, a, "--rate-limit", "the picker: no rate limit by default")
	}
	// TLS without peers: no peer CA (there are no peer scrapes).
	c = sec["containers"].([]any)[0].(map[string]any)
	for _, a := range c["args"].([]any) {
		require.NotContains(t, a, "--peer-ca", "no peer CA without peers")
	}
	// Bad values fail the render with a message.
	for _, tt := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"mode": "proxy"}, `mode "proxy": want picker or gateway`},
		{map[string]any{"pool": map[string]any{"failureMode": "Open"}}, `pool.failureMode "Open": want FailOpen or FailClose`},
		{map[string]any{"picker": map[string]any{"secureServing": false, "clientCASecret": "ca"}}, "picker.clientCASecret (mutual TLS) needs picker.secureServing"},
		{map[string]any{"picker": map[string]any{"clientSANs": []any{"envoy"}}}, "picker.clientSANs needs picker.clientCASecret"},
		{map[string]any{"gateway": map[string]any{"peers": true}, "models": []any{"llama"}}, "gateway.peers is for mode gateway"},
		{map[string]any{"mode": "gateway", "gateway": map[string]any{"peers": true}}, "gateway.peers needs models"},
		{map[string]any{"mode": "gateway", "picker": map[string]any{"rateLimit": map[string]any{"perSecond": 1}}}, "picker.rateLimit is for mode picker"},
		{map[string]any{"gateway": map[string]any{"tlsSecret": "t"}, "pool": map[string]any{"name": "p"}}, "gateway.tlsSecret, gateway.apiKeysSecret and gateway.rateLimit are for mode gateway"},
		{map[string]any{"gateway": map[string]any{"rateLimit": map[string]any{"perSecond": 1}}, "pool": map[string]any{"name": "p"}}, "are for mode gateway"},
	} {
		ch, err := loader.Load(chartDir)
		require.NoError(t, err)
		rv, err := chartutil.ToRenderValues(ch, tt.vals, chartutil.ReleaseOptions{Name: "exa", Namespace: "llm"}, nil)
		require.NoError(t, err)
		_, err = engine.Render(ch, rv)
		require.ErrorContains(t, err, tt.want)
	}
}

// TestChartApplies creates every rendered object on a real API server
// with GIE's CRDs: the InferencePool passes the CRD's validation, the
// Deployment, Service and RBAC the API server's.
func TestChartApplies(t *testing.T) {
	c := startAPIServer(t)
	ctx := context.Background()
	for i, set := range appliedSets(t) {
		ns := fmt.Sprintf("ns-%d", i)
		nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
		require.NoError(t, c.Create(ctx, nsObj))
		objs := objects(t, renderAs(t, set.values, set.release, ns))
		require.NotEmpty(t, objs)
		for _, o := range objs {
			require.NoError(t, c.Create(ctx, o), "%s (%v): %s %s", set.where, set.values, o.GetKind(), o.GetName())
		}
		t.Logf("%s: %d objects created", set.where, len(objs))
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// assetsDir is the kube-apiserver and etcd directory, as
// internal/k8stest finds it; the test skips when they are absent.
func assetsDir(t *testing.T) string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		cache := os.Getenv("EXA_K8S_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "exa-k8s")
		}
		dir = filepath.Join(cache, "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Skipf("skipping: no %s in %s: run e2e/k8s/install.sh", b, dir)
		}
	}
	return dir
}

func gieCRDs(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	require.NoError(t, err)
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
}

// startAPIServer starts a real API server with GIE's CRDs for the test and
// returns a client of it.
func startAPIServer(t *testing.T) client.Client {
	t.Helper()
	t.Setenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", envOr("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", "120s"))
	env := &envtest.Environment{BinaryAssetsDirectory: assetsDir(t), CRDDirectoryPaths: []string{gieCRDs(t)}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{})
	require.NoError(t, err)
	return c
}
