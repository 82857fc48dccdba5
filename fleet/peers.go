package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/budget"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Peer sharing (docs/multi-gateway.md). Several gateway processes routing
// a model to the same replicas each count only the prefill they routed
// (gateway.Candidate.PendingPrefill). Each exposes that count per replica
// on its /metrics as metricPendingPrefill; a model's configured peers
// (config.Model.Peers) are scraped with the engines at every
// PeerScrapeInterval, and the sum of their counts for a replica is fed to the
// model's gateway as gateway.Load.PeerPrefill, which cache_aware adds to
// its own. This is the idea of Dynamo's router replica sync
// (DYN_ROUTER_REPLICA_SYNC, off by default; ai-dynamo/dynamo
// lib/llm/src/kv_router/sequence.rs at commit 0266c3e), where every router
// publishes each request's lifecycle events (added, prefill done, freed)
// to the other routers over its event plane, best effort. Here gateways
// exchange per-replica totals instead, pulled with the scrape the gateway
// already makes: no event plane, nothing lost to replay, at the cost of
// one scrape interval of staleness.

// MetricPendingPrefill is the gauge of a gateway's own pending prefill
// per replica, which its peers scrape.
const MetricPendingPrefill = "exa_gateway_pending_prefill_blocks"

// MetricInstance is the gauge naming a gateway process
// (Options.InstanceID) in its label "id": a gateway that scrapes a page
// with its own id has scraped itself.
const MetricInstance = "exa_gateway_instance_info"

// peerMetricsPath is what a peer scrape asks for: /metrics, only the two
// series it reads (promhttp's name[] filter), a page of a few hundred
// bytes a replica rather than the whole exposition.
var peerMetricsPath = "/metrics?" + url.Values{"name[]": {MetricPendingPrefill, MetricInstance}}.Encode()

// maxPeerTokenBytes bounds the peer token file.
const maxPeerTokenBytes = 4096

// peerTTL is how many scrape intervals a peer's last good counts are
// used for: a peer that stops answering stops counting after this long.
const peerTTL = 3

var (
	descPending = prometheus.NewDesc(MetricPendingPrefill,
		"Uncached prefix blocks this gateway routed to a replica whose first token has not come back (its own pending prefill, which its peers scrape), by model and replica.",
		[]string{"model", "replica"}, nil)
	descPeerPrefill = prometheus.NewDesc("exa_gateway_peer_prefill_blocks",
		"Pending prefill blocks the model's peers report at a replica, summed over the peers answering: what this gateway adds to its own, by model and replica.",
		[]string{"model", "replica"}, nil)
	descPeerUp = prometheus.NewDesc("exa_gateway_peer_up",
		"1 if the peer gateway's last /metrics scrape succeeded, 0 if not.", []string{"peer"}, nil)
	descPeerErrors = prometheus.NewDesc("exa_gateway_peer_scrape_errors_total",
		"Failed /metrics scrapes of a peer gateway (down, slow, refused, or a page that does not parse).", []string{"peer"}, nil)
	descInstance = prometheus.NewDesc(MetricInstance,
		"1, labelled with this gateway process's id: a peer that scrapes its own id ignores itself.", []string{"id"}, nil)
	descPeerSelf = prometheus.NewDesc("exa_gateway_peer_self",
		"1 if the peer's last page carried this gateway's own id (the peer is this gateway, and is ignored), 0 if not.", []string{"peer"}, nil)
	descPeerLookupErrors = prometheus.NewDesc("exa_gateway_peer_lookup_errors_total",
		"Failed DNS lookups of a dns+ peer entry (its last addresses are kept).", []string{"peer"}, nil)
	descPeerCapped = prometheus.NewDesc("exa_gateway_peer_capped_total",
		"Scrapes of a peer gateway in which it reported, at some replica, more pending prefill than the cap (beyond the least it reports, half this gateway's own pending prefill there, rounded up).", []string{"peer"}, nil)
)

// peerState is what the gateway knows of one peer.
type peerState struct {
	// counts maps model → replica → pending prefill blocks, from the last
	// good scrape at at.
	counts map[string]map[string]int
	at     time.Time
	up     bool
	// self: its last page carried this gateway's own id.
	self bool
	// id: the instance id its last good page carried ("" if none).
	id     string
	errors uint64
	capped uint64
}

