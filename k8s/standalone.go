package k8s

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// MaxTargetPorts is the most target ports a pool (or a standalone
// selector, Options.Selector) may list, as GIE's InferencePool CRD and
// its --endpoint-target-ports allow.
const MaxTargetPorts = 8

// ParseSelector reads GIE's --endpoint-selector: comma-separated
// key=value labels, as labels.ConvertSelectorToLabelsMap
// reads it in GIE v1.5.0 (cmd/epp/runner/runner.go,
// NewEndpointPoolFromOptions). It must name at least one label.
func ParseSelector(s string) (map[string]string, error) {
	m, err := labels.ConvertSelectorToLabelsMap(s)
	if err != nil {
		return nil, fmt.Errorf("k8s: invalid endpoint selector %q: %w", s, err)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("k8s: invalid endpoint selector %q: want at least one key=value label", s)
	}
	return m, nil
}

// ParsePorts reads GIE's --endpoint-target-ports: comma-separated ports,
// 1 to MaxTargetPorts of them after duplicates are dropped (as GIE's
// removeDuplicatePorts), each 1-65535.
func ParsePorts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("k8s: invalid endpoint target ports %q: %q is not a port (1-65535)", s, f)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if len(out) > MaxTargetPorts {
		return nil, fmt.Errorf("k8s: invalid endpoint target ports %q: at most %d ports", s, MaxTargetPorts)
	}
	return out, nil
}

// standalonePool is the pool that GIE's standalone mode builds from its
// flags: the pods of namespace matching selector, on ports.
func standalonePool(namespace string, selector map[string]string, ports []int) *giev1.InferencePool {
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: namespace}}
	pool.Spec.Selector.MatchLabels = make(map[giev1.LabelKey]giev1.LabelValue, len(selector))
	for k, v := range selector {
		pool.Spec.Selector.MatchLabels[giev1.LabelKey(k)] = giev1.LabelValue(v)
	}
	for _, p := range ports {
		pool.Spec.TargetPorts = append(pool.Spec.TargetPorts, giev1.Port{Number: giev1.PortNumber(p)})
	}
	return pool
}
