package httpgw

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peerRig is two gateway processes, A and B, in front of the same two
// fake engines, each configured with the other as its peer.
type peerRig struct {
	a, b       *Server
	aReg, bReg *prometheus.Registry
	aHTTP      *httptest.Server
	bHTTP      *httptest.Server
	mu         sync.Mutex
	now        time.Time
}

func (r *peerRig) clock() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now
}

func (r *peerRig) advance(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now = r.now.Add(d)
}

func engineMetrics(t *testing.T) string {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")
	}))
	t.Cleanup(e.Close)
	return e.URL
}

// newPeerRig builds A and B; extraB are more peers of B.
func newPeerRig(t *testing.T, extraB ...string) *peerRig {
	r := &peerRig{now: time.Unix(1e9, 0)}
	reps := []config.Replica{{Name: "r0", Address: engineMetrics(t)}, {Name: "r1", Address: engineMetrics(t)}}
	mk := func(reg **prometheus.Registry) (*Server, *httptest.Server) {
		*reg = prometheus.NewRegistry()
		s, err := New(Options{Registerer: *reg, Gatherer: *reg, Logger: quietLogger(), Clock: r.clock, Fleet: fleet.Options{ScrapeInterval: time.Second, PeerScrapeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond}, GatewayOptions: []gateway.Option{gateway.WithClock(r.clock)}})
		require.NoError(t, err)
		h := httptest.NewServer(s)
		t.Cleanup(h.Close)
		return s, h
	}
	r.a, r.aHTTP = mk(&r.aReg)
	r.b, r.bHTTP = mk(&r.bReg)
	apply := func(s *Server, peers ...string) {
		require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{
			testModel: {Mode: gateway.ModeCacheAware, Replicas: reps, Peers: peers},
			"other":   {Mode: gateway.ModeCacheAware, Replicas: reps},
		}}))
	}
	apply(r.a, r.bHTTP.URL)
	apply(r.b, append([]string{r.aHTTP.URL}, extraB...)...)
	return r
}

func peerLoad(t *testing.T, s *Server, model string) map[string]int {
	out := map[string]int{}
	for _, st := range s.Snapshot().Models[model].Gateway.Replicas() {
		out[st.Name] = st.Load.PeerPrefill
	}
	return out
}

// busy gives s's model own pending prefill of blocks at each of its
// replicas (one request of that many blocks each, never done): a gateway
// hears a peer only up to half its own pending prefill at a replica
// (fleet.PeerCap). seed keeps the keys apart.
func busy(t *testing.T, s *Server, model string, blocks int, seed uint64) {
	t.Helper()
	gw := s.Snapshot().Models[model].Gateway
	for i := range gw.Replicas() {
		key := make(gateway.Key, blocks)
		for j := range key {
			key[j] = seed<<32 + uint64(i*1000+j+1)
		}
		_, err := gw.Route(key)
		require.NoError(t, err)
	}
	for _, r := range gw.Replicas() {
		require.Equal(t, blocks, r.PendingPrefill, r.Name)
	}
}

// Gateway B scrapes A's /metrics, whose pending-prefill gauge reports
// what A routed and is still waiting on, and routes around it. Both
// carry traffic, 40 blocks at each replica: B takes what A reports at a
// replica beyond the least it reports anywhere, up to half B's own there
// (fleet.PeerCap).
func TestPeersShareTheirPendingPrefill(t *testing.T) {
	r := newPeerRig(t)
	ctx := context.Background()
	busy(t, r.a, testModel, 40, 1)
	busy(t, r.b, testModel, 40, 2)
	gwA := r.a.Snapshot().Models[testModel].Gateway
	d, err := gwA.Route(gateway.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	require.NoError(t, err)
	require.Equal(t, "r0", d.Replica, "the first of two equally loaded replicas")

	page := metricsPage(t, r.aHTTP.URL)
	assert.Contains(t, page, `exa_gateway_pending_prefill_blocks{model="m1",replica="r0"} 50`)
	assert.Contains(t, page, `exa_gateway_pending_prefill_blocks{model="m1",replica="r1"} 40`)
	assert.Contains(t, page, `exa_gateway_pending_prefill_blocks{model="other",replica="r0"} 0`)

	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, r.b, testModel))
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, r.b, "other"), "a model without peers")
	page = metricsPage(t, r.bHTTP.URL)
	assert.Contains(t, page, `exa_gateway_peer_prefill_blocks{model="m1",replica="r0"} 10`)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, r.aHTTP.URL))
	assert.Contains(t, page, `exa_gateway_pending_prefill_blocks{model="m1",replica="r0"} 40`, "B's own count stays its own")
	assert.NotContains(t, page, `exa_gateway_peer_prefill_blocks{model="other"`)

	// B sends a new prompt where A's prefill is not queued; without the
	// peer it would take r0, the first of two idle replicas (as "other"
	// does).
	dB, err := r.b.Snapshot().Models[testModel].Gateway.Route(gateway.Key{20, 21, 22})
	require.NoError(t, err)
	assert.Equal(t, "r1", dB.Replica)
	dO, err := r.b.Snapshot().Models["other"].Gateway.Route(gateway.Key{20, 21, 22})
	require.NoError(t, err)
	assert.Equal(t, "r0", dO.Replica)

	// A's first token comes back: the next scrape clears it at B.
	d.Done(gateway.DoneInfo{})
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, r.b, testModel))

	// And A sees B's prefill (3 blocks at r1) the same way.
	r.a.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 3}, peerLoad(t, r.a, testModel))
}