// dnsEntry is what the gateway knows of one dns+ peer entry.
type dnsEntry struct {
	name    string    // the name's, for a dns+https entry: its addresses' TLS server name
	bases   []string  // the last addresses resolved, as base URLs
	looked  time.Time // when it was last looked up (tried)
	errors  uint64
	failing bool
}

// peerTable holds every configured peer's state, by normalised base URL,
// each dns+ entry's last resolution, by normalised entry, and the peer
// token. Safe for concurrent use; the zero value is empty.
type peerTable struct {
	mu    sync.Mutex
	peers map[string]*peerState
	dns   map[string]*dnsEntry
	token fileCache[[]byte] // the peer token (ReadPeerToken)
	tls   peerTLS
	// tokenFailing: the token file was last found unreadable (logged
	// once, by PeerToken).
	tokenFailing atomic.Bool
}

// ReadPeerToken reads a peer token file (Options.PeerTokenFile): its
// contents, white space around them trimmed, must be 1 to 4,096 bytes.
func ReadPeerToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peer token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPeerTokenBytes+1<<10))
	if err != nil {
		return nil, fmt.Errorf("peer token file %s: %w", path, err)
	}
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0:
		return nil, fmt.Errorf("peer token file %s: empty", path)
	case len(b) > maxPeerTokenBytes:
		return nil, fmt.Errorf("peer token file %s: over %d bytes", path, maxPeerTokenBytes)
	case bytes.ContainsAny(b, "\r\n\x00"):
		return nil, fmt.Errorf("peer token file %s: the token holds a line break or NUL", path)
	}
	return b, nil
}

// errPeerUnauthorized is the scrape error of a peer that answered 401.
var errPeerUnauthorized = errors.New("status 401: the peer wants a bearer token this gateway does not have (Options.PeerTokenFile)")

// peerFamilies are the families a peer scrape reads.
var peerFamilies = newFamilySet(MetricPendingPrefill, MetricInstance)

// parsePeerPending parses a gateway's /metrics page into its
// metricPendingPrefill counts: model → replica → blocks, each clamped to
// 0..MaxLoadCount (series without both labels are skipped, and so are
// those keep refuses when keep is not nil; one given twice is summed,
// clamped), and the id of its first MetricInstance series ("" if none).
// A page that does not parse is an error.
func parsePeerPending(r io.Reader, keep func(model, replica string) bool) (counts map[string]map[string]int, id string, err error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, "", err
	}
	for _, m := range fams[MetricInstance].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "id" && id == "" {
				id = l.GetValue()
			}
		}
	}
	out := map[string]map[string]int{}
	for _, m := range fams[MetricPendingPrefill].GetMetric() {
		var mod, rep string
		var hasM, hasR bool
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "model":
				mod, hasM = l.GetValue(), true
			case "replica":
				rep, hasR = l.GetValue(), true
			}
		}
		if !hasM || !hasR || (keep != nil && !keep(mod, rep)) {
			continue
		}
		if out[mod] == nil {
			out[mod] = map[string]int{}
		}
		out[mod][rep] = min(out[mod][rep]+loadCount(sampleValue(m)), MaxLoadCount)
	}
	return out, id, nil
}

// scrapePeer fetches and parses one peer's /metrics (parsePeerPending,
// keeping the counts keep accepts), sending token as a bearer token when
// it is not nil. Only the lines of the families read are parsed
// (filterFamilies), charged to b while the page is read.
func scrapePeer(ctx context.Context, client *http.Client, base string, token []byte, b *budget.Budget, keep func(model, replica string) bool) (map[string]map[string]int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+peerMetricsPath, nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	if token != nil {
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, "", errPeerUnauthorized
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, "", fmt.Errorf("status %d", resp.StatusCode)
	}
	h := budget.Hold{B: b}
	defer h.Release()
	c, id, err := parsePeerPending(filterFamilies(resp.Body, peerFamilies, &h), keep)
	if err != nil {
		return nil, "", fmt.Errorf("parse: %s", clipError(err))
	}
	return c, id, nil
}

