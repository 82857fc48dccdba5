package k8s

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/examlops/gateway/config"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// PodReady reports whether a pod can take requests: not being deleted,
// condition Ready true and a pod IP, as GIE's IsPodReady (v1.5.0,
// pkg/epp/util/pod/pod.go) plus the IP a replica address needs.
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PoolSelector returns the label selector of a pool's spec.selector. An
// empty selector selects nothing (the CRD requires at least one label).
func PoolSelector(pool *giev1.InferencePool) labels.Selector {
	set := make(labels.Set, len(pool.Spec.Selector.MatchLabels))
	for k, v := range pool.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	if len(set) == 0 {
		return labels.Nothing()
	}
	return labels.SelectorFromSet(set)
}

// ActivePortsAnnotation is the pod annotation that narrows the target
// ports of its pool the pod serves, as GIE v1.5.0's datastore reads it
// (pkg/epp/datastore/datastore.go, extractActivePorts): a comma-separated
// list of port numbers ("8000,8001"); entries that are not a number or not
// a target port are ignored, and an empty value means none. Without it
// the pod serves every target port.
const ActivePortsAnnotation = "inference.networking.k8s.io/active-ports"

// activePorts returns the target ports p serves (see
// [ActivePortsAnnotation]); nil means all of them.
func activePorts(p *corev1.Pod) map[int]bool {
	v, ok := p.Annotations[ActivePortsAnnotation]
	if !ok {
		return nil
	}
	active := map[int]bool{}
	for s := range strings.SplitSeq(v, ",") {
		var n int
		// As GIE parses each entry: the leading number, sign allowed.
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%d", &n); err == nil && n > 0 {
			active[n] = true
		}
	}
	return active
}

