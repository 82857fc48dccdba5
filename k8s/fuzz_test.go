package k8s

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/examlops/gateway/config"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

// apiIP reports whether s is an address the API server accepts as a pod
// IP or an EndpointSlice address: an IP without a zone.
func apiIP(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Zone() == "" && a.String() == s
}

// checkReplicas: the replicas discovered from objects the API server
// accepts are sorted by name, named once each, and make a configuration
// that validates, so that one object cannot make the whole discovered
// set be refused.
func checkReplicas(t *testing.T, reps []config.Replica) {
	t.Helper()
	for i, r := range reps {
		if err := config.ValidateName(r.Name); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		if err := config.ValidateAddress(r.Address); err != nil {
			t.Fatalf("replica %d (%q): %v", i, r.Name, err)
		}
		if i > 0 && reps[i-1].Name >= r.Name {
			t.Fatalf("replicas not sorted or named twice: %q then %q", reps[i-1].Name, r.Name)
		}
	}
	f := Merge(nil, []string{"m"}, config.Model{}, reps)
	if err := f.Validate(); err != nil {
		t.Fatalf("discovered replicas %v make an invalid configuration: %v", reps, err)
	}
}

// FuzzPoolReplicas: pods and an InferencePool as the API server may hold
// them (pod names DNS-1123 subdomains, pod IPs, 1 to 8 distinct target
// ports of 1..65535) give replicas that a configuration accepts. Outside
// that domain PoolReplicas must still not panic.
func FuzzPoolReplicas(f *testing.F) {
	f.Add("vllm-0", uint8(0), "10.0.0.1", "vllm-1", "fd00::1", uint16(8000), uint8(1))
	f.Add("vllm-llama3-8b-instruct-7d9f8c6b5-x2x9q", uint8(0), "10.244.1.17", "b", "10.244.1.18", uint16(8000), uint8(2))
	f.Add("a.b.c", uint8(200), "192.168.0.1", "a.b.d", "::1", uint16(65535), uint8(8))
	f.Add("x", uint8(3), "fe80::1%eth0", "-bad-", "1.2.3", uint16(0), uint8(9))
	f.Fuzz(func(t *testing.T, name1 string, pad uint8, ip1, name2, ip2 string, port uint16, nports uint8) {
		name1 += strings.Repeat("a", int(pad))
		var ports []int32
		for i := range int32(nports % 10) {
			ports = append(ports, int32(port)+i)
		}
		pool := testPool(ports...)
		pods := []corev1.Pod{testPod(name1, "ns", "sim", ip1, true), testPod(name2, "ns", "sim", ip2, true)}
		reps := PoolReplicas(pool, pods)

		valid := name1 != name2 && port >= 1 && int(port)+len(pool.Spec.TargetPorts)-1 <= 65535 &&
			len(pool.Spec.TargetPorts) >= 1 && len(pool.Spec.TargetPorts) <= 8
		for _, p := range pods {
			valid = valid && len(validation.IsDNS1123Subdomain(p.Name)) == 0 && apiIP(p.Status.PodIP)
		}
		if !valid {
			return
		}
		if want := 2 * len(pool.Spec.TargetPorts); len(reps) != want {
			t.Fatalf("%d replicas from 2 ready pods and %d ports, want %d: %v", len(reps), len(pool.Spec.TargetPorts), want, reps)
		}
		checkReplicas(t, reps)
	})
}