// peerEntry returns a peer entry of a model's configuration normalised,
// and whether it is a dns+ entry (config.DNSPeerPrefix).
func peerEntry(p string) (string, bool) {
	if rest, ok := config.CutDNSPeer(p); ok {
		return config.DNSPeerPrefix + NormalizeAddress(rest), true
	}
	return NormalizeAddress(p), false
}

// peerEntries returns every model's peer entries, normalised: the base
// URLs, and the dns+ entries.
func (st *State) peerEntries() (bases, dns map[string]bool) {
	bases, dns = map[string]bool{}, map[string]bool{}
	for _, m := range st.Models {
		for _, p := range m.Cfg.Peers {
			if e, isDNS := peerEntry(p); isDNS {
				dns[e] = true
			} else {
				bases[e] = true
			}
		}
	}
	return bases, dns
}

// modelPeers returns the base URLs of m's peers: its entries, each dns+
// entry as the addresses it last resolved to, each base once. s.peers.mu
// is held.
func (s *Fleet) modelPeers(m *Model) []string {
	var out []string
	seen := map[string]bool{}
	add := func(b string) {
		if !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	for _, p := range m.Cfg.Peers {
		e, dns := peerEntry(p)
		if !dns {
			add(e)
			continue
		}
		if d := s.peers.dns[e]; d != nil {
			for _, b := range d.bases {
				add(b)
			}
		}
	}
	return out
}

// resolvePeers looks up every dns+ entry not looked up within the last
// ScrapeInterval (the engines' clock: the peers' own runs ten times
// faster, and a name's addresses change with pods, not requests), once,
// concurrently, within ctx, and records each entry's addresses as base
// URLs (at most config.MaxPeers, sorted): http://ADDRESS:PORT and the
// entry's path. An entry whose lookup fails keeps its last addresses, and
// is logged when it starts failing and when it resolves again. Entries no
// longer configured are dropped.
func (s *Fleet) resolvePeers(ctx context.Context, entries map[string]bool) {
	now := s.opts.Clock()
	s.peers.mu.Lock()
	if s.peers.dns == nil {
		s.peers.dns = map[string]*dnsEntry{}
	}
	for e := range s.peers.dns {
		if !entries[e] {
			delete(s.peers.dns, e)
		}
	}
	due := make([]string, 0, len(entries))
	for e := range entries {
		d := s.peers.dns[e]
		if d == nil {
			d = &dnsEntry{name: dnsServerName(e)}
			s.peers.dns[e] = d
		}
		if d.looked.IsZero() || now.Sub(d.looked) >= s.opts.ScrapeInterval || now.Before(d.looked) {
			d.looked = now
			due = append(due, e)
		}
	}
	s.peers.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bases, err := s.lookupPeers(ctx, e)
			s.peers.mu.Lock()
			d := s.peers.dns[e]
			if d == nil {
				s.peers.mu.Unlock()
				return
			}
			was := d.failing
			if err == nil {
				d.bases, d.failing = bases, false
			} else {
				d.errors++
				d.failing = true
			}
			s.peers.mu.Unlock()
			switch {
			case err != nil && !was:
				s.log.Warn("gateway: peer name does not resolve; keeping its last addresses", "peer", e, "err", err)
			case err == nil && was:
				s.log.Info("gateway: peer name resolves again", "peer", e, "addresses", len(bases))
			}
		}()
	}
	wg.Wait()
}

// dnsServerName returns the name of the dns+https entry e (normalised),
// which its addresses' certificates must name; "" for dns+http.
func dnsServerName(e string) string {
	rest, _ := config.CutDNSPeer(e)
	u, err := url.Parse(rest)
	if err != nil || u.Scheme != "https" {
		return ""
	}
	return u.Hostname()
}