// PoolReplicas returns the replicas of a pool: for each ready pod in the
// pool's namespace matching its selector, one replica per target port it
// serves (all, unless its [ActivePortsAnnotation] narrows them), named
// after the pod (POD-rank-I when the pool has several target ports, I the
// port's index in targetPorts, as GIE names its endpoints; see rankName
// for a pod name too long for that) with address http://POD_IP:PORT. The
// list is sorted by name. pods may hold pods of other namespaces or
// labels; they are skipped.
func PoolReplicas(pool *giev1.InferencePool, pods []corev1.Pod) []config.Replica {
	sel := PoolSelector(pool)
	var out []config.Replica
	for i := range pods {
		p := &pods[i]
		if p.Namespace != pool.Namespace || !sel.Matches(labels.Set(p.Labels)) || !PodReady(p) {
			continue
		}
		active := activePorts(p)
		for idx, port := range pool.Spec.TargetPorts {
			if active != nil && !active[int(port.Number)] {
				continue
			}
			name := p.Name
			if len(pool.Spec.TargetPorts) > 1 {
				name = rankName(name, idx)
			}
			out = append(out, config.Replica{Name: name, Address: "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.Number)))})
		}
	}
	sortReplicas(out)
	return out
}

// rankName returns POD-rank-I, the name of a pod's replica on the pool's
// target port I. A pod name may have 253 bytes, and with the suffix that
// would pass config.MaxNameBytes, so that the configuration of every
// discovered replica would be refused: a name too long keeps the start
// of the pod's name and replaces the rest with a hash of the whole name,
// which keeps the names of distinct pods distinct.
func rankName(pod string, idx int) string {
	suffix := "-rank-" + strconv.Itoa(idx)
	if len(pod)+len(suffix) <= config.MaxNameBytes {
		return pod + suffix
	}
	sum := sha256.Sum256([]byte(pod))
	hash := "-" + hex.EncodeToString(sum[:8])
	keep := config.MaxNameBytes - len(suffix) - len(hash)
	for keep > 0 && !utf8.RuneStart(pod[keep]) {
		keep--
	}
	return pod[:keep] + hash + suffix
}

// SliceReplicas returns the replicas of a Service's EndpointSlices: every
// ready endpoint (conditions.ready unset or true, not terminating) on the
// port named port ("" = each slice's first port), named after its target
// pod (when that is a valid replica name: the API server does not check
// it), else its address, sorted by name. A pod listed twice (as in two
// slices while they change) is one replica, and so is an address. An
// endpoint without a pod whose address is also a pod's name (an IPv4
// address is a valid pod name) is named ADDRESS:PORT, which no pod name
// can be, so that neither hides the other. Slices of the FQDN address type
// are skipped (the picker needs IPs). A pod listed in several slices
// (an IPv4 and an IPv6 slice of a dual-stack Service) takes its address
// from the first in a fixed order, IPv4 slices first, then by slice name,
// whatever the order of slicesIn (a watch cache lists in no fixed order).
func SliceReplicas(slicesIn []discoveryv1.EndpointSlice, port string) []config.Replica {
	type ep struct {
		ip   string
		port int32
	}
	order := make([]*discoveryv1.EndpointSlice, len(slicesIn))
	for i := range slicesIn {
		order[i] = &slicesIn[i]
	}
	slices.SortStableFunc(order, func(a, b *discoveryv1.EndpointSlice) int {
		if a4, b4 := a.AddressType == discoveryv1.AddressTypeIPv4, b.AddressType == discoveryv1.AddressTypeIPv4; a4 != b4 {
			if a4 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	pods := map[string]bool{}
	var bare []ep // endpoints without a target pod
	var out []config.Replica
	for _, s := range order {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		pnum := slicePort(s, port)
		if pnum == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if !ready(&e) {
				continue
			}
			addr := "http://" + net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(pnum)))
			// The API server does not validate targetRef: a name no
			// replica may have would make the whole configuration be
			// refused, so that endpoint is named by its address.
			if e.TargetRef == nil || config.ValidateName(e.TargetRef.Name) != nil {
				bare = append(bare, ep{e.Addresses[0], pnum})
				continue
			}
			if name := e.TargetRef.Name; !pods[name] {
				pods[name] = true
				out = append(out, config.Replica{Name: name, Address: addr})
			}
		}
	}
	seen := map[string]bool{}
	for _, e := range bare {
		hostPort := net.JoinHostPort(e.ip, strconv.Itoa(int(e.port)))
		name := e.ip
		if pods[name] {
			name = hostPort
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, config.Replica{Name: name, Address: "http://" + hostPort})
	}
	sortReplicas(out)
	return out
}

// slicePort returns the number of the slice's port named name ("" = its
// first port), or 0 when it has none.
// missingPort reports whether port names no port of the slices that have
// a ready endpoint (SliceReplicas' rule) while some slice has one: a
// misnamed --service-port, which would make every ready endpoint no
// replica. ports lists the port names those slices have (sorted, at most
// 16). "" names each slice's first port, never missing.
func missingPort(list []discoveryv1.EndpointSlice, port string) (ports []string, missing bool) {
	if port == "" {
		return nil, false
	}
	names := map[string]bool{}
	for i := range list {
		s := &list[i]
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 || !hasReady(s) {
			continue
		}
		if slicePort(s, port) != 0 {
			return nil, false
		}
		missing = true
		for _, p := range s.Ports {
			if p.Name != nil && len(names) < 16 {
				names[*p.Name] = true
			}
		}
	}
	for n := range names {
		ports = append(ports, n)
	}
	slices.Sort(ports)
	return ports, missing
}

// hasReady reports whether s has an endpoint SliceReplicas takes.
func hasReady(s *discoveryv1.EndpointSlice) bool {
	for i := range s.Endpoints {
		if ready(&s.Endpoints[i]) {
			return true
		}
	}
	return false
}

// ready reports whether e is an endpoint SliceReplicas takes: an
// address, ready (unset or true) and not terminating.
func ready(e *discoveryv1.Endpoint) bool {
	return len(e.Addresses) > 0 && (e.Conditions.Ready == nil || *e.Conditions.Ready) &&
		(e.Conditions.Terminating == nil || !*e.Conditions.Terminating)
}

func slicePort(s *discoveryv1.EndpointSlice, name string) int32 {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if name == "" || (p.Name != nil && *p.Name == name) {
			return *p.Port
		}
	}
	return 0
}

func sortReplicas(rs []config.Replica) {
	slices.SortFunc(rs, func(a, b config.Replica) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
}

// Merge returns a copy of base in which every model of models has reps as
// its replicas; models nil means every model of base that is not
// disaggregated. A model of models absent from base is added as template.
// Disaggregated models are left as base has them (their pools are not
// discovered). base is not changed; nil is an empty configuration.
func Merge(base *config.File, models []string, template config.Model, reps []config.Replica) *config.File {
	var out *config.File
	if base == nil {
		out = &config.File{Version: config.Version}
	} else {
		out = base.Clone()
	}
	if out.Models == nil {
		out.Models = map[string]config.Model{}
	}
	if models == nil {
		models = out.Names()
	}
	for _, name := range models {
		m, ok := out.Models[name]
		if !ok {
			m = template.Clone()
		}
		if m.Disaggregate {
			continue
		}
		m.Replicas = slices.Clone(reps)
		out.Models[name] = m
	}
	return out
}
