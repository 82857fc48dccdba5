package kvevents

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/examlops/gateway"
)

// Index is what a Translator updates: a gateway's cache index.
// *gateway.Gateway implements it.
type Index interface {
	ApplyEvent(replica string, ev gateway.CacheEvent) error
}

var _ Index = (*gateway.Gateway)(nil)

// Source is where messages come from: the endpoint they arrived on and
// their topic, which llm-d deployments set to kv@<pod>@<model> (Pod and
// Model are parsed from it, empty for any other topic) and plain vLLM
// leaves empty, so that the endpoint alone names the engine.
type Source struct {
	Endpoint, Topic string
	Pod, Model      string
}

// Target is where a source's events go.
type Target struct {
	// Index and Replica receive the events; both required.
	Index   Index
	Replica string
	// Model is the name keys chain from for events without a LoRA
	// adapter: the model name requests use. Empty means Source.Model;
	// a source with neither is refused (counted Unresolved).
	Model string
	// BlockSize is the number of tokens per block requests are keyed
	// with; events of another block size are dropped. Zero means
	// DefaultBlockSize.
	BlockSize int
	// MaxBlocks bounds how many engine block hashes are remembered for
	// the engine (see Translator). Zero means DefaultMaxMapped.
	MaxBlocks int
	// Replay is the engine's replay endpoint (tcp://HOST:PORT or
	// ipc://PATH; vLLM's replay_endpoint), asked for the batches of a
	// sequence gap when the Translator has SetReplay. "" means none: a
	// gap clears the engine.
	Replay string
	// ReplayFrom, when not empty, lists the addresses the replay endpoint
	// must answer from (the engine's host): a connection from any other
	// is refused and the gap clears the engine.
	ReplayFrom []netip.Addr
}

// Defaults of Target.
const (
	// DefaultBlockSize is vLLM's default KV block size, in tokens.
	DefaultBlockSize = 16
	// DefaultMaxMapped is the default bound of an engine's hash map:
	// 1<<20 blocks (16M tokens at 16 a block), about 40 MiB at most.
	DefaultMaxMapped = 1 << 20
)

// Resolver maps a source to its target, or returns an error if the
// source is not one of the gateway's engines (its messages are then
// counted as unresolved and dropped). It is called once per engine, again
// after Reset, and must be safe for concurrent use.
type Resolver func(Source) (Target, error)

// ParseTopic splits a kv@<pod>@<model> topic; ok is false for any other.
func ParseTopic(topic string) (pod, model string, ok bool) {
	rest, found := strings.CutPrefix(topic, "kv@")
	if !found {
		return "", "", false
	}
	pod, model, found = strings.Cut(rest, "@")
	if !found || pod == "" || model == "" || strings.Contains(model, "@") {
		return "", "", false
	}
	return pod, model, true
}