// lookupPeers resolves the name of the dns+ entry e (normalised) into
// base URLs.
func (s *Fleet) lookupPeers(ctx context.Context, e string) ([]string, error) {
	rest, _ := config.CutDNSPeer(e)
	u, err := url.Parse(rest)
	if err != nil {
		return nil, err
	}
	addrs, err := s.opts.Resolver.LookupHost(ctx, u.Hostname())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			continue // a resolver's answer that is not an address
		}
		host := ip.String()
		if p := u.Port(); p != "" {
			host = net.JoinHostPort(host, p)
		} else if ip.Is6() {
			host = "[" + host + "]"
		}
		out = append(out, u.Scheme+"://"+host+strings.TrimRight(u.EscapedPath(), "/"))
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > config.MaxPeers {
		out = out[:config.MaxPeers]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no address for %q", u.Hostname())
	}
	return out, nil
}

// ScrapePeers scrapes every model's peer gateways once (scrapePeers), then
// feeds each replica's gateway the pending prefill they report there,
// capped (pushPeerPrefill). Run calls it every PeerScrapeInterval, in a loop
// of its own: a slow peer never delays the engines' scrapes.
func (s *Fleet) ScrapePeers(ctx context.Context) {
	s.scrapePeers(ctx)
	s.pushPeerPrefill()
}

// PeerTimeout bounds one round of peer scrapes: ProbeTimeout, at most
// one PeerScrapeInterval.
func (s *Fleet) PeerTimeout() time.Duration {
	return min(s.opts.ProbeTimeout, s.opts.PeerScrapeInterval)
}

// scrapePeers scrapes every configured peer once, concurrently, within
// peerTimeout, with the peer token when Options.PeerTokenFile is set. A
// peer that fails keeps its last counts until they expire (peerTTL scrape
// intervals) and is logged when it goes down and when it comes back.
func (s *Fleet) scrapePeers(ctx context.Context) {
	bases, dns := s.state.Load().peerEntries()
	if len(bases) == 0 && len(dns) == 0 && s.knownPeers() == 0 && s.knownDNS() == 0 {
		return
	}
	var token []byte
	if s.opts.PeerTokenFile != "" {
		token, _, _ = s.PeerToken() // an unreadable token is logged there
	}
	s.refreshPeerCA()
	names := map[string]string{} // base → TLS server name, of dns+https addresses
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.PeerTimeout())
	defer cancel()
	if len(dns) > 0 || s.knownDNS() > 0 {
		// Lookups get half the round: a slow resolver must not leave the
		// scrapes (static peers' too) no time at all.
		rctx, rcancel := context.WithTimeout(ctx, s.PeerTimeout()/2)
		s.resolvePeers(rctx, dns)
		rcancel()
		// An address is scraped once. Listed as a base URL too, it is
		// verified for its own host; reached under several dns+https
		// names, for the first of them in byte order, whatever order
		// the table gives.
		// bases holds the listed ones until the second pass.
		s.peers.mu.Lock()
		for _, d := range s.peers.dns {
			for _, b := range d.bases {
				if n, ok := names[b]; d.name != "" && !bases[b] && (!ok || d.name < n) {
					names[b] = d.name
				}
			}
		}
		for _, d := range s.peers.dns {
			for _, b := range d.bases {
				bases[b] = true
			}
		}
		s.peers.mu.Unlock()
	}
	s.peers.tls.keepOnly(names)
	s.peers.mu.Lock()
	if s.peers.peers == nil {
		s.peers.peers = map[string]*peerState{}
	}
	for b := range s.peers.peers {
		if !bases[b] {
			delete(s.peers.peers, b)
		}
	}
	for b := range bases {
		if s.peers.peers[b] == nil {
			s.peers.peers[b] = &peerState{up: true}
		}
	}
	s.peers.mu.Unlock()
	// A peer's counts are kept only at this gateway's own replicas of
	// models with peers: what else it reports is never read (peerPrefill),
	// and would cost memory for every peer.
	st := s.state.Load()
	keep := func(model, replica string) bool {
		m := st.Models[model]
		return m != nil && len(m.Cfg.Peers) > 0 && m.ByName[replica] != nil
	}
	var wg sync.WaitGroup
	for b := range bases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, id, err := scrapePeer(ctx, s.peerClient(b, names[b]), b, token, s.scrapeBudget, keep)
			self := err == nil && id == s.opts.InstanceID
			if self {
				c = nil // this gateway's own counts: never added to themselves
			}
			capped := err == nil && !self && s.overCap(c)
			now := s.opts.Clock()
			s.peers.mu.Lock()
			p := s.peers.peers[b]
			if p == nil { // dropped meanwhile
				s.peers.mu.Unlock()
				return
			}
			was, wasSelf := p.up, p.self
			if err == nil {
				p.counts, p.at, p.up, p.self, p.id = c, now, true, self, id
				if capped {
					p.capped++
				}
			} else if parent.Err() == nil {
				p.up = false
				p.errors++
			}
			up := p.up
			s.peers.mu.Unlock()
			if self && !wasSelf {
				s.log.Info("gateway: a peer is this gateway itself (its page carries this process's id); it is ignored", "peer", b)
			}
			switch {
			case was && !up:
				s.log.Warn("gateway: peer gateway not answering; its pending prefill is ignored once older than "+(peerTTL*s.opts.PeerScrapeInterval).String(), "peer", b, "err", err)
			case !was && up:
				s.log.Info("gateway: peer gateway answering again", "peer", b)
			}
		}()
	}
	wg.Wait()
}