// A peer that is down, slow or serving garbage is skipped without
// holding up the others; its last counts expire after 3 scrape
// intervals.
func TestPeersDownSlowAndStale(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-release:
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "exa_gateway_pending_prefill_blocks{model=\"m1\" 77\n")
	}))
	t.Cleanup(garbage.Close)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	r := newPeerRig(t, slow.URL, garbage.URL, deadURL)
	ctx := context.Background()
	busy(t, r.b, testModel, 40, 2)
	_, err := r.a.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2, 3, 4})
	require.NoError(t, err)
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 4, "r1": 0}, peerLoad(t, r.b, testModel), "A counts; the others are skipped")
	page := metricsPage(t, r.bHTTP.URL)
	for _, p := range []string{slow.URL, garbage.URL, deadURL} {
		assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 0`, p))
		assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_scrape_errors_total{peer=%q} 1`, p))
	}

	// A goes down: its counts are kept for 3 scrape intervals (3 s here)...
	r.aHTTP.Close()
	r.advance(2 * time.Second)
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 4, "r1": 0}, peerLoad(t, r.b, testModel))
	assert.Contains(t, metricsPage(t, r.bHTTP.URL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 0`, r.aHTTP.URL))
	// ... and no longer.
	r.advance(time.Second + time.Nanosecond)
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, r.b, testModel))
}

// A reload that drops a model's peers stops counting them at once and
// forgets the peer.
func TestPeersReload(t *testing.T) {
	r := newPeerRig(t)
	ctx := context.Background()
	busy(t, r.b, testModel, 40, 2)
	_, err := r.a.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2})
	require.NoError(t, err)
	r.b.ScrapeAll(ctx)
	require.Equal(t, 2, peerLoad(t, r.b, testModel)["r0"])
	f := r.b.Snapshot().File.Clone()
	m := f.Models[testModel]
	m.Peers = nil
	f.Models[testModel] = m
	require.NoError(t, r.b.Apply(f))
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, r.b, testModel))
	assert.NotContains(t, metricsPage(t, r.bHTTP.URL), "exa_gateway_peer_up")
}

func metricsPage(t *testing.T, base string) string {
	t.Helper()
	// Over TLS the gateway's certificate is not checked.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// A gateway listed among its own peers finds its own id on the page and
// ignores itself: its own pending prefill is not added to itself.
func TestPeerListedItselfIsIgnored(t *testing.T) {
	r := newPeerRig(t)
	ctx := context.Background()
	f := r.a.Snapshot().File.Clone()
	m := f.Models[testModel]
	m.Peers = []string{r.aHTTP.URL, r.bHTTP.URL}
	f.Models[testModel] = m
	require.NoError(t, r.a.Apply(f))
	busy(t, r.a, testModel, 40, 1)
	busy(t, r.b, testModel, 40, 2)
	_, err := r.a.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	require.NoError(t, err)
	// A: 50 pending at r0, 40 at r1; counted as its own peer, A would
	// hear 10 more at r0.
	r.a.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, r.a, testModel))
	page := metricsPage(t, r.aHTTP.URL)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 1`, r.aHTTP.URL))
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 0`, r.bHTTP.URL))
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_instance_info{id=%q} 1`, r.a.Options().InstanceID))
	// B still hears A.
	r.b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, r.b, testModel))
}

