package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
)

// The exact index: models with index exact route on a cache index that
// only their engines' KV events change (package kvevents), and key their
// requests from the engines' own tokens (internal/front/key.go).
//
// One Translator and one Subscriber serve every model for the Fleet's
// life, so an engine's state (its sequence number, its map of block
// hashes) survives reloads that do not concern it. Each state snapshot
// carries a kvTable: which engine, heard on which endpoint under which
// pod, updates which replicas of which models. An engine's events go to
// every replica that names it, in every model (a base model and its LoRA
// adapters configured as models of their own share the engine's cache),
// through kvSink, which looks the table up afresh for each event, so a
// reload redirects events at once.

// kvTable routes engines' events to replicas; part of a state snapshot,
// immutable once published.
type kvTable struct {
	sources map[string]*kvSource // by endpoint
	engines map[string]*kvEngine // by engine id (kvID)
	// byEndpoint lists the engines each engine address (of a replica)
	// receives events from, for resets on ejection.
	byEndpoint map[*Endpoint][]string
	// bind and connect are the endpoints to listen on and to dial.
	bind, connect []string
}

// kvSource is one ZMQ endpoint of events.
type kvSource struct {
	endpoint string
	bound    bool
	// single: a connect endpoint of one engine, whose messages need no
	// pod in their topic (plain vLLM leaves the topic empty).
	single bool
	// Who may publish on a bound endpoint (kvPolicy): the hosts of its
	// engines' replicas (hostnames true when some are names, looked up
	// when a connection's topic is checked) and the models'
	// kv_events_allow prefixes, which may publish any topic.
	hosts     map[netip.Addr]bool
	hostnames bool
	allow     []netip.Prefix
}

// kvEngine is one engine: the replicas its events update.
type kvEngine struct {
	id     string
	attach []kvAttach
	// model is the chain root of its events without a LoRA adapter: the
	// model of its replicas when they all belong to one, else "" (the
	// topic's model).
	model string
	bs    int
	// err says why the engine's events cannot be applied (two replicas of
	// one model answering to its pod, models disagreeing on the block
	// size); "" when they can.
	err string
	// hosts are the addresses its replicas' hosts name, names the hosts
	// that are names: a bound endpoint takes the engine's messages only
	// from these (or from the source's allow-list).
	hosts []netip.Addr
	names []string
	// replay is its replicas' kv_events_replay when they agree, else ""
	// (replay off); replayFrom the addresses its host names (none for a
	// host name or ipc://), which the replay endpoint must answer from.
	replay     string
	replayFrom []netip.Addr
	replays    map[string]bool // every kv_events_replay of its replicas, "" included
	// maxBlocks bounds the engine's map of block hashes: kvMapFactor
	// times its largest replica's capacity (cache_blocks, or the
	// gateway's default), or the Translator's default when a capacity is
	// unknown.
	maxBlocks int
}

// kvAttach is one replica an engine's events update.
type kvAttach struct {
	model, replica string
	gw             *gateway.Gateway
	ep             *Endpoint
	cacheBlocks    int
}

// kvID names an engine: its endpoint and the pod it is heard under (""
// on a single-engine connect endpoint). Both are printable and the
// endpoint has no space, so the id is unambiguous.
func kvID(endpoint, pod string) string { return endpoint + " " + pod }

// kvSourceOf is the endpoint of an engine id.
func kvSourceOf(id string) string { ep, _, _ := strings.Cut(id, " "); return ep }

// KVMapFactor is how many times its replica's capacity (cache_blocks) an
// engine's map of block hashes may hold: an engine announcing more has
// lost removals, or is not the engine, and is cleared (an overflow).
const KVMapFactor = 4

// hostAddrs returns the addresses a replica's host names: an IP address
// itself, localhost the loopback addresses; any other name is returned as
// name, to be looked up.
func hostAddrs(host string) (addrs []netip.Addr, name string) {
	if host == "" {
		return nil, ""
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.WithZone("").Unmap()}, ""
	}
	if strings.EqualFold(host, "localhost") {
		return []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}, ""
	}
	return nil, host
}

