package picker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

func TestEndpointOf(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
		ok         bool
	}{
		{"http://10.0.0.7:8000", "10.0.0.7:8000", true},
		{"https://10.0.0.7:8443/v1", "10.0.0.7:8443", true},
		{"10.0.0.7:8000", "10.0.0.7:8000", true},
		{"http://[fd00::7]:8000/", "[fd00::7]:8000", true},
		{"http://engine:8000", "", false},
		{"http://10.0.0.7", "", false},
		{"", "", false},
	} {
		got, err := EndpointOf(tc.addr)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("EndpointOf(%q) = %q, %v; want %q ok=%v", tc.addr, got, err, tc.want, tc.ok)
		}
		if err != nil && !contains(err.Error(), fmt.Sprintf("%q", tc.addr)) {
			t.Errorf("error %v does not name the address", err)
		}
	}
}

// TestGatewayRouter exercises the adapter without gRPC: subset scoping,
// replicas whose address cannot be an endpoint, and load released by the
// Tracker.
func TestGatewayRouter(t *testing.T) {
	reps := []gateway.Replica{
		{Name: "a", Address: "http://10.0.0.1:8000"},
		{Name: "b", Address: "http://10.0.0.2:8000"},
		{Name: "named", Address: "http://engine:8000"},
	}
	gw, err := gateway.New(reps)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.SetHealthy("named", false); err != nil {
		t.Fatal(err)
	}
	r := newRouter(t, gw, 2)
	ctx := context.Background()
	req := func(sub Subset) *PickRequest {
		return &PickRequest{Body: chat("s", "s", "q"), Subset: sub}
	}
	for range 4 {
		p, err := r.Pick(ctx, req(Subset{"10.0.0.2:8000"}))
		if err != nil || p.Endpoint != "10.0.0.2:8000" {
			t.Fatalf("subset b: %+v, %v", p, err)
		}
		if len(p.Fallbacks) != 0 {
			t.Errorf("fallbacks %v outside a one-endpoint subset", p.Fallbacks)
		}
		p.Tracker.Done(Outcome{})
	}
	p, err := r.Pick(ctx, req(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Fallbacks) != 1 || p.Fallbacks[0] == p.Endpoint {
		t.Errorf("endpoint %s fallbacks %v: want the other healthy replica", p.Endpoint, p.Fallbacks)
	}
	if fl := inFlight(gw); fl[0]+fl[1] != 1 {
		t.Errorf("in flight %v, want one", fl)
	}
	p.Tracker.FirstToken()
	p.Tracker.Done(Outcome{Latency: 5})
	if fl := inFlight(gw); fl[0]+fl[1] != 0 {
		t.Errorf("in flight %v after Done", fl)
	}
	if _, err := r.Pick(ctx, req(Subset{"10.0.0.9:1"})); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("subset of no replica: %v", err)
	}
	// A replica whose address is a host name is routed to only when the
	// gateway picks it; the router then refuses, releasing the decision.
	if err := gw.SetHealthy("named", true); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if err := gw.SetHealthy(n, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Pick(ctx, req(nil)); !errors.Is(err, ErrNoEndpoint) || !contains(err.Error(), "engine:8000") {
		t.Errorf("host-name replica: %v", err)
	}
	if fl := inFlight(gw); fl[2] != 0 {
		t.Errorf("refused decision left %d in flight", fl[2])
	}
	if _, err := NewGatewayRouter(nil, r.key, 0); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("no gateway: %v", err)
	}
}