// fakeResolver answers LookupHost from a table it holds, or fails.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string
}

func (f *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if a, ok := f.hosts[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeResolver) set(host string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if addrs == nil {
		delete(f.hosts, host)
		return
	}
	f.hosts[host] = addrs
}

// twoAddressesOnePort returns two listeners on one port, at 127.0.0.1 and
// 127.0.0.2 (skipping the test where there is no 127.0.0.2).
func twoAddressesOnePort(t *testing.T) (la, lb net.Listener) {
	t.Helper()
	for try := 0; la == nil; try++ {
		var err error
		lb, err = net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("no 127.0.0.2 here: %v", err)
		}
		port := lb.Addr().(*net.TCPAddr).Port
		if la, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
			lb.Close()
			require.Less(t, try, 20, "no free port at both addresses")
		}
	}
	return la, lb
}

// dnsPeerGateway is a gateway of these tests' clocks (scrapes every
// second, probes cut at 500 ms) with fo, serving on l (not at all when l
// is nil; over TLS with cfg when it is not nil, without keep-alive, so
// that each scrape handshakes anew), its model's replicas reps and its
// one peer entry.
func dnsPeerGateway(t *testing.T, l net.Listener, cfg *tls.Config, clock func() time.Time, fo fleet.Options, reps []config.Replica, entry string) *Server {
	t.Helper()
	fo.ScrapeInterval, fo.PeerScrapeInterval, fo.ProbeTimeout = time.Second, time.Second, 500*time.Millisecond
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Clock: clock, Fleet: fo})
	require.NoError(t, err)
	if l != nil {
		h := httptest.NewUnstartedServer(s)
		h.Listener.Close()
		h.Listener = l
		if cfg == nil {
			h.Start()
		} else {
			h.TLS = cfg
			h.Config.SetKeepAlivesEnabled(false)
			h.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
			h.StartTLS()
		}
		t.Cleanup(h.Close)
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Mode: gateway.ModeCacheAware, Replicas: reps, Peers: []string{entry}},
	}}))
	return s
}

// Two gateways share one peer list, a name that resolves to both (as a
// Kubernetes headless Service resolves to its ready pods): each ignores
// itself and hears the other. A failed lookup keeps the last addresses; a
// gateway gone from the name is no longer heard at the next scrape.
func TestPeersByDNS(t *testing.T) {
	la, lb := twoAddressesOnePort(t)
	port := la.Addr().(*net.TCPAddr).Port
	res := &fakeResolver{hosts: map[string][]string{"gw-peers.test": {"127.0.0.2", "127.0.0.1"}}}
	var now atomic.Int64 // the clock, in ns
	now.Store(1e18)
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	reps := []config.Replica{{Name: "r0", Address: engineMetrics(t)}, {Name: "r1", Address: engineMetrics(t)}}
	mk := func(l net.Listener) *Server {
		return dnsPeerGateway(t, l, nil, clock, fleet.Options{Resolver: res}, reps, fmt.Sprintf("dns+http://gw-peers.test:%d", port))
	}
	a, b := mk(la), mk(lb)
	aURL, bURL := fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.2:%d", port)
	ctx := context.Background()
	busy(t, a, testModel, 40, 1)
	busy(t, b, testModel, 40, 2)
	_, err := a.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	require.NoError(t, err)
	_, err = b.Snapshot().Models[testModel].Gateway.Route(gateway.Key{11, 12, 13})
	require.NoError(t, err)
	a.ScrapeAll(ctx)
	b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 3, "r1": 0}, peerLoad(t, a, testModel), "A hears B, not itself")
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, b, testModel), "B hears A, not itself")
	page := metricsPage(t, aURL)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 1`, aURL))
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, bURL))

	// Within a scrape interval the name is not looked up again.
	res.set("gw-peers.test")
	b.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, bURL), fmt.Sprintf(`exa_gateway_peer_lookup_errors_total{peer="dns+http://gw-peers.test:%d"} 0`, port))
	// A scrape interval later the name no longer resolves: the last
	// addresses are kept.
	now.Add(int64(time.Second))
	b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, b, testModel))
	entry := fmt.Sprintf("dns+http://gw-peers.test:%d", port)
	assert.Contains(t, metricsPage(t, bURL), fmt.Sprintf(`exa_gateway_peer_lookup_errors_total{peer=%q} 1`, entry))

	// A leaves the name: B stops hearing it at the next lookup.
	res.set("gw-peers.test", "127.0.0.2")
	now.Add(int64(time.Second))
	b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, b, testModel))
	assert.NotContains(t, metricsPage(t, bURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q}`, aURL))
}

