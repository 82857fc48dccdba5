package picker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/examlops/gateway"
)

// KeyFunc builds a request's prefix key, appending it to dst. Its errors
// should wrap ErrBadRequest or ErrUnknownModel, naming the field at fault.
type KeyFunc func(dst gateway.Key, req *PickRequest) (gateway.Key, error)

// GatewayRouter is a Router over one *gateway.Gateway: the key function
// turns a request into a prefix key, the gateway routes it within the
// subset hint (Gateway.RouteWith, Target.Allow), and the chosen replica's Address gives
// the endpoint. Any gateway will do, whatever its policy. It is safe for
// concurrent use; calls are serialised, as Gateway.Route's are.
type GatewayRouter struct {
	gw        *gateway.Gateway
	key       KeyFunc
	fallbacks int

	// ShedAbove, when positive, makes Pick decline a request with ErrShed
	// (the server answers 429) when every healthy replica in the subset has
	// at least this many requests outstanding: the larger of the gateway's
	// in-flight count and the engine's reported queue plus batch, as
	// gateway.Candidate.Outstanding counts them. Zero, the default, never
	// sheds. Set it before routing starts.
	ShedAbove int

	mu      sync.Mutex
	buf     gateway.Key
	allow   map[string]struct{}
	allowed func(name string) bool // reads allow; made once
	eps     map[string]string      // replica name to endpoint
	names   []string               // fallback replicas of one Pick
}

var _ Router = (*GatewayRouter)(nil)

// NewGatewayRouter returns a Router over gw. fallbacks is how many
// fallback endpoints each Pick offers (0: none).
func NewGatewayRouter(gw *gateway.Gateway, key KeyFunc, fallbacks int) (*GatewayRouter, error) {
	if gw == nil || key == nil {
		return nil, fmt.Errorf("%w: NewGatewayRouter needs a gateway and a key function", ErrInvalidOptions)
	}
	if fallbacks < 0 {
		return nil, fmt.Errorf("%w: fallbacks %d is negative", ErrInvalidOptions, fallbacks)
	}
	r := &GatewayRouter{gw: gw, key: key, fallbacks: fallbacks,
		allow: map[string]struct{}{}, eps: map[string]string{}}
	r.allowed = func(name string) bool { _, ok := r.allow[name]; return ok }
	return r, nil
}

// Pick routes req with the gateway, within its subset hint. When every
// healthy replica in the subset is at ShedAbove it sheds the request
// instead. The fallbacks are other healthy replicas in the subset, fewest
// outstanding requests first, then in the order the replicas were added.
func (r *GatewayRouter) Pick(_ context.Context, req *PickRequest) (Pick, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, err := r.key(r.buf[:0], req)
	if err != nil {
		return Pick{}, err
	}
	r.buf = key[:0]
	if len(key) == 0 {
		return Pick{}, fmt.Errorf("%w: the request gives no prefix key", ErrBadRequest)
	}
	var allow func(string) bool
	if req.Subset != nil || r.fallbacks > 0 {
		// The replica table is read only when the request needs it.
		clear(r.eps)
		clear(r.allow)
		for _, rs := range r.gw.Replicas() {
			if ep, err := EndpointOf(rs.Address); err == nil {
				r.eps[rs.Name] = ep
				if req.Subset.Allows(ep) {
					r.allow[rs.Name] = struct{}{}
				}
			}
		}
	}
	if req.Subset != nil {
		allow = r.allowed
	}
	if r.ShedAbove > 0 && r.gw.Saturated(gateway.Target{Allow: allow}, gateway.Admission{Outstanding: r.ShedAbove}) {
		return Pick{}, fmt.Errorf("%w: every eligible endpoint has %d or more requests outstanding", ErrShed, r.ShedAbove)
	}
	d, err := r.gw.RouteWith(key, gateway.Target{Allow: allow})
	if err != nil {
		switch {
		case errors.Is(err, gateway.ErrNoHealthyReplica) && req.Subset != nil:
			return Pick{}, fmt.Errorf("%w: no healthy endpoint is in the subset hint %s/%s %v", ErrNoEndpoint, SubsetNamespace, SubsetKey, []string(req.Subset))
		case errors.Is(err, gateway.ErrNoHealthyReplica):
			return Pick{}, fmt.Errorf("%w: %v", ErrNoEndpoint, err)
		}
		return Pick{}, err
	}
	ep, err := EndpointOf(d.Address)
	if err != nil {
		err = fmt.Errorf("%w: replica %q: %v", ErrNoEndpoint, d.Replica, err)
		d.Done(gateway.DoneInfo{Err: err})
		return Pick{}, err
	}
	p := Pick{Endpoint: ep, Tracker: &decisionTracker{d: d}}
	if r.fallbacks > 0 {
		p.Fallbacks = r.rankFallbacks(d.Replica, allow)
	}
	return p, nil
}

// rankFallbacks returns the endpoints of up to r.fallbacks other
// replicas than chosen, with an endpoint and within allow, as the library
// ranks them (gateway.Spares).
func (r *GatewayRouter) rankFallbacks(chosen string, allow func(string) bool) []string {
	r.names = r.gw.Spares(r.names[:0], r.fallbacks, gateway.Target{Allow: func(name string) bool {
		_, ok := r.eps[name]
		return ok && (allow == nil || allow(name))
	}, Exclude: chosen})
	out := make([]string, 0, len(r.names))
	for _, name := range r.names {
		out = append(out, r.eps[name])
	}
	return out
}

// decisionTracker feeds a request's progress back to its gateway decision.
type decisionTracker struct{ d gateway.Decision }

func (t *decisionTracker) FirstToken() { t.d.FirstToken() }
func (t *decisionTracker) Done(o Outcome) {
	t.d.Done(gateway.DoneInfo{Latency: o.Latency, Err: o.Err, TTFT: o.TTFT, Elapsed: o.Elapsed, OutputTokens: o.OutputTokens})
}

// EndpointOf returns the "ip:port" endpoint of a replica address: a base
// URL such as "http://10.0.0.7:8000" or a bare "10.0.0.7:8000". Envoy's
// ORIGINAL_DST cluster connects to an IP address, so a host name is an
// error, as is an address without a port.
func EndpointOf(address string) (string, error) {
	s := address
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s = s[:i]
	}
	if _, err := netip.ParseAddrPort(s); err != nil {
		return "", fmt.Errorf("address %q is not ip:port (a URL's host must be an IP address with a port): %v", address, err)
	}
	return s, nil
}