// Translator turns engines' KV-cache event messages into ApplyEvent calls
// with the gateway's own keys.
//
// Each engine has its own state: the sequence number of its last message,
// and a map from its block hashes to our keys, through which a stored
// block's parent and a removed block are found. An engine is what the
// Resolver names: its Target's Replica. Messages are tied to it by their
// source (endpoint and topic), resolved once; several sources may resolve
// to one engine (at most MaxTopicsPerEngine), and they then share its
// state, sequence numbers included, so a made-up variant of an engine's
// topic is no new engine. A source resolving to an engine already heard
// under another chain root or block size (a topic naming another model)
// is refused and counted (Rejected).
//
// A stored event's blocks are keyed from their token ids (see keys.AppendExact):
// the first chained on the parent's key, or on Root of the LoRA adapter or
// model name when the event starts a chain. An event whose parent is not
// in the map (an orphan: its ancestors were stored before we listened, or
// lost) cannot be keyed and is dropped.
//
// The index holds a block of an engine only while the map does, so every
// removal the engine announces can be applied: the map loses a block when
// the engine removes it (BlockRemoved), clears (AllBlocksCleared) or
// loses its sequence (a gap or a restart: its whole state is cleared from
// the index, as missed removals would otherwise leave stale entries, and
// the message that showed the gap is not applied, as nothing vouches for
// it: counted Skipped; unless SetReplay is on and the engine's replay
// endpoint supplies the missed batches, then applied first), and when
// Reset forgets it. An engine's map holds
// at most as many blocks as its cache, as long as its events are
// consistent; Target.MaxBlocks caps it regardless, and reaching the cap
// (an engine announcing more blocks than it could hold, its removals
// lost) clears the engine like a gap. All engines' maps together are
// bounded by Limits.MaxMapped: an event that would pass it clears the
// engines holding the most (see makeRoom; counted BudgetClears).
//
// Handle and the other methods are safe for concurrent use; messages of
// one engine must arrive in order, as they do from one ZMQ socket.
type Translator struct {
	resolve Resolver
	lim     Limits

	// mu guards the maps, glob and each engine's topics. An engine's mu
	// may be held while taking mu, never the other way round.
	mu         sync.Mutex
	engines    map[string]*engine            // by Target.Replica
	sources    map[string]map[string]*engine // by endpoint, then topic
	maxEngines int
	glob       GlobalStats

	rep atomic.Pointer[replayer] // nil until SetReplay

	// mapped counts the blocks of every engine's map (engine.account),
	// bounded by lim.MaxMapped (makeRoom).
	mapped atomic.Int64
}

// makeRoom is called by engine e, locked, before it maps n more blocks,
// and reports whether it may. When the maps of all engines would hold
// more than Limits.MaxMapped, the engines holding more than e would with
// its n are cleared as for a gap, the largest first, until there is room:
// at once when idle, else as soon as the one holding the engine's lock
// lets it go (engine.unlock), if the total is still over then, so that no
// engine waits for another's lock; their blocks count as gone meanwhile,
// and the total may pass the bound by the blocks stored in between. If
// that is not room enough, e itself is cleared, and if even that is not,
// its n blocks are refused.
func (t *Translator) makeRoom(e *engine, n int) bool {
	limit := int64(t.lim.MaxMapped)
	if t.mapped.Load()+int64(n) <= limit {
		return true
	}
	mine := e.counted.Load() + int64(n)
	for {
		over, big := t.overBy(int64(n), mine)
		switch {
		case over <= 0:
			return true
		case big == nil:
			e.budgetClear()
			over, _ = t.overBy(int64(n), mine)
			return over <= 0
		case big.mu.TryLock():
			big.shed.Store(false)
			big.budgetClear()
			big.unlock()
		default:
			big.shed.Store(true)
		}
	}
}

// overBy returns how far n more blocks would take the total past
// MaxMapped, counting the blocks of engines asked to shed as gone, and
// the engine not asked yet that holds the most, more than mine (nil if
// none).
func (t *Translator) overBy(n, mine int64) (int64, *engine) {
	over := t.mapped.Load() + n - int64(t.lim.MaxMapped)
	var big *engine
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, o := range t.engines {
		c := o.counted.Load()
		switch {
		case o.shed.Load():
			over -= c
		case c > mine:
			big, mine = o, c
		}
	}
	return over, big
}

// MaxEngines bounds the number of engines a Translator tracks; messages of
// further engines are counted as unresolved.
const MaxEngines = 4096

// MaxTopicsPerEngine bounds the sources (endpoint and topic) one engine is
// heard under; messages of further sources are refused (EngineStats.Rejected).
const MaxTopicsPerEngine = 4

// NewTranslator returns a Translator resolving sources with resolve and
// decoding payloads within lim.
func NewTranslator(resolve Resolver, lim Limits) *Translator {
	return &Translator{resolve: resolve, lim: lim.withDefaults(), engines: map[string]*engine{},
		sources: map[string]map[string]*engine{}, maxEngines: MaxEngines}
}