// FuzzSliceReplicas: EndpointSlices as the API server may hold them
// (addresses IPs of the slice's type, ports 1..65535, target pod names
// DNS-1123 subdomains) give replicas that a configuration accepts, one a
// name. Outside that domain SliceReplicas must still not panic.
func FuzzSliceReplicas(f *testing.F) {
	f.Add("10.0.0.1", "vllm-0", uint8(0), "10.0.0.2", "vllm-1", int32(8000), "http", "", false, true)
	f.Add("fd00::1", "", uint8(0), "fd00::2", "", int32(8000), "", "http", true, true)
	f.Add("10.0.0.1", "10.0.0.2", uint8(0), "10.0.0.2", "", int32(1), "metrics", "metrics", false, false)
	f.Add("10.0.0.1", "10.0.0.2", uint8(0), "10.0.0.2", "", int32(8000), "", "", false, true)
	f.Add("10.0.0.1", "p", uint8(250), "10.0.0.2", "q", int32(65535), "", "", false, true)
	f.Add("1.2.3", "-x-", uint8(0), "fe80::1%eth0", "", int32(-1), "a", "b", true, false)
	f.Fuzz(func(t *testing.T, addr1, target1 string, pad uint8, addr2, target2 string, port int32, portName, want string, v6, ready2 bool) {
		target1 += strings.Repeat("a", int(pad))
		typ := discoveryv1.AddressTypeIPv4
		if v6 {
			typ = discoveryv1.AddressTypeIPv6
		}
		ep := func(addr, target string, ready bool) discoveryv1.Endpoint {
			e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
			if target != "" {
				e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: target}
			}
			return e
		}
		s := discoveryv1.EndpointSlice{AddressType: typ,
			Endpoints: []discoveryv1.Endpoint{ep(addr1, target1, true), ep(addr2, target2, ready2)},
			Ports:     []discoveryv1.EndpointPort{{Name: &portName, Port: &port}}}
		reps := SliceReplicas([]discoveryv1.EndpointSlice{s}, want)

		valid := port >= 1 && port <= 65535
		for _, e := range s.Endpoints {
			a, err := netip.ParseAddr(e.Addresses[0])
			valid = valid && apiIP(e.Addresses[0]) && err == nil && a.Is6() == v6 && !a.Is4In6()
			if e.TargetRef != nil {
				valid = valid && len(validation.IsDNS1123Subdomain(e.TargetRef.Name)) == 0
			}
		}
		if !valid {
			return
		}
		// One replica per ready pod, and per ready address without one.
		distinct := 0
		if want == "" || want == portName {
			distinct = 1
			key := func(addr, target string) string {
				if target != "" {
					return "pod " + target
				}
				return "ip " + addr
			}
			if ready2 && key(addr1, target1) != key(addr2, target2) {
				distinct = 2
			}
		}
		if len(reps) != distinct {
			t.Fatalf("%d replicas from %d distinct ready endpoints on port %q: %v", len(reps), distinct, want, reps)
		}
		checkReplicas(t, reps)
	})
}

// FuzzPoolObjectives: InferenceObjectives' names and priorities are what
// users write; PoolObjectives never panics, keeps at most max, counts the
// rest as dropped, and keeps exactly the objectives of the pool.
func FuzzPoolObjectives(f *testing.F) {
	f.Add("pool", "chat", "pool", int64(10), "batch", "other", int64(-5), int64(0), 1, false)
	f.Add("pool", "a", "pool", int64(1<<40), "a", "pool", int64(2), int64(3), 2, true)
	f.Add("", "", "", int64(0), "", "", int64(0), int64(0), 0, false)
	f.Fuzz(func(t *testing.T, pool, n1, ref1 string, prio1 int64, n2, ref2 string, prio2, secs int64, max int, deleting bool) {
		if max < 1 {
			max = 1
		}
		p1, p2 := int(prio1), int(prio2)
		now := metav1.Now()
		items := []v1alpha2.InferenceObjective{objective(n1, ref1, &p1, secs), objective(n2, ref2, &p2, 0)}
		if deleting {
			items[1].DeletionTimestamp = &now
		}
		items = append(items, objective(n1+"-unset", pool, nil, 1))
		before := slices.Clone(items)
		m, dropped := PoolObjectives(pool, items, max)
		mine := map[string]bool{}
		count := 0
		for _, o := range items {
			if string(o.Spec.PoolRef.Name) == pool && o.DeletionTimestamp == nil {
				mine[o.Name] = true
				count++
			}
		}
		if dropped < 0 || len(m) > max || (count <= max && dropped != 0) || (count > max && dropped != count-max) {
			t.Fatalf("%d objectives of the pool, max %d: kept %d, dropped %d", count, max, len(m), dropped)
		}
		for name := range m {
			if !mine[name] {
				t.Fatalf("kept %q, not an objective of pool %q", name, pool)
			}
		}
		for i := range items {
			if items[i].Name != before[i].Name {
				t.Fatalf("PoolObjectives reordered its input")
			}
		}
	})
}

// FuzzActivePorts: any active-ports annotation gives a subset of the
// pool's target ports, each with its rank, never a panic.
func FuzzActivePorts(f *testing.F) {
	f.Add("8000,8001")
	f.Add(" 8002 ,x,-1,9000,")
	f.Add("+8001\x00")
	f.Fuzz(func(t *testing.T, annotation string) {
		pod := testPod("a", "ns", "sim", "10.0.0.1", true)
		pod.Annotations = map[string]string{ActivePortsAnnotation: annotation}
		reps := PoolReplicas(testPool(8000, 8001, 8002), []corev1.Pod{pod})
		if len(reps) > 3 {
			t.Fatalf("%d replicas from 3 ports: %v", len(reps), reps)
		}
		for _, r := range reps {
			rank := strings.TrimPrefix(r.Name, "a-rank-")
			if len(rank) != 1 || r.Address != "http://10.0.0.1:800"+rank {
				t.Fatalf("replica %+v", r)
			}
		}
		checkReplicas(t, reps)
	})
}