// buildKVTable builds the routing of events for the models of a state.
func buildKVTable(models map[string]*Model) *kvTable {
	t := &kvTable{sources: map[string]*kvSource{}, engines: map[string]*kvEngine{}, byEndpoint: map[*Endpoint][]string{}}
	type heard struct {
		a   kvAttach
		pod string // explicit pod, or ""
		// addrPod is the address's host:port, host its host alone.
		addrPod, host string
		bs            int
		replay        string // kv_events_replay
		engineHost    string // the host it must answer from
	}
	bySource := map[string][]heard{}
	names := make([]string, 0, len(models))
	for name := range models {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		m := models[name]
		if !m.Cfg.Exact() || m.Gateway == nil {
			continue
		}
		for _, r := range servedReplicas(m.Cfg) {
			gw := m.gatewayOf(r.Name)
			if gw == nil {
				continue // not reached: a pool without a gateway has no replicas
			}
			src, bound := r.KVEvents, false
			if src == "" {
				src, bound = m.Cfg.KVEventsBind, true
			}
			if t.sources[src] == nil {
				t.sources[src] = &kvSource{endpoint: src, bound: bound, hosts: map[netip.Addr]bool{}}
				if bound {
					t.bind = append(t.bind, src)
				} else {
					t.connect = append(t.connect, src)
				}
			}
			if bound {
				for _, a := range m.Cfg.KVEventsAllow {
					if p, err := config.ParseKVAllow(a); err == nil && !slices.Contains(t.sources[src].allow, p) {
						t.sources[src].allow = append(t.sources[src].allow, p)
					}
				}
			}
			cb := r.CacheBlocks
			if cb == 0 { // the gateway's default capacity
				for _, gr := range gw.Replicas() {
					if gr.Name == r.Name {
						cb = gr.CacheBlocks
					}
				}
			}
			h := heard{a: kvAttach{model: name, replica: r.Name, gw: gw, ep: m.ByName[r.Name], cacheBlocks: cb},
				pod: r.Pod, addrPod: config.AddressPod(r.Address), bs: m.Cfg.TokenBlockSize(), replay: r.KVEventsReplay}
			h.engineHost, _ = config.EngineHost(r)
			if u, err := url.Parse(NormalizeAddress(r.Address)); err == nil {
				h.host = u.Hostname()
			}
			bySource[src] = append(bySource[src], h)
		}
	}
	add := func(id string, h heard) {
		e := t.engines[id]
		if e == nil {
			e = &kvEngine{id: id, model: h.a.model, bs: h.bs}
			t.engines[id] = e
		}
		for _, a := range e.attach {
			// One engine may serve both pools of a disaggregated model (a
			// replica in each gateway), not two replicas of one gateway.
			if a.model == h.a.model && a.gw == h.a.gw && e.err == "" {
				e.err = fmt.Sprintf("replicas %q and %q of model %q both answer to this engine; give each its own pod", a.replica, h.a.replica, a.model)
			}
		}
		if e.model != h.a.model {
			e.model = ""
		}
		if e.bs != h.bs && e.err == "" {
			e.err = fmt.Sprintf("models %q and %q share the engine with block sizes %d and %d", e.attach[0].model, h.a.model, e.bs, h.bs)
		}
		e.attach = append(e.attach, h.a)
		if e.replays == nil {
			e.replays = map[string]bool{}
		}
		e.replays[h.replay] = true
		e.replay = ""
		if len(e.replays) == 1 {
			e.replay = h.replay
		}
		e.replayFrom = nil
		if e.replay != "" && strings.HasPrefix(e.replay, "tcp://") {
			e.replayFrom, _ = hostAddrs(h.engineHost)
		}
		switch {
		case h.a.cacheBlocks <= 0:
			e.maxBlocks = -1 // a replica of unknown capacity: the default
		case e.maxBlocks >= 0:
			e.maxBlocks = max(e.maxBlocks, KVMapFactor*h.a.cacheBlocks)
		}
		addrs, name := hostAddrs(h.host)
		for _, a := range addrs {
			if !slices.Contains(e.hosts, a) {
				e.hosts = append(e.hosts, a)
			}
			t.sources[kvSourceOf(id)].hosts[a] = true
		}
		if name != "" && !slices.Contains(e.names, name) {
			e.names = append(e.names, name)
			t.sources[kvSourceOf(id)].hostnames = true
		}
		if !slices.Contains(t.byEndpoint[h.a.ep], id) {
			t.byEndpoint[h.a.ep] = append(t.byEndpoint[h.a.ep], id)
		}
	}
	hostNames := map[string]string{} // engine id by host alone → by host:port
	for src, hs := range bySource {
		so := t.sources[src]
		if !so.bound {
			// One engine identity (its pod, else its address) on a dialled
			// endpoint: the endpoint alone names it, whatever its topic.
			ident := func(h heard) string { return cmp.Or(h.pod, h.addrPod) }
			so.single = true
			for _, h := range hs {
				so.single = so.single && ident(h) == ident(hs[0])
			}
		}
		if so.single {
			for _, h := range hs {
				add(kvID(src, ""), h)
			}
			continue
		}
		// A host alone names an engine when one engine of the source has
		// that host (POD_IP is a pod's IP, without the engine's port).
		pods := map[string]map[string]bool{} // host → address pods
		for _, h := range hs {
			if h.pod == "" && h.host != "" {
				if pods[h.host] == nil {
					pods[h.host] = map[string]bool{}
				}
				pods[h.host][h.addrPod] = true
			}
		}
		for _, h := range hs {
			if h.pod != "" {
				add(kvID(src, h.pod), h)
				continue
			}
			if h.addrPod != "" {
				add(kvID(src, h.addrPod), h)
			}
			if h.host != "" && h.host != h.addrPod && len(pods[h.host]) == 1 {
				if h.addrPod != "" {
					// The host alone is another name of the same engine:
					// one engine, one state in the Translator, whichever
					// name its topic uses.
					hostNames[kvID(src, h.host)] = kvID(src, h.addrPod)
				} else {
					add(kvID(src, h.host), h)
				}
			}
		}
	}
	for alias, id := range hostNames {
		if t.engines[alias] == nil { // a replica's explicit pod keeps its name
			t.engines[alias] = t.engines[id]
		}
	}
	return t
}

