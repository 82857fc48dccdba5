package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/examlops/gateway"
)

// Version is the file format version written by this package. Files with
// another version are rejected as corrupt.
const Version = 1

// Default pool names, used by the CLI when disaggregation is switched on
// without naming the pools.
const (
	DefaultPrefillPool = "prefill"
	DefaultDecodePool  = "decode"
)

// maxSLOLatencyMS is the largest SLO, in milliseconds, a time.Duration holds.
const maxSLOLatencyMS = math.MaxInt64 / int64(time.Millisecond)

// Errors returned by this package; they are wrapped with the file, field and
// value concerned, so test them with errors.Is.
var (
	// ErrCorrupt reports a configuration file that cannot be decoded.
	ErrCorrupt = errors.New("gateway: corrupt config file")
	// ErrInvalid reports a configuration value that is out of range or
	// otherwise not acceptable.
	ErrInvalid = errors.New("gateway: invalid config value")
	// ErrUnknownModel reports a model that has no stored configuration.
	ErrUnknownModel = errors.New("gateway: unknown model")
)

// FieldError describes one invalid value. It unwraps to [ErrInvalid].
// The zero value is not meaningful.
type FieldError struct {
	// Field is the dotted JSON path of the value, e.g. "models.JPCP.mode".
	Field string
	// Value is the offending value as text.
	Value string
	// Reason says what is wrong, e.g. "must not be negative".
	Reason string
	// File is the configuration file holding the value; "" when the value
	// did not come from a file.
	File string
}