// Handle processes one ZMQ message (its frames) received on endpoint.
// Faults are counted, never returned: see Stats.
func (t *Translator) Handle(endpoint string, frames [][]byte) {
	topic, seq, payload, err := Frames(frames)
	if err != nil {
		t.mu.Lock()
		t.glob.MalformedFrames++
		t.glob.LastError = err.Error()
		t.mu.Unlock()
		return
	}
	e := t.engine(endpoint, topic)
	if e == nil {
		return
	}
	defer e.unlock()
	e.handle(t, seq, payload)
}

// engine returns the locked state of a source's engine, resolving the
// source if needed, or nil if it cannot be resolved or is refused. Only
// resolved sources get a state, so messages under made-up topics cost a
// Resolver call and a counter, and never crowd out the engines.
func (t *Translator) engine(endpoint string, topic []byte) *engine {
	t.mu.Lock()
	e := t.sources[endpoint][string(topic)]
	t.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		if e.resolved {
			return e
		}
		e.unlock() // after Reset, or once its replica went away
	}
	src := Source{Endpoint: endpoint, Topic: string(topic)}
	src.Pod, src.Model, _ = ParseTopic(src.Topic)
	tgt, err := t.resolveTarget(src)
	if err != nil {
		return nil
	}
again:
	t.mu.Lock()
	e = t.engines[tgt.Replica]
	if e == nil {
		if len(t.engines) >= t.maxEngines {
			t.glob.Unresolved++
			t.glob.LastError = fmt.Sprintf("source %q on %s: over %d engines", src.Topic, endpoint, t.maxEngines)
			t.mu.Unlock()
			return nil
		}
		e = &engine{src: src, dec: NewDecoder(t.lim), tr: t}
		e.applyFn = e.apply
		t.engines[tgt.Replica] = e
	}
	t.mu.Unlock()
	e.mu.Lock()
	t.mu.Lock()
	removed := t.engines[tgt.Replica] != e // by Remove, while e.mu was awaited
	t.mu.Unlock()
	if removed {
		e.unlock()
		goto again
	}
	if e.resolved && !e.same(src, tgt) {
		e.refuse(fmt.Sprintf("source %q on %s: the engine is heard as %q on %s, with model %q and block size %d",
			src.Topic, endpoint, e.src.Topic, e.src.Endpoint, e.tgt.Model, e.bs))
		e.unlock()
		return nil
	}
	t.mu.Lock()
	byTopic := t.sources[endpoint]
	if old := byTopic[src.Topic]; old != e {
		if e.topics >= MaxTopicsPerEngine {
			t.mu.Unlock()
			e.refuse(fmt.Sprintf("source %q on %s: the engine is already heard under %d topics", src.Topic, endpoint, MaxTopicsPerEngine))
			e.unlock()
			return nil
		}
		if old != nil {
			old.topics--
		}
		if byTopic == nil {
			byTopic = map[string]*engine{}
			t.sources[endpoint] = byTopic
		}
		byTopic[src.Topic] = e
		e.topics++
	}
	t.mu.Unlock()
	if !e.resolved {
		e.src = src
		e.bind(tgt)
	}
	return e
}

// forget drops the sources resolved to the engines of gone, which are
// resolved again on their next message.
func (t *Translator) forget(gone map[*engine]bool) {
	if len(gone) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for ep, byTopic := range t.sources {
		for topic, e := range byTopic {
			if gone[e] {
				delete(byTopic, topic)
				e.topics--
			}
		}
		if len(byTopic) == 0 {
			delete(t.sources, ep)
		}
	}
}

// all returns every engine.
func (t *Translator) all() []*engine {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*engine, 0, len(t.engines))
	for _, e := range t.engines {
		out = append(out, e)
	}
	return out
}