// kvRuntime is the Fleet's part of the exact index that outlives
// snapshots.
type kvRuntime struct {
	tr   *kvevents.Translator
	tok  kvevents.Tokenizer
	tc   *kvevents.CachedTokenizer // tok when it is the default; else nil
	http *kvevents.HTTPTokenizer   // tc's engine calls when tok is the default; else nil
	opts kvevents.Options

	mu   sync.Mutex
	sub  *kvevents.Subscriber // nil until an endpoint is wanted, and after Close
	subs map[string]bool      // endpoint → bound

	cmu      sync.Mutex
	counters map[string]*ExactCounters // by model
}

// ExactCounters count one model's keying, over the Fleet's life.
type ExactCounters struct {
	Tokenize, engineCalls, Errors atomic.Uint64
	Fallbacks                     [NumFallbacks]atomic.Uint64
}

// Reasons a request on the exact index is keyed without tokens.
const (
	FallbackTokenize    = iota // the tokenizer failed
	FallbackShort              // fewer tokens than a block
	FallbackUnsupported        // a prompt or field the gateway does not tokenize
	NumFallbacks
)

var FallbackNames = [NumFallbacks]string{"tokenize_error", "short_prompt", "unsupported"}

func (k *kvRuntime) countersOf(model string) *ExactCounters {
	k.cmu.Lock()
	defer k.cmu.Unlock()
	c := k.counters[model]
	if c == nil {
		c = &ExactCounters{}
		k.counters[model] = c
	}
	return c
}