// knownPeers returns how many peers the table holds.
func (s *Fleet) knownPeers() int {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	return len(s.peers.peers)
}

// knownDNS returns how many dns+ entries the table holds.
func (s *Fleet) knownDNS() int {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	return len(s.peers.dns)
}

// overCap reports whether counts, a peer's report, exceeds the cap
// (PeerCap) at any replica of a model that has peers.
func (s *Fleet) overCap(counts map[string]map[string]int) bool {
	for name, m := range s.state.Load().Models {
		report, ok := counts[name]
		if m.Gateway == nil || len(m.Cfg.Peers) == 0 || !ok {
			continue
		}
		own, least := m.ownMean(), m.leastByPool(report)
		for rep := range m.ByName {
			if c, ok := report[rep]; ok {
				g := m.gatewayOf(rep)
				l := least[g]
				if PeerCap(own[g], c, l) < c-l {
					return true
				}
			}
		}
	}
	return false
}

// ownMean returns this gateway's own pending prefill per replica of each
// of m's pools, the mean over the pool's replicas rounded up: what
// PeerCap caps a peer's report by.
func (m *Model) ownMean() map[*gateway.Gateway]int {
	own := map[*gateway.Gateway]int{}
	for _, g := range m.pools() {
		sum, n := 0, 0
		for _, r := range g.Replicas() {
			sum, n = sum+r.PendingPrefill, n+1
		}
		if n > 0 {
			own[g] = (sum + n - 1) / n
		}
	}
	return own
}

// pools returns m's gateways: its own, and its prefill pool's when it
// has one apart (gatewayOf says which serves a replica).
func (m *Model) pools() []*gateway.Gateway {
	var gws []*gateway.Gateway
	if m.Gateway != nil {
		gws = append(gws, m.Gateway)
	}
	if m.PD != nil && m.PD.Plan.Prefill != nil && m.PD.Plan.Prefill != m.Gateway {
		gws = append(gws, m.PD.Plan.Prefill)
	}
	return gws
}

// leastByPool returns the least count report gives at a replica of each
// of m's pools (0 for a replica it does not report).
func (m *Model) leastByPool(report map[string]int) map[*gateway.Gateway]int {
	least := map[*gateway.Gateway]int{}
	for rep := range m.ByName {
		g := m.gatewayOf(rep)
		if l, ok := least[g]; !ok || report[rep] < l {
			least[g] = report[rep]
		}
	}
	return least
}