// Error returns a one-line message naming the field, value and file.
func (e *FieldError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("gateway: invalid %s %q in %s: %s", e.Field, e.Value, e.File, e.Reason)
	}
	return fmt.Sprintf("gateway: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns [ErrInvalid].
func (e *FieldError) Unwrap() error { return ErrInvalid }

// File is the whole routing configuration. The zero value is an empty
// configuration (no models); [Load] returns one with Version set when the
// file does not exist yet.
type File struct {
	// Version is the format version; 0 is read as [Version].
	Version int `json:"version"`
	// Models maps a model name (as clients send it in requests) to its
	// routing configuration. Nil means no models.
	Models map[string]Model `json:"models"`
}

// Model is the routing configuration of one model. The zero value is
// round-robin routing with no SLO, default load weights, no
// disaggregation and no replicas.
type Model struct {
	// Mode is the routing mode, written by name (round_robin, cache_aware
	// or load_aware; hyphens are read as underscores, and "" or an absent
	// field as round_robin, the zero value).
	Mode gateway.Mode `json:"mode"`
	// SLOLatencyMS is the latency SLO in milliseconds; 0 means none.
	SLOLatencyMS int64 `json:"slo_latency_ms,omitempty"`
	// LoadWeights are the load-aware score weights; nil means the gateway's defaults.
	LoadWeights *LoadWeights `json:"load_weights,omitempty"`
	// Disaggregate switches prefill/decode disaggregation on; default off.
	Disaggregate bool `json:"disaggregate,omitempty"`
	// PrefillPool names the pool (a key of Pools) that runs prefill when
	// Disaggregate is true; "" when unset.
	PrefillPool string `json:"prefill_pool,omitempty"`
	// DecodePool names the pool that runs decode when Disaggregate is
	// true; "" when unset.
	DecodePool string `json:"decode_pool,omitempty"`
	// PDMode is how the HTTP gateway splits the model's requests when
	// Disaggregate is true: "gateway" or "sidecar" (see [PDModeGateway]
	// and [PDModeSidecar]); "" means gateway.
	PDMode string `json:"pd_mode,omitempty"`
	// PDMinUncachedTokens is the P/D decider's threshold: a request is
	// split only when at least this many prompt tokens are not cached on
	// its decode replica. Nil means [DefaultPDMinUncachedTokens]; 0
	// splits every request.
	PDMinUncachedTokens *int `json:"pd_min_uncached_tokens,omitempty"`
	// Engine is the engines' type, whose metric names the HTTP gateway
	// reads for their load: vllm, sglang or trtllm (see [EngineVLLM] and
	// the others); "" (the default) detects it from each engine's
	// metrics page ([EngineAuto]).
	Engine string `json:"engine,omitempty"`
	// Replicas serve the model when it is not disaggregated; nil means none configured.
	Replicas []Replica `json:"replicas,omitempty"`
	// Pools maps a pool name to its replicas; nil means no pools.
	Pools map[string][]Replica `json:"pools,omitempty"`
	// Index is approximate (the default when "") or exact: see
	// [IndexExact]. A model on the exact index must be cache_aware or
	// disaggregated, and have a source of KV events for every replica
	// (a disaggregated model's pool members too): KVEventsBind or the
	// replica's KVEvents.
	Index string `json:"index,omitempty"`
	// BlockSize is the engines' KV block size in tokens, which the exact
	// index keys requests with (vLLM's --block-size); 0 means
	// DefaultBlockSize (16). At most MaxBlockSize. Kept, inactive, on the
	// approximate index.
	BlockSize int `json:"block_size,omitempty"`
	// KVEventsBind is a ZMQ endpoint (tcp://HOST:PORT or ipc://PATH) the
	// gateway listens on for KV events, where engines whose publisher
	// connects (llm-d-inference-sim's --zmq-endpoint; vLLM's with a host
	// in its endpoint) publish. Each message's topic kv@POD@MODEL names
	// its engine: the replica whose Pod is POD (see [Replica.Pod]). ""
	// means none: every replica then needs its own KVEvents.
	KVEventsBind string `json:"kv_events_bind,omitempty"`
	// KVEventsAllow lists the source addresses (IP addresses, or CIDR
	// prefixes such as 10.0.0.0/24), besides its replicas' hosts, that
	// may publish on KVEventsBind, under any topic: relays, or engines
	// whose connections come from another address than their replica's
	// (NAT, a sidecar). Without it, a connection is accepted only from
	// the host of a replica of the endpoint, and publishes only the
	// topics of that host's engines. "0.0.0.0/0" and "::/0" accept
	// anyone (then only the network keeps rogue publishers out). Nil or
	// empty means none; at most [MaxKVAllow] entries, each once; kept,
	// inactive, without KVEventsBind. See [ParseKVAllow].
	KVEventsAllow []string `json:"kv_events_allow,omitempty"`
	// Adapters, when not empty, is the model's LoRA adapter allow-list:
	// requests may name only these adapters (each a name as in
	// [ValidateName], listed once). The gateway discovers the adapters
	// each engine serves from its GET /v1/models (those with a parent);
	// an adapter listed here that no engine of the model lists is routed
	// over all its replicas (for engines that load adapters on demand).
	// Nil or empty means every discovered adapter is served.
	Adapters []string `json:"adapters,omitempty"`
	// Peers are the base URLs (see [ValidatePeers]) of the other gateway
	// processes routing this model to the same replicas, whose /metrics
	// pages the HTTP gateway scrapes with the engines' for the prefill
	// each has pending at each replica (exa_gateway_pending_prefill_blocks)
	// and adds to its own when pricing a replica's queue (cache_aware;
	// see docs/multi-gateway.md). An entry "dns+http://NAME:PORT" is every
	// address NAME resolves to ("dns+https://NAME:PORT" over https, each
	// address's certificate verified for NAME). A gateway that finds itself in the list
	// ignores itself, so a group of gateways can share one list; the
	// peers must name the model and its replicas alike. Nil or empty
	// means none: the gateway counts only the prefill it routed.
	Peers []string `json:"peers,omitempty"`
}

// LoadWeights are the weights of the load-aware score, mirroring
// gateway.LoadWeights. A nil *LoadWeights in [Model] means
// gateway.DefaultLoadWeights(); a zero weight switches that signal off,
// but not all three may be zero.
type LoadWeights struct {
	// Queue weighs outstanding requests.
	Queue float64 `json:"queue"`
	// KV weighs KV-cache utilisation (0..1).
	KV float64 `json:"kv"`
	// Latency weighs the smoothed measured latency.
	Latency float64 `json:"latency"`
}

// Gateway returns the weights as gateway.LoadWeights.
func (w LoadWeights) Gateway() gateway.LoadWeights {
	return gateway.LoadWeights{Queue: w.Queue, KV: w.KV, Latency: w.Latency}
}

// Replica is one engine serving a model. The zero value is invalid: Name
// (see [ValidateName]) and Address (see [ValidateAddress]) are required.
type Replica struct {
	// Name identifies the replica; unique within a model's replicas or pool.
	Name string `json:"name"`
	// Address is the engine's http:// or https:// base URL; a bare
	// host:port means http://host:port. See [ValidateAddress].
	Address string `json:"address"`
	// CacheBlocks is the replica's prefix-cache capacity in blocks; 0 means
	// the KV-cache size its engine reports (vllm:cache_config_info or
	// sglang:cache_config_info, scraped), else the gateway's default.
	CacheBlocks int `json:"cache_blocks,omitempty"`
	// KVEvents is the ZMQ endpoint (tcp://HOST:PORT or ipc://PATH) of the
	// engine's KV-event publisher, which the gateway connects to (vLLM
	// binds tcp://*:5557 by default, so tcp://ENGINE_HOST:5557); "" means
	// the model's KVEventsBind. Several replicas may share one (a relay):
	// messages are then told apart by the pod of their topic.
	KVEvents string `json:"kv_events,omitempty"`
	// KVEventsReplay is the ZMQ endpoint of the engine's replay socket
	// (vLLM's replay_endpoint in --kv-events-config), which the gateway
	// connects to when the engine's events show a sequence gap, to fetch
	// the missed batches instead of clearing the engine. Its host must be
	// the engine's: the host of KVEvents, or of Address when KVEvents is
	// "" (an ipc:// endpoint only with an ipc:// KVEvents). "" (the
	// default) means none. See docs/kv-events.md, Replay.
	KVEventsReplay string `json:"kv_events_replay,omitempty"`
	// Pod is the name the engine gives itself in its events' topics
	// (kv@POD@MODEL; llm-d-inference-sim's POD_IP). "" means the
	// address's host:port (http://10.0.0.7:8000 answers to 10.0.0.7:8000),
	// or its host alone (10.0.0.7) when no other replica of the event
	// source has that host.
	Pod string `json:"pod,omitempty"`
}

// Gateway returns the replica as a gateway.Replica (healthy).
func (r Replica) Gateway() gateway.Replica {
	return gateway.Replica{Name: r.Name, Address: r.Address, CacheBlocks: r.CacheBlocks}
}

// GatewayReplicas converts a replica list for gateway.New.
func GatewayReplicas(rs []Replica) []gateway.Replica {
	out := make([]gateway.Replica, len(rs))
	for i, r := range rs {
		out[i] = r.Gateway()
	}
	return out
}

// Options returns the gateway options the model's configuration implies:
// its mode, its SLO (when set), its load weights (when set) and the exact
// index (when set).
func (m Model) Options() ([]gateway.Option, error) {
	if err := m.validMode(); err != nil {
		return nil, err
	}
	opts := []gateway.Option{gateway.WithMode(m.Mode)}
	if m.SLOLatencyMS > 0 {
		opts = append(opts, gateway.WithSLOLatency(m.SLOLatency()))
	}
	if m.LoadWeights != nil && m.Mode == gateway.ModeLoadAware {
		opts = append(opts, gateway.WithPolicy(&gateway.LoadAware{Weights: m.LoadWeights.Gateway()}))
	}
	if m.Exact() {
		opts = append(opts, gateway.WithExactIndex())
	}
	return opts, nil
}

// SLOLatency returns the latency SLO as a duration; 0 means none.
func (m Model) SLOLatency() time.Duration {
	return time.Duration(m.SLOLatencyMS) * time.Millisecond
}

// Pool returns the replicas of the named pool, nil if it has none.
func (m Model) Pool(name string) []Replica { return m.Pools[name] }

// Clone returns a deep copy of m.
func (m Model) Clone() Model {
	c := m
	if m.LoadWeights != nil {
		w := *m.LoadWeights
		c.LoadWeights = &w
	}
	if m.PDMinUncachedTokens != nil {
		n := *m.PDMinUncachedTokens
		c.PDMinUncachedTokens = &n
	}
	c.Replicas = slices.Clone(m.Replicas)
	c.Adapters = slices.Clone(m.Adapters)
	c.KVEventsAllow = slices.Clone(m.KVEventsAllow)
	c.Peers = slices.Clone(m.Peers)
	if m.Pools != nil {
		c.Pools = make(map[string][]Replica, len(m.Pools))
		for k, v := range m.Pools {
			c.Pools[k] = slices.Clone(v)
		}
	}
	return c
}

// Clone returns a deep copy of f.
func (f *File) Clone() *File {
	c := &File{Version: f.Version}
	if f.Models != nil {
		c.Models = make(map[string]Model, len(f.Models))
		for k, v := range f.Models {
			c.Models[k] = v.Clone()
		}
	}
	return c
}

// Model returns the configuration of the named model, or an error wrapping
// [ErrUnknownModel].
func (f *File) Model(name string) (Model, error) {
	m, ok := f.Models[name]
	if !ok {
		return Model{}, fmt.Errorf("%w %q", ErrUnknownModel, name)
	}
	return m, nil
}

// Names returns the model names in sorted order.
func (f *File) Names() []string {
	return slices.Sorted(maps.Keys(f.Models))
}

// validMode checks that m.Mode is a built-in mode; the error is a
// [*FieldError] for field "mode".
func (m Model) validMode() error {
	if _, err := m.Mode.MarshalText(); err != nil {
		return &FieldError{Field: "mode", Value: m.Mode.String(), Reason: "want " + modeChoices()}
	}
	return nil
}

// modeChoices lists the mode names, from gateway.Modes: "round_robin,
// cache_aware or load_aware".
func modeChoices() string {
	modes := []gateway.Mode{gateway.ModeRoundRobin, gateway.ModeCacheAware, gateway.ModeLoadAware}
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.String()
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// MaxNameBytes is the longest model, pool or replica name accepted: 255
// bytes. (A model's statistics file name is derived from its name; see
// [StatsPath] for names whose escaped form is longer than a file name may be.)
const MaxNameBytes = 255

// nameProblem says what is wrong with a model, pool or replica name, ""
// when nothing is.
func nameProblem(name string) string {
	switch {
	case name == "":
		return "must not be empty"
	case len(name) > MaxNameBytes:
		return fmt.Sprintf("%d bytes, at most %d", len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return "must be valid UTF-8"
	case strings.TrimSpace(name) != name:
		return "must not start or end with spaces"
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return "must not contain control characters"
	}
	return ""
}

// ValidateModelName reports whether name can be used as a model name: not
// empty, at most [MaxNameBytes] bytes of valid UTF-8, no surrounding
// spaces, no control characters. The error is a [*FieldError] for field
// "model".
func ValidateModelName(name string) error {
	if p := nameProblem(name); p != "" {
		return &FieldError{Field: "model", Value: name, Reason: p}
	}
	return nil
}

// ValidateName reports whether name can name a pool or a replica; the rules
// are those of [ValidateModelName]. The error is a [*FieldError] for field
// "name".
func ValidateName(name string) error {
	if p := nameProblem(name); p != "" {
		return &FieldError{Field: "name", Value: name, Reason: p}
	}
	return nil
}

// Validate checks every field of the model. Field names in errors are
// relative to the model ("mode", "pools.prefill[0].address", ...).
func (m Model) Validate() error {
	if err := m.validMode(); err != nil {
		return err
	}
	if m.SLOLatencyMS < 0 {
		return &FieldError{Field: "slo_latency_ms", Value: fmt.Sprint(m.SLOLatencyMS), Reason: "must not be negative"}
	}
	if m.SLOLatencyMS > maxSLOLatencyMS {
		return &FieldError{Field: "slo_latency_ms", Value: fmt.Sprint(m.SLOLatencyMS), Reason: fmt.Sprintf("at most %d (the largest time.Duration)", maxSLOLatencyMS)}
	}
	if w := m.LoadWeights; w != nil {
		for _, f := range []struct {
			name string
			v    float64
		}{{"queue", w.Queue}, {"kv", w.KV}, {"latency", w.Latency}} {
			if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
				return &FieldError{Field: "load_weights." + f.name, Value: fmt.Sprint(f.v), Reason: "must be a finite number, not negative"}
			}
		}
		if w.Queue+w.KV+w.Latency == 0 {
			return &FieldError{Field: "load_weights", Value: "queue=0,kv=0,latency=0", Reason: "not all weights may be zero"}
		}
	}
	if m.Disaggregate {
		if m.PrefillPool == "" {
			return &FieldError{Field: "prefill_pool", Value: "", Reason: "required when disaggregate is true"}
		}
		if m.DecodePool == "" {
			return &FieldError{Field: "decode_pool", Value: "", Reason: "required when disaggregate is true"}
		}
		if m.PrefillPool == m.DecodePool {
			return &FieldError{Field: "decode_pool", Value: m.DecodePool, Reason: "must differ from prefill_pool"}
		}
	}
	// The pool names, kept when disaggregation is off, name pools, whose
	// names follow the rules of a pool's (validatePoolName).
	for _, ref := range []struct{ field, name string }{{"prefill_pool", m.PrefillPool}, {"decode_pool", m.DecodePool}} {
		if p := nameProblem(ref.name); ref.name != "" && p != "" {
			return &FieldError{Field: ref.field, Value: ref.name, Reason: p}
		}
	}
	if err := m.validatePD(); err != nil {
		return err
	}
	if err := m.validateEngine(); err != nil {
		return err
	}
	if err := validateReplicas("replicas", m.Replicas); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(m.Pools)) {
		if err := validatePoolName(name); err != nil {
			return err
		}
		if err := validateReplicas(joinPath("pools", name), m.Pools[name]); err != nil {
			return err
		}
	}
	if err := m.validateReplicaCounts(); err != nil {
		return err
	}
	if err := validateAdapters(m.Adapters); err != nil {
		return err
	}
	if err := ValidatePeers(m.Peers); err != nil {
		return err
	}
	return m.validateIndex()
}

// MaxAdapters is the longest adapter allow-list a model may have.
const MaxAdapters = 4096

// validateAdapters checks an adapter allow-list: valid names, each once.
func validateAdapters(names []string) error {
	if len(names) > MaxAdapters {
		return &FieldError{Field: "adapters", Value: fmt.Sprintf("%d adapters", len(names)), Reason: fmt.Sprintf("at most %d", MaxAdapters)}
	}
	seen := make(map[string]bool, len(names))
	for i, n := range names {
		at := fmt.Sprintf("adapters[%d]", i)
		if p := nameProblem(n); p != "" {
			return &FieldError{Field: at, Value: n, Reason: p}
		}
		if seen[n] {
			return &FieldError{Field: at, Value: n, Reason: "listed twice"}
		}
		seen[n] = true
	}
	return nil
}

// validateReplicaCounts checks that no gateway built from the model would
// hold more than gateway.MaxReplicas replicas: not its replica list, not
// one pool (the HTTP gateway routes each pool of a disaggregated model
// with a gateway of its own). Pools that are named but not defined are
// not an error here: the CLI names them before they exist.
func (m Model) validateReplicaCounts() error {
	tooMany := func(field string, n int) error {
		return &FieldError{Field: field, Value: fmt.Sprintf("%d replicas", n), Reason: fmt.Sprintf("at most %d replicas", gateway.MaxReplicas)}
	}
	if n := len(m.Replicas); n > gateway.MaxReplicas {
		return tooMany("replicas", n)
	}
	for _, name := range slices.Sorted(maps.Keys(m.Pools)) {
		if n := len(m.Pools[name]); n > gateway.MaxReplicas {
			return tooMany(joinPath("pools", name), n)
		}
	}
	return nil
}

// validatePoolName rejects badly formed pool names.
func validatePoolName(name string) error {
	if p := nameProblem(name); p != "" {
		return &FieldError{Field: "pool", Value: name, Reason: p}
	}
	return nil
}

// validateReplicas checks names, addresses and uniqueness of a replica list.
func validateReplicas(field string, rs []Replica) error {
	seen := make(map[string]bool, len(rs))
	for i, r := range rs {
		at := fmt.Sprintf("%s[%d]", field, i)
		if p := nameProblem(r.Name); p != "" {
			return &FieldError{Field: at + ".name", Value: r.Name, Reason: p}
		}
		if seen[r.Name] {
			return &FieldError{Field: at + ".name", Value: r.Name, Reason: "duplicate replica name"}
		}
		seen[r.Name] = true
		if err := ValidateAddress(r.Address); err != nil {
			fe := err.(*FieldError)
			fe.Field = at + ".address"
			return fe
		}
		if r.CacheBlocks < 0 || r.CacheBlocks > gateway.MaxCacheBlocks {
			return &FieldError{Field: at + ".cache_blocks", Value: fmt.Sprint(r.CacheBlocks), Reason: fmt.Sprintf("want 0..%d", gateway.MaxCacheBlocks)}
		}
	}
	return nil
}

// Validate checks the version, every model name and every model. Field
// names in errors are full paths ("models.JPCP.mode").
func (f *File) Validate() error {
	if f.Version != Version {
		return &FieldError{Field: "version", Value: fmt.Sprint(f.Version), Reason: fmt.Sprintf("want %d", Version)}
	}
	for _, name := range f.Names() {
		if err := ValidateModelName(name); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Field = "models"
			}
			return err
		}
		if err := f.Models[name].Validate(); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Field = joinPath("models", name) + "." + fe.Field
			}
			return err
		}
	}
	return f.validateKVSources()
}
