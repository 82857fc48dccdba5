package picker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/examlops/gateway"
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
	gw, err := gateway.New(reps, gateway.WithPolicy(NewScopedPolicy(&gateway.RoundRobin{})))
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
	if _, err := NewGatewayRouter(mustGateway(t), r.key, 0); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("gateway without ScopedPolicy: %v", err)
	}
}

func mustGateway(t *testing.T) *gateway.Gateway {
	gw, err := gateway.New([]gateway.Replica{{Name: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	return gw
}

// firstPolicy picks candidate i mod len.
type firstPolicy struct{ i int }

func (p firstPolicy) Pick(_ *gateway.Request, c []gateway.Candidate) gateway.Choice {
	return gateway.Choice{Index: p.i % len(c)}
}

// TestPropScopedPolicy: whatever the candidates and scope, the choice is
// in scope (or -1 exactly when the scope is empty or every candidate in it
// is at the shed limit), and the fallbacks are distinct candidates in
// scope other than the choice, best first: longest match, then fewest
// outstanding.
func TestPropScopedPolicy(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "n")
		cands := make([]gateway.Candidate, n)
		for i := range cands {
			cands[i] = gateway.Candidate{Name: fmt.Sprintf("r%d", i),
				Matched:  rapid.IntRange(0, 4).Draw(t, "matched"),
				InFlight: rapid.IntRange(0, 4).Draw(t, "inflight")}
		}
		p := NewScopedPolicy(firstPolicy{rapid.IntRange(0, 7).Draw(t, "pick")})
		p.ShedAbove = rapid.IntRange(0, 5).Draw(t, "shed")
		p.fallbacks = rapid.IntRange(0, 8).Draw(t, "fallbacks")
		var inScope []int
		if rapid.Bool().Draw(t, "scoped") {
			p.allow = map[string]struct{}{}
			for i := range cands {
				if rapid.Bool().Draw(t, "allow") {
					p.allow[cands[i].Name] = struct{}{}
					inScope = append(inScope, i)
				}
			}
		} else {
			for i := range cands {
				inScope = append(inScope, i)
			}
		}
		ch := p.Pick(&gateway.Request{Key: gateway.Key{1}}, cands)
		allShed := p.ShedAbove > 0 && !slices.ContainsFunc(inScope, func(i int) bool { return cands[i].Outstanding() < p.ShedAbove })
		if len(inScope) == 0 || allShed {
			if ch.Index != -1 || p.empty != (len(inScope) == 0) || p.shed != (len(inScope) > 0) {
				t.Fatalf("choice %d empty %v shed %v; scope %v", ch.Index, p.empty, p.shed, inScope)
			}
			return
		}
		if !slices.Contains(inScope, ch.Index) {
			t.Fatalf("chose %d outside %v", ch.Index, inScope)
		}
		want := min(p.fallbacks, len(inScope)-1)
		if len(p.outNames) != want {
			t.Fatalf("%d fallbacks, want %d", len(p.outNames), want)
		}
		seen := map[string]bool{cands[ch.Index].Name: true}
		prev := -1
		for _, name := range p.outNames {
			i := slices.IndexFunc(cands, func(c gateway.Candidate) bool { return c.Name == name })
			if seen[name] || !slices.Contains(inScope, i) {
				t.Fatalf("fallback %s repeated or out of scope", name)
			}
			seen[name] = true
			if prev >= 0 {
				a, b := cands[prev], cands[i]
				if a.Matched < b.Matched || a.Matched == b.Matched && a.Outstanding() > b.Outstanding() {
					t.Fatalf("fallback %s ranked after %s", a.Name, b.Name)
				}
			}
			prev = i
		}
	})
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
	if len(mk(`{"model":"m1"}`)) == 0 || len(mk(`{"model":"m1","prompt":"hello"}`)) == 0 {
		t.Error("empty key")
	}
	if k, err := key(nil, &PickRequest{Method: "GET", Path: "/v1/models"}); err != nil || len(k) != 1 {
		t.Errorf("body-less request: %v %v", k, err)
	}
	if _, err := BodyKey(0); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("block size 0: %v", err)
	}
}
