package k8s

import (
	"strconv"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

func testPool(ports ...int32) *giev1.InferencePool {
	p := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: "ns"}}
	p.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "sim"}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, giev1.Port{Number: giev1.PortNumber(n)})
	}
	return p
}

func testPod(name, ns, app, ip string, ready bool) corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
}

func TestPoolReplicas(t *testing.T) {
	now := metav1.Now()
	deleting := testPod("d", "ns", "sim", "10.0.0.9", true)
	deleting.DeletionTimestamp = &now
	pods := []corev1.Pod{
		testPod("b", "ns", "sim", "10.0.0.2", true),
		testPod("a", "ns", "sim", "10.0.0.1", true),
		testPod("notready", "ns", "sim", "10.0.0.3", false),
		testPod("noip", "ns", "sim", "", true),
		testPod("other", "ns", "other", "10.0.0.4", true),
		testPod("elsewhere", "ns2", "sim", "10.0.0.5", true),
		testPod("v6", "ns", "sim", "fd00::1", true),
		deleting,
	}
	require.Equal(t, []config.Replica{
		{Name: "a", Address: "http://10.0.0.1:8000"},
		{Name: "b", Address: "http://10.0.0.2:8000"},
		{Name: "v6", Address: "http://[fd00::1]:8000"},
	}, PoolReplicas(testPool(8000), pods))
	// Several target ports: one replica per pod and port, named as GIE does.
	require.Equal(t, []config.Replica{
		{Name: "a-rank-0", Address: "http://10.0.0.1:8000"},
		{Name: "a-rank-1", Address: "http://10.0.0.1:8001"},
	}, PoolReplicas(testPool(8000, 8001), pods[1:2]))
	// An empty selector selects nothing.
	empty := testPool(8000)
	empty.Spec.Selector.MatchLabels = nil
	require.Empty(t, PoolReplicas(empty, pods))
}

func TestSliceReplicas(t *testing.T) {
	yes, no := true, false
	http, metrics := "http", "metrics"
	p8000, p9090 := int32(8000), int32(9090)
	s := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &metrics, Port: &p9090}, {Name: &http, Port: &p8000}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.2"}, TargetRef: &corev1.ObjectReference{Name: "pod-b"}},
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			{Addresses: []string{"10.0.0.4"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Terminating: &yes}},
			{Addresses: nil},
		}}
	dup := s
	dup.Endpoints = s.Endpoints[:1]
	fqdn := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeFQDN, Ports: s.Ports, Endpoints: s.Endpoints}
	require.Equal(t, []config.Replica{
		{Name: "10.0.0.1", Address: "http://10.0.0.1:8000"},
		{Name: "pod-b", Address: "http://10.0.0.2:8000"},
	}, SliceReplicas([]discoveryv1.EndpointSlice{s, dup, fqdn}, "http"))
	// "" takes the first port; an unknown port name lists nothing.
	require.Equal(t, "http://10.0.0.1:9090", SliceReplicas([]discoveryv1.EndpointSlice{s}, "")[0].Address)
	require.Empty(t, SliceReplicas([]discoveryv1.EndpointSlice{s}, "grpc"))

	// A pod named like another endpoint's address (a valid pod name)
	// hides neither, in either order of the slices.
	podIP := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Ports: s.Ports,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"}, TargetRef: &corev1.ObjectReference{Name: "10.0.0.1"}}}}
	want := []config.Replica{
		{Name: "10.0.0.1", Address: "http://10.0.0.7:8000"},
		{Name: "10.0.0.1:8000", Address: "http://10.0.0.1:8000"},
		{Name: "pod-b", Address: "http://10.0.0.2:8000"},
	}
	require.Equal(t, want, SliceReplicas([]discoveryv1.EndpointSlice{s, podIP, dup}, "http"))
	require.Equal(t, want, SliceReplicas([]discoveryv1.EndpointSlice{podIP, s}, "http"))
}