// kvSink is the Index every engine's Target names: it applies an event of
// engine id to each replica the current snapshot attaches to it.
type kvSink struct{ s *Fleet }

var _ kvevents.Index = kvSink{}

// ApplyEvent implements kvevents.Index; replica is an engine id.
func (k kvSink) ApplyEvent(id string, ev gateway.CacheEvent) error {
	t := k.s.state.Load().KV
	e := t.engines[id]
	if e == nil || e.err != "" {
		return fmt.Errorf("%w: engine %q is no longer configured", gateway.ErrUnknownReplica, id)
	}
	applied := false
	var firstErr error
	for _, a := range e.attach {
		err := a.gw.ApplyEvent(a.replica, ev)
		switch {
		case err == nil:
			applied = true
		case errors.Is(err, gateway.ErrUnknownReplica):
			// A reload removed it after this snapshot was taken.
		case firstErr == nil:
			firstErr = err
		}
	}
	if firstErr == nil && !applied {
		return fmt.Errorf("%w: engine %q: its replicas are gone", gateway.ErrUnknownReplica, id)
	}
	return firstErr
}

// idOf returns the id of the engine a source's messages come from: its
// endpoint and, unless the endpoint has a single engine, its topic's pod.
func (t *kvTable) idOf(src kvevents.Source) (string, error) {
	so := t.sources[src.Endpoint]
	switch {
	case so == nil:
		return "", fmt.Errorf("endpoint %s is not configured", src.Endpoint)
	case so.single:
		return kvID(src.Endpoint, ""), nil
	case src.Pod == "":
		return "", fmt.Errorf("topic %q names no pod (kv@POD@MODEL), and endpoint %s serves several engines", src.Topic, src.Endpoint)
	}
	return kvID(src.Endpoint, src.Pod), nil
}

// resolveKV is the Translator's Resolver: the engine a message comes from,
// by its endpoint and its topic's pod.
func (s *Fleet) resolveKV(src kvevents.Source) (kvevents.Target, error) {
	t := s.state.Load().KV
	id, err := t.idOf(src)
	if err != nil {
		return kvevents.Target{}, err
	}
	pod := src.Pod
	e := t.engines[id]
	switch {
	case e == nil:
		return kvevents.Target{}, fmt.Errorf("no replica answers to pod %q on %s (set the replica's pod, or its address to the engine's POD_IP)", pod, src.Endpoint)
	case e.err != "":
		return kvevents.Target{}, errors.New(e.err)
	}
	// A topic that names a model must name one of the engine's: a topic
	// variant naming another is no source of this engine's events.
	if src.Model != "" && !t.modelOf(id, src.Model) {
		return kvevents.Target{}, fmt.Errorf("topic %q names model %q, which engine %q does not serve (its replicas: %s)",
			src.Topic, src.Model, pod, strings.Join(t.replicasOf(id), ", "))
	}
	model := e.model
	if model == "" {
		model = src.Model
	}
	if model == "" {
		return kvevents.Target{}, fmt.Errorf("the engine serves several models and its topic %q names none (want kv@POD@MODEL)", src.Topic)
	}
	return kvevents.Target{Index: kvSink{s}, Replica: e.id, Model: model, BlockSize: e.bs, MaxBlocks: max(e.maxBlocks, 0),
		Replay: e.replay, ReplayFrom: e.replayFrom}, nil
}

// subscriber returns the Subscriber, creating it if needed. k.mu held.
func (k *kvRuntime) subscriber() *kvevents.Subscriber {
	if k.sub == nil {
		k.sub = kvevents.NewSubscriber(k.tr, k.opts)
		k.subs = map[string]bool{}
	}
	return k.sub
}