// resolveTarget resolves and validates a source's target, counting a
// failure.
func (t *Translator) resolveTarget(src Source) (Target, error) {
	tgt, err := t.resolve(src)
	if err == nil {
		err = tgt.validate()
	}
	if err == nil && tgt.Model == "" && src.Model == "" {
		// Its blocks would chain from the root of "", which no
		// request's key does.
		err = fmt.Errorf("kvevents: target of replica %q has no Model, and topic %q names none (want kv@POD@MODEL)", tgt.Replica, src.Topic)
	}
	if err != nil {
		t.mu.Lock()
		t.glob.Unresolved++
		t.glob.LastError = fmt.Sprintf("source %q on %s: %v", src.Topic, src.Endpoint, err)
		t.mu.Unlock()
	}
	return tgt, err
}

func (tg Target) validate() error {
	switch {
	case tg.Index == nil:
		return fmt.Errorf("kvevents: target has no Index")
	case tg.Replica == "":
		return fmt.Errorf("kvevents: target has no Replica")
	case tg.BlockSize < 0:
		return fmt.Errorf("kvevents: target BlockSize %d is negative", tg.BlockSize)
	case tg.MaxBlocks < 0:
		return fmt.Errorf("kvevents: target MaxBlocks %d is negative", tg.MaxBlocks)
	}
	return nil
}

// Reset clears from their indexes the blocks of every engine for which
// match returns true (all engines if match is nil), forgets their maps
// and sequence numbers, and resolves them again on their next message.
// Call it when the replica set or the configuration changes, or when an
// engine is known to have gone (a failed health check): its blocks leave
// the index at once. It returns how many engines it reset.
func (t *Translator) Reset(match func(Source, Target) bool) int {
	gone := map[*engine]bool{}
	for _, e := range t.all() {
		e.mu.Lock()
		if e.resolved && (match == nil || match(e.src, e.tgt)) {
			e.clear(false)
			e.resolved, e.seen = false, false
			e.st.Resets++
			gone[e] = true
		}
		e.unlock()
	}
	t.forget(gone)
	return len(gone)
}

// Remove resets, as Reset does, every engine whose Target.Replica gone
// reports true, and then forgets it with its figures (EngineStats): call
// it when engines leave the configuration for good (pods replaced, each
// under its own id), so that they neither count towards MaxEngines,
// past which no new engine is heard, nor keep their series. It returns
// how many engines it removed.
func (t *Translator) Remove(gone func(replica string) bool) int {
	t.mu.Lock()
	ids := map[*engine]string{}
	for id, e := range t.engines {
		if gone(id) {
			ids[e] = id
		}
	}
	t.mu.Unlock()
	for e, id := range ids {
		e.mu.Lock()
		t.remove(e, id)
		e.unlock()
	}
	return len(ids)
}

// remove clears engine e, replica id, forgets its sources and drops it
// from the engines; e.mu held.
func (t *Translator) remove(e *engine, id string) {
	e.clear(false)
	e.resolved, e.seen, e.blocks = false, false, nil
	e.account()
	t.forget(map[*engine]bool{e: true})
	t.mu.Lock()
	if t.engines[id] == e {
		delete(t.engines, id)
	}
	t.mu.Unlock()
}

// Replay calls fn, for every resolved engine for which match returns true
// (all if match is nil), with the keys of the blocks its index holds for
// it, in no particular order, then returns how many engines it replayed.
// Call it when the index gains a copy of an engine's replica (a second
// index fed by the same engine, or a rebuilt one), after the engine's
// events reach that copy: blocks the engine stored earlier are not
// announced again. fn runs with the engine's messages held back, so no
// event of the engine is applied between the snapshot and fn; it must
// not call the Translator. The keys are valid only during the call.
func (t *Translator) Replay(match func(Source, Target) bool, fn func(Source, Target, gateway.Key)) int {
	n := 0
	for _, e := range t.all() {
		e.mu.Lock()
		if e.resolved && (match == nil || match(e.src, e.tgt)) {
			keys := e.keys[:0]
			for _, k := range e.blocks {
				keys = append(keys, k)
			}
			fn(e.src, e.tgt, keys)
			e.keys = keys[:0]
			n++
		}
		e.unlock()
	}
	return n
}