func TestMerge(t *testing.T) {
	base := &config.File{Version: config.Version, Models: map[string]config.Model{
		"a":  {Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "static", Address: "http://10.1.1.1:80"}}},
		"pd": {Disaggregate: true, PrefillPool: "p", DecodePool: "d"},
	}}
	reps := []config.Replica{{Name: "x", Address: "http://10.0.0.1:8000"}}
	// nil models: every model of base that is not disaggregated.
	got := Merge(base, nil, config.Model{}, reps)
	require.Equal(t, reps, got.Models["a"].Replicas)
	require.Equal(t, gateway.ModeCacheAware, got.Models["a"].Mode)
	require.Nil(t, got.Models["pd"].Replicas)
	require.Equal(t, "static", base.Models["a"].Replicas[0].Name, "base must not change")
	// Named models: absent ones come from the template.
	got = Merge(base, []string{"new"}, config.Model{Mode: gateway.ModeLoadAware}, reps)
	require.Equal(t, gateway.ModeLoadAware, got.Models["new"].Mode)
	require.Equal(t, reps, got.Models["new"].Replicas)
	require.Equal(t, "static", got.Models["a"].Replicas[0].Name, "a model not named keeps its replicas")
	require.NoError(t, got.Validate())
	// No base, no pods: the named model has no replicas (it answers 503).
	got = Merge(nil, []string{"m"}, config.Model{}, nil)
	require.Empty(t, got.Models["m"].Replicas)
	require.NoError(t, got.Validate())
}

// TestPoolReplicasLongPodName: a pod name of 253 bytes (the most a pod
// name may have) on a pool of several target ports gives replica names
// within config.MaxNameBytes, distinct for pods whose names differ only
// at the end, so that the discovered configuration is not refused.
func TestPoolReplicasLongPodName(t *testing.T) {
	long := func(last string) string { return strings.Repeat("a", 252) + last }
	pods := []corev1.Pod{testPod(long("x"), "ns", "sim", "10.0.0.1", true), testPod(long("y"), "ns", "sim", "10.0.0.2", true)}
	reps := PoolReplicas(testPool(8000, 8001), pods)
	require.Len(t, reps, 4)
	seen := map[string]bool{}
	for _, r := range reps {
		require.NoError(t, config.ValidateName(r.Name))
		require.True(t, strings.HasSuffix(r.Name, "-rank-0") || strings.HasSuffix(r.Name, "-rank-1"), r.Name)
		require.False(t, seen[r.Name], "name %q twice", r.Name)
		seen[r.Name] = true
	}
	require.NoError(t, Merge(nil, []string{"m"}, config.Model{}, reps).Validate())
	// Names that fit are as GIE spells them.
	require.Equal(t, "p-rank-7", rankName("p", 7))
	require.Equal(t, rankName(long("x"), 1), rankName(long("x"), 1))
}

// TestSliceReplicasDualStack: a dual-stack Service lists each pod in an
// IPv4 slice and an IPv6 slice, which the watch cache returns in no fixed
// order; the replicas must not depend on that order (each rebuild would
// otherwise apply the pods' addresses flipping between families).
func TestSliceReplicasDualStack(t *testing.T) {
	yes := true
	http, p8000 := "http", int32(8000)
	slice := func(name string, typ discoveryv1.AddressType, addr string) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, AddressType: typ,
			Ports: []discoveryv1.EndpointPort{{Name: &http, Port: &p8000}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &yes},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "pod-a"}}}}
	}
	v4 := slice("svc-x7k2p", discoveryv1.AddressTypeIPv4, "10.0.0.1")
	v6 := slice("svc-a9f3q", discoveryv1.AddressTypeIPv6, "fd00::1")
	want := []config.Replica{{Name: "pod-a", Address: "http://10.0.0.1:8000"}}
	require.Equal(t, want, SliceReplicas([]discoveryv1.EndpointSlice{v4, v6}, "http"))
	require.Equal(t, want, SliceReplicas([]discoveryv1.EndpointSlice{v6, v4}, "http"))
}