// A gateway that scraped itself is up; one gateway reached under two
// addresses (a static entry and a dns+ name) counts once; a slow resolver
// leaves the static peers' scrapes their time; a dns+ entry that never
// resolved leaves no series once it is removed.
func TestPeersSelfUpOnceEachAndSlowDNS(t *testing.T) {
	r := newPeerRig(t)
	ctx := context.Background()
	port := r.bHTTP.Listener.Addr().(*net.TCPAddr).Port
	res := &blockingResolver{hosts: map[string][]string{"gw-b.test": {"127.0.0.1"}}}
	reg := prometheus.NewRegistry()
	c, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Clock: r.clock,
		Fleet: fleet.Options{ScrapeInterval: time.Second, PeerScrapeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, Resolver: res}})
	require.NoError(t, err)
	cHTTP := httptest.NewServer(c)
	t.Cleanup(cHTTP.Close)
	reps := r.a.Snapshot().File.Models[testModel].Replicas
	apply := func(peers ...string) {
		require.NoError(t, c.Apply(&config.File{Version: 1, Models: map[string]config.Model{
			testModel: {Mode: gateway.ModeCacheAware, Replicas: reps, Peers: peers}}}))
	}
	// B as http://localhost:PORT and as dns+ of a name resolving to
	// 127.0.0.1, and C itself: B's 10 blocks are heard once, and C's own
	// address is up.
	apply(fmt.Sprintf("http://localhost:%d", port), fmt.Sprintf("dns+http://gw-b.test:%d", port), cHTTP.URL)
	busy(t, c, testModel, 40, 3)
	busy(t, r.b, testModel, 40, 2)
	_, err = r.b.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	require.NoError(t, err)
	c.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, c, testModel))
	page := metricsPage(t, cHTTP.URL)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, cHTTP.URL), "a gateway that scraped itself is up")
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 1`, cHTTP.URL))

	// A resolver that answers only when the round is over: B, a static
	// peer, is still scraped.
	res.block("slow.test")
	apply(r.bHTTP.URL, "dns+http://slow.test:8080")
	c.ScrapeAll(ctx)
	page = metricsPage(t, cHTTP.URL)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_scrape_errors_total{peer=%q} 0`, r.bHTTP.URL))
	assert.Contains(t, page, `exa_gateway_peer_lookup_errors_total{peer="dns+http://slow.test:8080"} 1`)

	// A dns+ entry that never resolved, then no peers: its series goes.
	apply("dns+http://gone.test:8080")
	c.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, cHTTP.URL), `exa_gateway_peer_lookup_errors_total{peer="dns+http://gone.test:8080"} 1`)
	apply()
	c.ScrapeAll(ctx)
	assert.NotContains(t, metricsPage(t, cHTTP.URL), "exa_gateway_peer_lookup_errors_total")
}

// blockingResolver answers from its table, blocks on the names it was
// told to until the lookup's context ends, and fails the rest.
type blockingResolver struct {
	mu      sync.Mutex
	hosts   map[string][]string
	blocked map[string]bool
}

func (b *blockingResolver) block(host string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.blocked == nil {
		b.blocked = map[string]bool{}
	}
	b.blocked[host] = true
}