// peerPrefill returns the pending prefill m's peers report at each of its
// replicas: the sum over its peers (modelPeers) whose last good scrape is
// at most peerTTL scrape intervals old, not this gateway itself, each
// peer's count capped (PeerCap) by this gateway's own mean pending
// prefill per replica of the pool (ownMean), clamped to 0..MaxLoadCount. It reads each pool's replicas once
// and each peer's report once: peers × replicas work.
func (s *Fleet) peerPrefill(m *Model) map[string]int {
	sums := make(map[string]int, len(m.ByName))
	if len(m.Cfg.Peers) == 0 {
		return sums
	}
	own := m.ownMean()
	oldest := s.opts.Clock().Add(-peerTTL * s.opts.PeerScrapeInterval)
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	ids := map[string]bool{}
	for _, b := range s.modelPeers(m) {
		p := s.peers.peers[b]
		if p == nil || p.self || p.counts == nil || p.at.Before(oldest) || ids[p.id] {
			continue
		}
		if p.id != "" {
			ids[p.id] = true // one gateway under two addresses counts once
		}
		report := p.counts[m.Name]
		least := m.leastByPool(report)
		for name := range m.ByName {
			g := m.gatewayOf(name)
			sums[name] = min(sums[name]+PeerCap(own[g], report[name], least[g]), MaxLoadCount)
		}
	}
	return sums
}

// roundPeers is the peers' counts of one round of engine scrapes: each
// model's (peerPrefill) computed once, when a scrape first needs it.
// Safe for concurrent use.
type roundPeers struct {
	s    *Fleet
	mu   sync.Mutex
	sums map[*Model]map[string]int
}

// at returns the peers' count at m's replica name.
func (r *roundPeers) at(m *Model, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.sums[m]
	if !ok {
		if r.sums == nil {
			r.sums = map[*Model]map[string]int{}
		}
		p = r.s.peerPrefill(m)
		r.sums[m] = p
	}
	return p[name]
}

// pushPeerPrefill feeds every replica's gateway its endpoint's last load
// with the peers' current pending prefill; the load keeps the time it was
// scraped (Load.At), so a replica whose scrapes fail still goes stale. A
// replica not yet scraped gets its peers' counts with its first scrape.
func (s *Fleet) pushPeerPrefill() {
	for _, m := range s.state.Load().Models {
		if m.Gateway == nil || len(m.Cfg.Peers) == 0 {
			continue
		}
		peers := s.peerPrefill(m)
		for name, ep := range m.ByName {
			ep.feed.Lock()
			l, ok, _, _ := ep.SnapshotLoad()
			if !ok {
				ep.feed.Unlock()
				continue
			}
			l.PeerPrefill = peers[name]
			err := m.gatewayOf(name).UpdateLoad(name, l)
			ep.feed.Unlock()
			if err != nil {
				s.log.Warn("gateway: load update rejected", "model", m.Name, "replica", name, "err", err)
			}
		}
	}
}

// peerCollector exports each model's own and peers' pending prefill per
// replica, and each peer's scrape state.
type peerCollector struct{ s *Fleet }

var _ prometheus.Collector = peerCollector{}

// Describe implements prometheus.Collector.
func (c peerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInstance, descPending, descPeerPrefill, descPeerUp, descPeerSelf, descPeerErrors, descPeerCapped, descPeerLookupErrors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c peerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(descInstance, prometheus.GaugeValue, 1, s.opts.InstanceID)
	for name, m := range s.state.Load().Models {
		for _, g := range m.pools() {
			for _, r := range g.Replicas() {
				ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(r.PendingPrefill), name, r.Name)
				if len(m.Cfg.Peers) > 0 {
					ch <- prometheus.MustNewConstMetric(descPeerPrefill, prometheus.GaugeValue, float64(r.Load.PeerPrefill), name, r.Name)
				}
			}
		}
	}
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	for b, p := range s.peers.peers {
		up := 0.0
		if p.up && (p.counts != nil || p.self) {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descPeerUp, prometheus.GaugeValue, up, b)
		self := 0.0
		if p.self {
			self = 1
		}
		ch <- prometheus.MustNewConstMetric(descPeerSelf, prometheus.GaugeValue, self, b)
		ch <- prometheus.MustNewConstMetric(descPeerErrors, prometheus.CounterValue, float64(p.errors), b)
		ch <- prometheus.MustNewConstMetric(descPeerCapped, prometheus.CounterValue, float64(p.capped), b)
	}
	for e, d := range s.peers.dns {
		ch <- prometheus.MustNewConstMetric(descPeerLookupErrors, prometheus.CounterValue, float64(d.errors), e)
	}
}