// TestMissingPort: a port name that no slice with a ready endpoint has is
// missing (a misnamed --service-port would make every endpoint no
// replica); a slice without ready endpoints, of another address type, or
// no slice at all, says nothing, and "" (each slice's first port) is never
// missing.
func TestMissingPort(t *testing.T) {
	yes, no := true, false
	p80, http, web := int32(80), "http", "web"
	slice := func(name string, typ discoveryv1.AddressType, port *string, ready bool) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, AddressType: typ,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}}}}
		if ready {
			s.Endpoints[0].Conditions.Ready = &yes
		}
		if port != nil {
			s.Ports = []discoveryv1.EndpointPort{{Name: port, Port: &p80}}
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		slices  []discoveryv1.EndpointSlice
		port    string
		missing bool
		ports   []string
	}{
		{"named", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, &http, true)}, "http", false, nil},
		{"misnamed", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, &web, true)}, "http", true, []string{"web"}},
		{"one slice has it", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, &web, true), slice("b", discoveryv1.AddressTypeIPv6, &http, true)}, "http", false, nil},
		{"no ready endpoint", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, &web, false)}, "http", false, nil},
		{"FQDN only", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeFQDN, &web, true)}, "http", false, nil},
		{"no slices", nil, "http", false, nil},
		{"first port", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, &web, true)}, "", false, nil},
		{"no ports", []discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, nil, true)}, "http", true, nil},
	} {
		ports, missing := missingPort(tc.slices, tc.port)
		require.Equal(t, tc.missing, missing, tc.name)
		require.Equal(t, tc.ports, ports, tc.name)
		if missing {
			require.Empty(t, SliceReplicas(tc.slices, tc.port), "%s: missing means no replica", tc.name)
		}
	}
}

// TestPoolReplicasActivePorts: a pod's annotation
// inference.networking.k8s.io/active-ports narrows the pool's target ports
// it serves, as GIE v1.5.0's datastore reads it (extractActivePorts): a
// comma-separated list of port numbers, spaces allowed; entries that are
// not a target port or not a number are ignored; an empty value means no
// port. The rank of a replica stays its port's index in targetPorts.
func TestPoolReplicasActivePorts(t *testing.T) {
	pool := testPool(8000, 8001, 8002)
	for _, tc := range []struct {
		annotation *string
		want       []string
	}{
		{nil, []string{"a-rank-0", "a-rank-1", "a-rank-2"}},
		{ptr(""), nil},
		{ptr("8001"), []string{"a-rank-1"}},
		{ptr("8002, 8000 "), []string{"a-rank-0", "a-rank-2"}},
		{ptr("8000,invalid,-1,9000,8000"), []string{"a-rank-0"}},
	} {
		pod := testPod("a", "ns", "sim", "10.0.0.1", true)
		if tc.annotation != nil {
			pod.Annotations = map[string]string{"inference.networking.k8s.io/active-ports": *tc.annotation}
		}
		var names []string
		for _, r := range PoolReplicas(pool, []corev1.Pod{pod}) {
			names = append(names, r.Name)
			require.True(t, strings.HasSuffix(r.Address, ":"+strconv.Itoa(8000+int(r.Name[len(r.Name)-1]-'0'))), "%+v", r)
		}
		require.Equal(t, tc.want, names, "annotation %q", pod.Annotations)
	}
	// One target port: the pod serves it unless the annotation leaves it out.
	pod := testPod("a", "ns", "sim", "10.0.0.1", true)
	pod.Annotations = map[string]string{"inference.networking.k8s.io/active-ports": "9000"}
	require.Empty(t, PoolReplicas(testPool(8000), []corev1.Pod{pod}))
}

func ptr[T any](v T) *T { return &v }

// TestSliceReplicasBadTargetName: the API server does not validate an
// EndpointSlice endpoint's targetRef, so anyone who may write a slice of
// the Service can give one a name no replica may have (surrounding
// spaces, control characters, invalid UTF-8, past config.MaxNameBytes). That endpoint is named by its
// address instead, so that it cannot make the configuration of every
// discovered replica be refused.
func TestSliceReplicasBadTargetName(t *testing.T) {
	yes := true
	http, p8000 := "http", int32(8000)
	for _, name := range []string{" pod", "pod ", "pod\x00", "pod\nb", "pod\xff", strings.Repeat("p", config.MaxNameBytes+1)} {
		s := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: &http, Port: &p8000}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "pod-a"}},
				{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name}},
			}}
		reps := SliceReplicas([]discoveryv1.EndpointSlice{s}, "http")
		require.Equal(t, []config.Replica{
			{Name: "10.0.0.2", Address: "http://10.0.0.2:8000"},
			{Name: "pod-a", Address: "http://10.0.0.1:8000"},
		}, reps, "target %q", name)
		checkReplicas(t, reps)
	}
}