// bindNew listens on the bind endpoints of t not listened on yet. On a
// failure it stops those it started and returns an error naming the
// model and field.
func (k *kvRuntime) bindNew(t *kvTable, models map[string]*Model) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var started []string
	for _, ep := range t.bind {
		if _, ok := k.subs[ep]; ok {
			continue
		}
		if _, err := k.subscriber().Bind(ep); err != nil {
			for _, done := range started {
				_ = k.sub.Unsubscribe(done)
				delete(k.subs, done)
			}
			field := "kv_events_bind"
			for name, m := range models {
				if m.Cfg.KVEventsBind == ep {
					field = "models." + name + ".kv_events_bind"
					break
				}
			}
			return nil, &config.FieldError{Field: field, Value: ep, Reason: "cannot listen: " + err.Error() + bindInUseHint(err, field)}
		}
		k.subs[ep] = true
		started = append(started, ep)
	}
	return started, nil
}

// sync connects to the connect endpoints of t not connected yet, and
// stops the endpoints t no longer names.
func (k *kvRuntime) sync(t *kvTable) {
	k.mu.Lock()
	defer k.mu.Unlock()
	want := map[string]bool{}
	for _, ep := range t.bind {
		want[ep] = true
	}
	for _, ep := range t.connect {
		want[ep] = false
	}
	for ep, bound := range k.subs {
		if b, ok := want[ep]; !ok || b != bound {
			_ = k.sub.Unsubscribe(ep)
			delete(k.subs, ep)
		}
	}
	for _, ep := range t.connect {
		if _, ok := k.subs[ep]; ok {
			continue
		}
		if err := k.subscriber().Connect(ep); err == nil { // endpoints were validated
			k.subs[ep] = false
		}
	}
	if k.sub != nil {
		k.sub.Reauthorize() // who may publish what follows the new table
	}
}

// kvPolicy binds a bound endpoint's publishers to the engines they claim
// to be (kvevents.SourcePolicy): a connection is accepted from the host of
// one of the endpoint's engines' replicas or from the endpoint's
// allow-list (kv_events_allow), and may publish an engine's topic only
// from that engine's replicas' hosts (or the allow-list). A Unix socket
// (ipc://) is trusted: its file's permissions decide who connects.
type kvPolicy struct {
	s *Fleet
	// lookup resolves a replica's host name; nil means the system's
	// resolver, with a timeout of kvLookupTimeout.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

var _ kvevents.SourcePolicy = kvPolicy{}

// kvLookupTimeout bounds the lookup of a replica's host name when a
// connection's topic is checked.
const kvLookupTimeout = 2 * time.Second

func (p kvPolicy) allowed(so *kvSource, remote netip.Addr) bool {
	for _, pr := range so.allow {
		if pr.Contains(remote) {
			return true
		}
	}
	return false
}

// AcceptConn implements kvevents.SourcePolicy.
func (p kvPolicy) AcceptConn(endpoint string, remote netip.Addr) error {
	if !remote.IsValid() {
		return nil
	}
	so := p.s.state.Load().KV.sources[endpoint]
	switch {
	case so == nil:
		return fmt.Errorf("endpoint %s is not configured", endpoint)
	case so.hosts[remote] || so.hostnames || p.allowed(so, remote):
		return nil
	}
	return fmt.Errorf("%s is neither a replica's host nor in kv_events_allow of %s", remote, endpoint)
}

var _ kvevents.ConnLimiter = kvPolicy{}

// MaxConnsFrom implements kvevents.ConnLimiter: two connections per
// engine of the endpoint at remote, and two more (an engine reconnects
// before its old connection is seen closed); the Subscriber's default
// for other addresses (kv_events_allow, engines named by host name).
func (p kvPolicy) MaxConnsFrom(endpoint string, remote netip.Addr) int {
	t := p.s.state.Load().KV
	engines := map[kvAttach]bool{} // an engine heard as pod and as host is one
	for id, e := range t.engines {
		if kvSourceOf(id) == endpoint && len(e.attach) > 0 && slices.Contains(e.hosts, remote) {
			engines[e.attach[0]] = true
		}
	}
	if len(engines) == 0 {
		return 0
	}
	return 2*len(engines) + 2
}

// AcceptTopic implements kvevents.SourcePolicy.
func (p kvPolicy) AcceptTopic(endpoint string, remote netip.Addr, topic []byte) error {
	if !remote.IsValid() {
		return nil
	}
	t := p.s.state.Load().KV
	so := t.sources[endpoint]
	if so == nil {
		return fmt.Errorf("endpoint %s is not configured", endpoint)
	}
	if p.allowed(so, remote) {
		return nil
	}
	src := kvevents.Source{Endpoint: endpoint, Topic: string(topic)}
	src.Pod, src.Model, _ = kvevents.ParseTopic(src.Topic)
	id, err := t.idOf(src)
	if err != nil {
		return err
	}
	e := t.engines[id]
	if e == nil {
		return fmt.Errorf("topic %q names no engine of %s", src.Topic, endpoint)
	}
	if slices.Contains(e.hosts, remote) {
		return nil
	}
	lookup := p.lookup
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	for _, name := range e.names {
		ctx, cancel := context.WithTimeout(context.Background(), kvLookupTimeout)
		addrs, _ := lookup(ctx, name)
		cancel()
		for _, a := range addrs {
			if a.Unmap() == remote {
				return nil
			}
		}
	}
	return fmt.Errorf("topic %q from %s: engine %q publishes from its replicas' hosts only", src.Topic, remote, src.Pod)
}

// endpoints returns the status of every endpoint listened on or dialled.
func (k *kvRuntime) endpoints() []kvevents.EndpointStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.sub == nil {
		return nil
	}
	return k.sub.Endpoints()
}