// TestPropGatewayRouterScope: whatever the replicas' health and load, the
// subset hint and the shed limit, a pick is a healthy endpoint in the
// subset; the request is shed exactly when every healthy replica in the
// subset is at the limit, and refused with ErrNoEndpoint when there is
// none; the fallbacks are distinct healthy endpoints in the subset other
// than the pick, fewest outstanding first, as many as asked and there are.
func TestPropGatewayRouterScope(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "n")
		reps := make([]gateway.Replica, n)
		for i := range reps {
			reps[i] = gateway.Replica{Name: fmt.Sprintf("r%d", i), Address: "http://" + endpointN(i)}
		}
		gw, err := gateway.New(reps, gateway.WithMode(gateway.ModeCacheAware))
		if err != nil {
			t.Fatal(err)
		}
		healthy := make([]bool, n)
		queue := make([]int, n)
		for i := range n {
			healthy[i] = rapid.Float64Range(0, 1).Draw(t, "up") < 0.8
			queue[i] = rapid.IntRange(0, 4).Draw(t, "queue")
			name := fmt.Sprintf("r%d", i)
			if err := gw.SetHealthy(name, healthy[i]); err != nil {
				t.Fatal(err)
			}
			if err := gw.UpdateLoad(name, gateway.Load{QueueDepth: queue[i]}); err != nil {
				t.Fatal(err)
			}
		}
		key, err := BodyKey(keys.TextBlockBytes, "m1")
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewGatewayRouter(gw, key, rapid.IntRange(0, 6).Draw(t, "fallbacks"))
		if err != nil {
			t.Fatal(err)
		}
		r.ShedAbove = rapid.IntRange(0, 5).Draw(t, "shed")
		var sub Subset
		inSubset := make([]bool, n)
		if rapid.Bool().Draw(t, "scoped") {
			sub = Subset{}
			for i := range n {
				if rapid.Bool().Draw(t, "allow") {
					sub = append(sub, endpointN(i))
					inSubset[i] = true
				}
			}
		} else {
			for i := range n {
				inSubset[i] = true
			}
		}
		var scope []int
		for i := range n {
			if healthy[i] && inSubset[i] {
				scope = append(scope, i)
			}
		}
		allShed := r.ShedAbove > 0 && len(scope) > 0 && !slices.ContainsFunc(scope, func(i int) bool { return queue[i] < r.ShedAbove })
		p, err := r.Pick(context.Background(), &PickRequest{Body: chat("s", "sess", "q"), Subset: sub})
		switch {
		case len(scope) == 0:
			if !errors.Is(err, ErrNoEndpoint) {
				t.Fatalf("nothing in scope: %v", err)
			}
			return
		case allShed:
			if !errors.Is(err, ErrShed) {
				t.Fatalf("every replica in scope at %d: %v", r.ShedAbove, err)
			}
			return
		case err != nil:
			t.Fatal(err)
		}
		defer p.Tracker.Done(Outcome{})
		index := func(ep string) int { return slices.Index(sortedEndpoints(n), ep) }
		chosen := index(p.Endpoint)
		if !slices.Contains(scope, chosen) {
			t.Fatalf("picked %s outside the scope %v", p.Endpoint, scope)
		}
		if want := min(r.fallbacks, len(scope)-1); len(p.Fallbacks) != want {
			t.Fatalf("%d fallbacks, want %d", len(p.Fallbacks), want)
		}
		seen := map[int]bool{chosen: true}
		prev := -1
		for _, fb := range p.Fallbacks {
			i := index(fb)
			if seen[i] || !slices.Contains(scope, i) {
				t.Fatalf("fallback %s repeated or out of scope", fb)
			}
			seen[i] = true
			if prev >= 0 && queue[prev] > queue[i] {
				t.Fatalf("fallback %s (queue %d) ranked after %s (queue %d)", endpointN(prev), queue[prev], fb, queue[i])
			}
			prev = i
		}
	})
}

// sortedEndpoints lists the endpoints of n test replicas, by index.
func sortedEndpoints(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = endpointN(i)
	}
	return out
}

func TestBodyKey(t *testing.T) {
	key, err := BodyKey(16, "m1")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(body string, h ...string) gateway.Key {
		t.Helper()
		var hs Headers
		for i := 0; i+1 < len(h); i += 2 {
			hs = append(hs, Header{h[i], h[i+1]})
		}
		k, err := key(nil, &PickRequest{Body: []byte(body), Header: hs})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	sys := `{"role":"system","content":"You are a careful assistant for ACME."}`
	k1 := mk(`{"model":"m1","messages":[`+sys+`,{"role":"user","content":"first"}]}`, "x-session-id", "s1")
	k2 := mk(`{"model":"m1","messages":[`+sys+`,{"role":"user","content":"first"},{"role":"assistant","content":"a"},{"role":"user","content":"second"}]}`, "X-Session-Id", "s1")
	if len(k2) <= len(k1) || !slices.Equal(k1, k2[:len(k1)]) {
		t.Errorf("a later turn's key does not extend the earlier one's")
	}
	k3 := mk(`{"model":"m1","messages":[`+sys+`,{"role":"user","content":"first"}]}`, "x-session-id", "s2")
	if slices.Equal(k1, k3) {
		t.Error("different sessions give the same key")
	}
	if len(mk(`{"model":"m1","messages":[{"role":"user","content":""}]}`)) == 0 || len(mk(`{"model":"m1","prompt":"hello"}`)) == 0 {
		t.Error("empty key")
	}
	// A body no endpoint accepts is refused, as the HTTP gateway refuses it.
	if _, err := key(nil, &PickRequest{Body: []byte(`{"model":"m1"}`)}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a body with neither messages, prompt nor input: %v", err)
	}
	if k, err := key(nil, &PickRequest{Method: "GET", Path: "/v1/models"}); err != nil || len(k) != 1 {
		t.Errorf("body-less request: %v %v", k, err)
	}
	if _, err := BodyKey(0); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("block size 0: %v", err)
	}
}
