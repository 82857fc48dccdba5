package picker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/examlops/gateway"
)

// KeyFunc builds a request's prefix key, appending it to dst. Its errors
// should wrap ErrBadRequest or ErrUnknownModel, naming the field at fault.
type KeyFunc func(dst gateway.Key, req *PickRequest) (gateway.Key, error)

// GatewayRouter is a Router over one *gateway.Gateway: the key function
// turns a request into a prefix key, the gateway routes it within the
// subset hint (Gateway.RouteWithin), and the chosen replica's Address gives
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
	spare   []spare                // fallback candidates of one Pick
}

// spare is a replica that could serve a request if its pick fails.
type spare struct {
	name        string
	outstanding int
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
	r.spare = r.spare[:0]
	if req.Subset != nil || r.fallbacks > 0 || r.ShedAbove > 0 {
		// The replica table is read only when the request needs it.
		clear(r.eps)
		clear(r.allow)
		shed, inScope := r.ShedAbove > 0, 0
		for _, rs := range r.gw.Replicas() {
			ep, err := EndpointOf(rs.Address)
			if err == nil {
				r.eps[rs.Name] = ep
				if req.Subset.Allows(ep) {
					r.allow[rs.Name] = struct{}{}
				}
			}
			_, allowed := r.allow[rs.Name]
			if !rs.Healthy || (req.Subset != nil && !allowed) {
				continue
			}
			inScope++
			o := max(rs.InFlight, rs.Load.QueueDepth+rs.Load.Running)
			if o < r.ShedAbove {
				shed = false
			}
			if err == nil {
				r.spare = append(r.spare, spare{rs.Name, o})
			}
		}
		if shed && inScope > 0 {
			return Pick{}, fmt.Errorf("%w: every eligible endpoint has %d or more requests outstanding", ErrShed, r.ShedAbove)
		}
	}
	var allow func(string) bool
	if req.Subset != nil {
		allow = r.allowed
	}
	d, err := r.gw.RouteWithin(key, allow)
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
		p.Fallbacks = r.rankFallbacks(d.Replica)
	}
	return p, nil
}

// rankFallbacks returns the endpoints of up to r.fallbacks spare replicas
// other than chosen: fewest outstanding requests first, then table order.
func (r *GatewayRouter) rankFallbacks(chosen string) []string {
	slices.SortStableFunc(r.spare, func(a, b spare) int { return a.outstanding - b.outstanding })
	var out []string
	for _, s := range r.spare {
		if len(out) == r.fallbacks {
			break
		}
		if s.name != chosen {
			out = append(out, r.eps[s.name])
		}
	}
	return out
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