// close stops every endpoint; the next Apply subscribes again.
func (k *kvRuntime) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.sub != nil {
		_ = k.sub.Close()
		k.sub, k.subs = nil, nil
	}
}

// reconcile brings the Translator in line with a new table, once it is
// published: engines gone, or whose block size or chain root changed,
// are reset (their blocks leave every index and their state is
// forgotten; the gone ones leave the Translator, figures and all);
// replicas newly attached to an engine heard before (a model switched to
// the exact index, a rebuilt gateway, a replica whose address or
// capacity changed) get the blocks its index holds, which the engine
// will not announce again. Replicas an engine heard before no longer
// updates (the engine gone or refused, or the replica moved to another
// engine) lose their blocks, which none of its events would remove: the
// reset's own clear reaches only the replicas the new table attaches.
func (k *kvRuntime) reconcile(old, next *kvTable) {
	detach := map[string][]kvAttach{}
	for id, oe := range old.engines {
		if id != oe.id {
			continue // another name of the engine
		}
		ne := next.engines[id]
		for _, a := range oe.attach {
			if ne == nil || ne.err != "" || !slices.ContainsFunc(ne.attach, func(b kvAttach) bool { return b.gw == a.gw && b.replica == a.replica }) {
				detach[id] = append(detach[id], a)
			}
		}
	}
	if len(detach) > 0 {
		// With the engine's messages held back (Replay), so that none of
		// its events reaches the replica after it is cleared.
		k.tr.Replay(func(_ kvevents.Source, tg kvevents.Target) bool { return detach[tg.Replica] != nil },
			func(_ kvevents.Source, tg kvevents.Target, _ gateway.Key) {
				for _, a := range detach[tg.Replica] {
					_ = a.gw.ApplyEvent(a.replica, gateway.CacheEvent{Kind: gateway.AllCleared})
				}
			})
	}
	fill := map[string][]kvAttach{}
	for id, oe := range old.engines {
		ne := next.engines[id]
		if ne == nil {
			continue
		}
		for _, a := range ne.attach {
			if !slices.Contains(oe.attach, a) {
				fill[id] = append(fill[id], a)
			}
		}
	}
	// An engine a name no longer leads to (its host alone, now shared;
	// a pod now another replica's) is reset too, so that the Translator
	// resolves its sources afresh rather than send them on to it.
	moved := map[string]bool{}
	for name, oe := range old.engines {
		if ne := next.engines[name]; ne == nil || ne.id != oe.id {
			moved[oe.id] = true
		}
	}
	k.tr.Reset(func(src kvevents.Source, tg kvevents.Target) bool {
		ne := next.engines[tg.Replica]
		return ne == nil || moved[tg.Replica] || ne.err != "" || ne.bs != tg.BlockSize || cmp.Or(ne.model, src.Model) != tg.Model ||
			max(ne.maxBlocks, 0) != tg.MaxBlocks || ne.replay != tg.Replay
	})
	// Engines gone for good (pods replaced, each under a new id) leave the
	// Translator, figures and all: else they would fill its MaxEngines.
	k.tr.Remove(func(id string) bool { return next.engines[id] == nil })
	if len(fill) > 0 {
		k.tr.Replay(func(_ kvevents.Source, tg kvevents.Target) bool { return fill[tg.Replica] != nil },
			func(_ kvevents.Source, tg kvevents.Target, keys gateway.Key) {
				if len(keys) == 0 {
					return
				}
				for _, a := range fill[tg.Replica] {
					_ = a.gw.ApplyEvent(a.replica, gateway.CacheEvent{Kind: gateway.BlocksStored, Blocks: keys})
				}
			})
	}
}

