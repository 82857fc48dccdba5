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
// turns a request into a prefix key, the gateway routes it, and the chosen
// replica's Address gives the endpoint. It is safe for concurrent use;
// calls are serialised, as Gateway.Route's are.
//
// The gateway's policy must be a *ScopedPolicy (see its doc), which
// scopes each decision to the subset hint, sheds load when
// ScopedPolicy.ShedAbove says so, and ranks the fallbacks.
type GatewayRouter struct {
	gw        *gateway.Gateway
	pol       *ScopedPolicy
	key       KeyFunc
	fallbacks int

	mu    sync.Mutex
	buf   gateway.Key
	allow map[string]struct{}
	eps   map[string]string // replica name to endpoint, for fallbacks
}

var _ Router = (*GatewayRouter)(nil)

// NewGatewayRouter returns a Router over gw, whose policy must be a
// *ScopedPolicy. fallbacks is how many fallback endpoints each Pick
// offers (0: none).
func NewGatewayRouter(gw *gateway.Gateway, key KeyFunc, fallbacks int) (*GatewayRouter, error) {
	if gw == nil || key == nil {
		return nil, fmt.Errorf("%w: NewGatewayRouter needs a gateway and a key function", ErrInvalidOptions)
	}
	pol, ok := gw.Policy().(*ScopedPolicy)
	if !ok {
		return nil, fmt.Errorf("%w: the gateway's policy is %T; create it with gateway.WithPolicy(picker.NewScopedPolicy(...))", ErrInvalidOptions, gw.Policy())
	}
	if fallbacks < 0 {
		return nil, fmt.Errorf("%w: fallbacks %d is negative", ErrInvalidOptions, fallbacks)
	}
	return &GatewayRouter{gw: gw, pol: pol, key: key, fallbacks: fallbacks,
		allow: map[string]struct{}{}, eps: map[string]string{}}, nil
}

// Pick routes req with the gateway.
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
	if req.Subset != nil || r.fallbacks > 0 {
		// The replica table is read only when the request needs it.
		clear(r.eps)
		clear(r.allow)
		for _, rs := range r.gw.Replicas() {
			ep, err := EndpointOf(rs.Address)
			if err != nil {
				continue // never eligible: it cannot be named to Envoy
			}
			r.eps[rs.Name] = ep
			if req.Subset.Allows(ep) {
				r.allow[rs.Name] = struct{}{}
			}
		}
	}
	if req.Subset != nil {
		r.pol.allow = r.allow
	}
	r.pol.fallbacks = r.fallbacks
	d, err := r.gw.Route(key)
	shed, empty, names := r.pol.shed, r.pol.empty, r.pol.outNames
	r.pol.allow, r.pol.fallbacks = nil, 0
	if err != nil {
		switch {
		case shed:
			return Pick{}, fmt.Errorf("%w: every eligible endpoint has %d or more requests outstanding", ErrShed, r.pol.ShedAbove)
		case empty:
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
	if len(names) > 0 {
		p.Fallbacks = make([]string, 0, len(names))
		for _, n := range names {
			if fb, ok := r.eps[n]; ok {
				p.Fallbacks = append(p.Fallbacks, fb)
			}
		}
	}
	return p, nil
}

// decisionTracker feeds a request's progress back to its gateway decision.
type decisionTracker struct{ d gateway.Decision }

func (t *decisionTracker) FirstToken() { t.d.FirstToken() }
func (t *decisionTracker) Done(o Outcome) {
	t.d.Done(gateway.DoneInfo{Latency: o.Latency, Err: o.Err})
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
