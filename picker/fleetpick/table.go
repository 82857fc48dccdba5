package fleetpick

import (
	"net/netip"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/picker"
)

// table is the picker's view of one fleet snapshot: each engine's
// "ip:port" endpoint, in canonical form. Immutable once built.
type table struct {
	st *fleet.State
	// eps maps an engine's base URL to its endpoint; an engine whose
	// address is not ip:port is absent, and bad says why.
	eps  map[string]endpoint
	byEP map[string]*fleet.Endpoint // endpoint to engine
	bad  map[string]string          // base URL to the reason
	// allIP lists the models all of whose replicas have endpoints.
	allIP map[string]bool
}

// endpoint is an engine's endpoint, canonical ("ip:port") and its
// address alone, for subset entries that name an address without a port.
type endpoint struct {
	ep, addr string
}

// tableOf returns the table of st, building it on the first pick after a
// reload.
func (r *Router) tableOf(st *fleet.State) *table {
	if t := r.table.Load(); t != nil && t.st == st {
		return t
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.table.Load(); t != nil && t.st == st {
		return t
	}
	t := &table{st: st, eps: map[string]endpoint{}, byEP: map[string]*fleet.Endpoint{}, bad: map[string]string{}, allIP: map[string]bool{}}
	for base, ep := range st.Endpoints {
		s, err := picker.EndpointOf(base)
		if err == nil {
			ap, perr := netip.ParseAddrPort(s)
			if perr == nil {
				pe := endpoint{ep: ap.String(), addr: ap.Addr().String()}
				t.eps[base] = pe
				t.byEP[pe.ep] = ep
				continue
			}
			err = perr
		}
		t.bad[base] = err.Error()
	}
	for _, name := range st.File.Names() {
		m := st.Models[name]
		if m == nil {
			continue
		}
		ok := true
		for _, rep := range m.Order {
			if m.PD != nil && m.PD.PrefillNames[rep] {
				continue // named to the sidecar, which resolves host names
			}
			ep := m.ByName[rep]
			if why, bad := t.bad[ep.Base]; bad {
				ok = false
				r.opts.Logger.Warn("picker: a replica's address is not ip:port, so the picker never picks it (Envoy's ORIGINAL_DST cluster connects to IP addresses only; write the engine's IP)",
					"model", name, "replica", rep, "address", ep.Base, "err", why)
			}
		}
		t.allIP[name] = ok
	}
	r.table.Store(t)
	return t
}

// endpointOf returns the endpoint of an engine's base URL.
func (t *table) endpointOf(base string) (string, error) {
	if pe, ok := t.eps[base]; ok {
		return pe.ep, nil
	}
	// An engine a reload added after this snapshot.
	s, err := picker.EndpointOf(base)
	if err != nil {
		return "", err
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", err
	}
	return ap.String(), nil
}

// allows reports whether the replica name of ms may be picked: its engine
// has an endpoint, within the subset hint (nil: any).
func (t *table) allows(ms *fleet.Model, sub picker.Subset, name string) bool {
	ep := ms.ByName[name]
	if ep == nil {
		return false
	}
	pe, ok := t.eps[ep.Base]
	if !ok {
		return false
	}
	if sub == nil {
		return true
	}
	for _, e := range sub { // canonical entries (picker.Subset)
		if e == pe.ep || e == pe.addr {
			return true
		}
	}
	return false
}