// resetEngines resets the engines whose events reach replicas at ep: an
// engine ejected by the health checks may have lost its cache, and the
// index must not hold blocks it no longer has.
func (k *kvRuntime) resetEngines(t *kvTable, ep *Endpoint) int {
	ids := t.byEndpoint[ep]
	if len(ids) == 0 {
		return 0
	}
	return k.tr.Reset(func(_ kvevents.Source, tg kvevents.Target) bool { return slices.Contains(ids, tg.Replica) })
}

// replicasOf names, as model/replica, the replicas of an engine id in t.
func (t *kvTable) replicasOf(id string) []string {
	e := t.engines[id]
	if e == nil {
		return []string{}
	}
	out := make([]string, 0, len(e.attach))
	for _, a := range e.attach {
		out = append(out, a.model+"/"+a.replica)
	}
	return out
}

// modelOf reports whether engine id has a replica of model in t.
func (t *kvTable) modelOf(id, model string) bool {
	e := t.engines[id]
	if e == nil {
		return false
	}
	for _, a := range e.attach {
		if a.model == model {
			return true
		}
	}
	return false
}

// sourcesOf returns the endpoints model's events come from in t.
func (t *kvTable) sourcesOf(m config.Model) []string {
	var out []string
	for _, r := range servedReplicas(m) {
		ep := r.KVEvents
		if ep == "" {
			ep = m.KVEventsBind
		}
		if ep != "" && !slices.Contains(out, ep) {
			out = append(out, ep)
		}
	}
	slices.Sort(out)
	return out
}

// tokenizeBase is the HTTPTokenizer's base URL for model: a healthy
// replica of it, taken in turn.
func (s *Fleet) tokenizeBase(model string) (string, error) {
	m := s.state.Load().Models[model]
	if m == nil || len(m.Order) == 0 {
		return "", fmt.Errorf("model %q has no replicas", model)
	}
	n := uint64(len(m.Order))
	start := s.tokTurn.Add(1)
	for i := range n {
		ep := m.ByName[m.Order[(start+i)%n]]
		if ep != nil && ep.Health.Healthy() {
			return ep.Base, nil
		}
	}
	return "", fmt.Errorf("model %q has no healthy replica to tokenize on", model)
}

// countingTokenizer counts the calls that reach the engines, per model.
type countingTokenizer struct {
	inner kvevents.Tokenizer
	kv    *kvRuntime
}

func (c countingTokenizer) Tokenize(ctx context.Context, req kvevents.TokenizeRequest) ([]uint32, error) {
	c.kv.countersOf(req.Model).engineCalls.Add(1)
	return c.inner.Tokenize(ctx, req)
}