func (b *blockingResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	b.mu.Lock()
	a, ok := b.hosts[host]
	blocked := b.blocked[host]
	b.mu.Unlock()
	switch {
	case blocked:
		<-ctx.Done()
		return nil, ctx.Err()
	case ok:
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// A peer scrape asks /metrics for the two series it reads (promhttp's
// name[] filter): the page carries them and nothing else.
func TestPeerScrapeAsksForTwoSeries(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	r := newPeerRig(t)
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		asked = append(asked, req.URL.RequestURI())
		mu.Unlock()
		r.a.ServeHTTP(w, req)
	}))
	t.Cleanup(spy.Close)
	f := r.b.Snapshot().File.Clone()
	m := f.Models[testModel]
	m.Peers = []string{spy.URL}
	f.Models[testModel] = m
	require.NoError(t, r.b.Apply(f))
	r.b.ScrapeAll(context.Background())
	mu.Lock()
	require.Len(t, asked, 1)
	uri := asked[0]
	mu.Unlock()
	assert.Equal(t, "/metrics?name%5B%5D=exa_gateway_pending_prefill_blocks&name%5B%5D=exa_gateway_instance_info", uri)
	resp, err := http.Get(r.aHTTP.URL + uri)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	page := string(body)
	full := metricsPage(t, r.aHTTP.URL)
	assert.Contains(t, page, `exa_gateway_pending_prefill_blocks{model="m1",replica="r0"}`)
	assert.Contains(t, page, "exa_gateway_instance_info{")
	assert.NotContains(t, page, "exa_gateway_in_flight_requests")
	t.Logf("peer page %d bytes, whole /metrics %d bytes", len(page), len(full))
}

// BenchmarkPeerPage is what one peer scrape costs the gateway scraped:
// /metrics for a model of 16 replicas with a pending count at each,
// filtered to the two series a peer reads ("peer") or whole ("whole").
// A gateway with G-1 peers serves G-1 of these every
// --peer-scrape-interval.
func BenchmarkPeerPage(b *testing.B) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Fleet: fleet.Options{ScrapeInterval: time.Hour}})
	require.NoError(b, err)
	reps := make([]config.Replica, 16)
	for i := range reps {
		reps[i] = config.Replica{Name: fmt.Sprint("r", i), Address: fmt.Sprintf("http://127.0.0.1:%d", 20000+i)}
	}
	require.NoError(b, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	gw := s.Snapshot().Models[testModel].Gateway
	for i := range 64 {
		_, err := gw.Route(gateway.Key{uint64(i + 1), uint64(i + 2)})
		require.NoError(b, err)
	}
	for _, tc := range []struct{ name, uri string }{
		{"peer", "/metrics?name%5B%5D=exa_gateway_pending_prefill_blocks&name%5B%5D=exa_gateway_instance_info"},
		{"whole", "/metrics"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, tc.uri, nil)
			b.ReportAllocs()
			var n int
			for b.Loop() {
				w := httptest.NewRecorder()
				s.ServeHTTP(w, req)
				n = w.Body.Len()
			}
			b.ReportMetric(float64(n), "page-bytes")
		})
	}
}

// The peers' counts, passed on between the engines' scrapes, keep each
// engine's load as old as its last scrape: a replica whose scrapes
// stopped still goes stale for --shed-staleness.
func TestPeerPushKeepsLoadAge(t *testing.T) {
	r := newPeerRig(t)
	ctx := context.Background()
	r.a.ScrapeAll(ctx) // the engines' load, at the rig's time
	r.advance(2 * time.Second)
	gw := r.a.Snapshot().Models[testModel].Gateway
	r.a.ScrapePeers(ctx)                                                 // B's counts pushed to r0 and r1
	require.NoError(t, gw.UpdateLoad("r1", gateway.Load{QueueDepth: 5})) // fresh, no room
	adm := gateway.Admission{QueueDepth: 1, Staleness: 500 * time.Millisecond}
	assert.True(t, gw.Saturated(gateway.Target{}, adm), "r0's load is 2 s old: no room; r1 full")
}

// The fleet stamps each scraped load with its clock (Load.At) and gives
// the gateways the same clock, so an injected clock ages loads as it
// stamps them: a load just scraped is fresh, and admission sheds on it.
func TestLoadAtClockDomain(t *testing.T) {
	busyEngine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "vllm:num_requests_waiting 9\nvllm:num_requests_running 0\n")
	}))
	t.Cleanup(busyEngine.Close)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Clock: func() time.Time { return time.Unix(1e9, 0) }})
	require.NoError(t, err)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "r0", Address: busyEngine.URL}}}}}))
	s.ScrapeAll(context.Background())
	gw := s.Snapshot().Models[testModel].Gateway
	assert.True(t, gw.Saturated(gateway.Target{}, gateway.Admission{QueueDepth: 1, Staleness: time.Minute}), "9 waiting, scraped now: no room")
}
