// Package k8stest starts a real control plane (kube-apiserver and etcd,
// through controller-runtime's envtest) with GIE's InferencePool CRD, for
// tests of the Kubernetes code. The binaries come from e2e/k8s/install.sh,
// which caches them outside the repository.
package k8stest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// GIEModule is the module holding the InferencePool CRD.
const GIEModule = "sigs.k8s.io/gateway-api-inference-extension"

// AssetsDir returns the directory of kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS, else ${EXA_K8S_CACHE:-$HOME/.cache/exa-k8s}/bin. The
// error says how to install them when they are absent.
func AssetsDir() (string, error) {
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
			return "", fmt.Errorf("no %s in %s: run e2e/k8s/install.sh (builds kube-apiserver and etcd, about 20 min cold) or set KUBEBUILDER_ASSETS", b, dir)
		}
	}
	return dir, nil
}

// CRDDir returns GIE's config/crd/bases in the module cache.
func CRDDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", GIEModule).Output()
	if err != nil {
		return "", fmt.Errorf("locating %s: %w", GIEModule, err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// ErrNoAssets wraps the error of AssetsDir: tests skip on it.
var ErrNoAssets = errors.New("k8stest: control plane binaries absent")

// Start starts kube-apiserver and etcd with GIE's CRDs installed. The
// control plane's start timeout is $KUBEBUILDER_CONTROLPLANE_START_TIMEOUT,
// 120s when unset (a busy machine's /readyz takes 30-40 s). Stop it with
// env.Stop.
func Start() (*envtest.Environment, *rest.Config, error) {
	dir, err := AssetsDir()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrNoAssets, err)
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, nil, err
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		os.Setenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", "120s")
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir, CRDDirectoryPaths: []string{crds},
		ErrorIfCRDPathMissing: true, ControlPlaneStopTimeout: 30 * time.Second}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("k8stest: starting kube-apiserver and etcd from %s: %w", dir, err)
	}
	return env, cfg, nil
}
