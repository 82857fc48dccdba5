package config

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/examlops/gateway"
)

// Index names accepted in [Model.Index].
const (
	// IndexApproximate: the gateway infers what each engine caches from its
	// own routing decisions (the default).
	IndexApproximate = "approximate"
	// IndexExact: the gateway's index follows the engines' own KV-cache
	// events (vLLM's ZMQ publisher), and requests are tokenized as the
	// engines tokenize them.
	IndexExact = "exact"
)

// Indexes lists the accepted index names, default first.
var Indexes = []string{IndexApproximate, IndexExact}

// DefaultBlockSize is the KV block size, in tokens, of a model on the
// exact index whose BlockSize is 0: vLLM's default, 16.
const DefaultBlockSize = 16

// MaxBlockSize is the largest [Model.BlockSize] accepted, in tokens.
const MaxBlockSize = 1024

// ParseIndex checks an index name and returns it in canonical form (""
// becomes approximate). The error is a [*FieldError] for field "index".
func ParseIndex(s string) (string, error) {
	switch s {
	case "", IndexApproximate:
		return IndexApproximate, nil
	case IndexExact:
		return IndexExact, nil
	}
	return "", &FieldError{Field: "index", Value: s, Reason: "want approximate or exact"}
}

// IndexName returns the model's index with the default filled in.
func (m Model) IndexName() string {
	if m.Index == "" {
		return IndexApproximate
	}
	return m.Index
}

// Exact reports whether the model routes on the exact index.
func (m Model) Exact() bool { return m.Index == IndexExact }

// TokenBlockSize returns the exact index's block size in tokens, the
// default filled in.
func (m Model) TokenBlockSize() int {
	if m.BlockSize == 0 {
		return DefaultBlockSize
	}
	return m.BlockSize
}

// ValidateKVEndpoint reports whether ep can be a ZMQ endpoint of KV events:
// tcp://HOST:PORT with a port in 1..65535, or ipc://PATH. bind says whether
// the gateway listens there (kv_events_bind: HOST is the address to listen
// on, * or 0.0.0.0 for every interface, which docs/kv-events.md warns
// about) or dials it (a replica's kv_events: a host to reach).
// The error is a [*FieldError] for field "kv_events".
func ValidateKVEndpoint(ep string, bind bool) error {
	bad := func(reason string) error { return &FieldError{Field: "kv_events", Value: ep, Reason: reason} }
	const want = "want tcp://HOST:PORT or ipc://PATH"
	switch {
	case ep == "":
		return bad("must not be empty; " + want)
	case !utf8.ValidString(ep):
		return bad("must be valid UTF-8")
	case strings.ContainsFunc(ep, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return bad("must not contain spaces or control characters")
	case len(ep) > 1024:
		return bad(fmt.Sprintf("%d bytes, at most 1024", len(ep)))
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if path == "" {
			return bad("empty ipc path; " + want)
		}
		return nil
	}
	hostPort, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return bad(want)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return bad("not HOST:PORT after tcp:// (" + err.Error() + ")")
	}
	switch {
	case host == "":
		return bad("missing host; write the address to listen on (127.0.0.1 for this host only; * or 0.0.0.0 for every interface, see docs/kv-events.md, Security)")
	case !bind && (host == "*" || host == "0.0.0.0" || host == "::"):
		return bad("a host to connect to, not " + strconv.Quote(host))
	case host != "*" && strings.IndexFunc(host, func(r rune) bool { return !hostChar(r) }) >= 0:
		return bad("host " + strconv.Quote(host) + " is not a host name or IP address")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return bad("port " + strconv.Quote(port) + " out of range 1..65535")
	}
	return nil
}

// MaxKVAllow is the most entries of [Model.KVEventsAllow].
const MaxKVAllow = 256

// ParseKVAllow parses an entry of [Model.KVEventsAllow]: an IP address
// (a prefix of that address alone) or a CIDR prefix. The error is a
// [*FieldError] for field "kv_events_allow".
func ParseKVAllow(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, &FieldError{Field: "kv_events_allow", Value: s, Reason: "want an IP address or a CIDR prefix (10.0.0.0/24)"}
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, &FieldError{Field: "kv_events_allow", Value: s, Reason: "write an IPv4 prefix in IPv4 form"}
	}
	return p.Masked(), nil
}

// ValidatePod reports whether pod can name an engine in its events'
// topics (kv@POD@MODEL): a name (see [ValidateName]) without '@'. The
// error is a [*FieldError] for field "pod".
func ValidatePod(pod string) error {
	if p := nameProblem(pod); p != "" {
		return &FieldError{Field: "pod", Value: pod, Reason: p}
	}
	if strings.Contains(pod, "@") {
		return &FieldError{Field: "pod", Value: pod, Reason: "must not contain '@', the topic's separator"}
	}
	return nil
}

// validateIndex checks the index fields of a model: the index name, the
// block size, the bind endpoint, each replica's kv_events and pod, and
// that a model on the exact index is cache-aware (unless disaggregated)
// and has an event source for every replica that may serve it: its
// replicas and, when disaggregated, the members of its prefill and decode
// pools.
func (m Model) validateIndex() error {
	if name, err := ParseIndex(m.Index); err != nil {
		return err
	} else if m.Index != "" && name != m.Index {
		return &FieldError{Field: "index", Value: m.Index, Reason: "write it " + name}
	}
	if m.BlockSize < 0 || m.BlockSize > MaxBlockSize {
		return &FieldError{Field: "block_size", Value: fmt.Sprint(m.BlockSize), Reason: fmt.Sprintf("want 0..%d tokens (0 means %d)", MaxBlockSize, DefaultBlockSize)}
	}
	if m.KVEventsBind != "" {
		if err := ValidateKVEndpoint(m.KVEventsBind, true); err != nil {
			err.(*FieldError).Field = "kv_events_bind"
			return err
		}
	}
	for i, a := range m.KVEventsAllow {
		if _, err := ParseKVAllow(a); err != nil {
			err.(*FieldError).Field = fmt.Sprintf("kv_events_allow[%d]", i)
			return err
		}
	}
	// The bound before the duplicate search, quadratic in the length.
	if len(m.KVEventsAllow) > MaxKVAllow {
		return &FieldError{Field: "kv_events_allow", Value: fmt.Sprint(len(m.KVEventsAllow)), Reason: fmt.Sprintf("%d entries, at most %d (use CIDR prefixes)", len(m.KVEventsAllow), MaxKVAllow)}
	}
	for i, a := range m.KVEventsAllow {
		for j := range i {
			if m.KVEventsAllow[j] == a {
				return &FieldError{Field: fmt.Sprintf("kv_events_allow[%d]", i), Value: a, Reason: fmt.Sprintf("listed twice (kv_events_allow[%d])", j)}
			}
		}
	}
	check := func(field string, rs []Replica) error {
		for i, r := range rs {
			at := fmt.Sprintf("%s[%d]", field, i)
			if r.KVEvents != "" {
				if err := ValidateKVEndpoint(r.KVEvents, false); err != nil {
					err.(*FieldError).Field = at + ".kv_events"
					return err
				}
				if r.KVEvents == m.KVEventsBind {
					return &FieldError{Field: at + ".kv_events", Value: r.KVEvents, Reason: "is the model's kv_events_bind: the gateway cannot both listen and connect there"}
				}
			}
			if r.KVEventsReplay != "" {
				if err := r.validateReplay(); err != nil {
					err.Field = at + ".kv_events_replay"
					return err
				}
			}
			if r.Pod != "" {
				if err := ValidatePod(r.Pod); err != nil {
					err.(*FieldError).Field = at + ".pod"
					return err
				}
			}
		}
		return nil
	}
	if err := check("replicas", m.Replicas); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(m.Pools)) {
		if err := check(joinPath("pools", name), m.Pools[name]); err != nil {
			return err
		}
	}
	if !m.Exact() {
		return nil
	}
	// A disaggregated model served by its pools routes its prefill pool
	// cache-aware and its decode pool load-aware whatever its mode; the
	// exact index informs both (docs/disaggregation.md).
	if m.Mode != gateway.ModeCacheAware && !m.Disaggregate {
		return &FieldError{Field: "index", Value: m.Index, Reason: "needs mode " + gateway.ModeCacheAware.String() +
			" (the index informs cache-aware routing only) or disaggregate, not mode " + m.Mode.String()}
	}
	if err := m.checkSources("replicas", m.Replicas); err != nil {
		return err
	}
	if m.Disaggregate {
		for _, pool := range []string{m.PrefillPool, m.DecodePool} {
			if err := m.checkSources(joinPath("pools", pool), m.Pools[pool]); err != nil {
				return err
			}
			if m.DecodePool == m.PrefillPool {
				break
			}
		}
	}
	return nil
}

// checkSources checks that every replica of rs (field names them) has a
// source of events and that no two of them answer to the same pod of one
// source. The lists are checked apart: an engine serving both roles may
// be a member of the prefill and of the decode pool.
func (m Model) checkSources(field string, rs []Replica) error {
	pods := map[string]string{} // source + pod → replica
	for i, r := range rs {
		at := fmt.Sprintf("%s[%d]", field, i)
		src := r.KVEvents
		if src == "" {
			src = m.KVEventsBind
		}
		if src == "" {
			return &FieldError{Field: at + ".kv_events", Value: "", Reason: "index exact needs a source of KV events for every replica: " +
				"the replica's kv_events (an engine publisher to connect to) or the model's kv_events_bind"}
		}
		pod := r.Pod
		if pod == "" {
			pod = AddressPod(r.Address)
		}
		if prev, dup := pods[src+"\x00"+pod]; dup && pod != "" {
			return &FieldError{Field: at + ".pod", Value: pod, Reason: fmt.Sprintf("replica %q of the same event source %s answers to that pod name too; give each its own pod", prev, src)}
		}
		pods[src+"\x00"+pod] = r.Name
	}
	return nil
}

// validateReplay checks a replica's KVEventsReplay: an endpoint to
// connect to, on the engine's host (see [Replica.KVEventsReplay]).
func (r Replica) validateReplay() *FieldError {
	ep := r.KVEventsReplay
	if err := ValidateKVEndpoint(ep, false); err != nil {
		return err.(*FieldError)
	}
	bad := func(reason string) *FieldError {
		return &FieldError{Field: "kv_events_replay", Value: ep, Reason: reason}
	}
	host, from := EngineHost(r)
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if !strings.HasPrefix(r.KVEvents, "ipc://") {
			return bad("an ipc:// replay endpoint needs the replica's kv_events on ipc:// too (the engine on this host); " + path + " is not bound to the engine")
		}
		return nil
	}
	if strings.HasPrefix(r.KVEvents, "ipc://") {
		return bad("the replica's kv_events is on ipc://: its replay endpoint must be on ipc:// too")
	}
	h, _, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if !strings.EqualFold(h, host) {
		return bad(fmt.Sprintf("host %q is not the engine's host %q (of its %s): a replay is taken only from the engine that published", h, host, from))
	}
	return nil
}

// EngineHost is the host a replica's engine publishes from, as written:
// that of its KVEvents when it is a tcp:// endpoint, else that of its
// Address; from names the field it comes from.
func EngineHost(r Replica) (host, from string) {
	if hp, ok := strings.CutPrefix(r.KVEvents, "tcp://"); ok {
		h, _, _ := net.SplitHostPort(hp)
		return h, "kv_events"
	}
	full := r.Address
	if !strings.Contains(full, "://") {
		full = "http://" + full
	}
	if u, err := url.Parse(full); err == nil {
		return u.Hostname(), "address"
	}
	return "", "address"
}

// hostChar reports whether r may appear in a host name or an IP address
// (IPv6 without its brackets).
func hostChar(r rune) bool {
	return r < utf8.RuneSelf && (isASCIILetter(byte(r)) || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' || r == ':' || r == '%')
}

// AddressPod is the pod name a replica without one answers to (see
// [Replica.Pod]): its address's host:port as written ("10.0.0.7:8000"), or
// its host when the address has no port; "" for an address that does not
// parse.
func AddressPod(addr string) string {
	full := addr
	if !strings.Contains(addr, "://") {
		full = "http://" + addr
	}
	u, err := url.Parse(full)
	if err != nil {
		return ""
	}
	return u.Host
}

// validateKVSources checks what no single model can: that no endpoint is
// bound by one model and connected to by another.
func (f *File) validateKVSources() error {
	binds := map[string]string{}
	for _, name := range f.Names() {
		if ep := f.Models[name].KVEventsBind; ep != "" {
			binds[ep] = name
		}
	}
	for _, name := range f.Names() {
		m := f.Models[name]
		lists := [][]Replica{m.Replicas}
		fields := []string{"replicas"}
		for _, pool := range slices.Sorted(maps.Keys(m.Pools)) {
			lists, fields = append(lists, m.Pools[pool]), append(fields, joinPath("pools", pool))
		}
		for j, rs := range lists {
			for i, r := range rs {
				if other, ok := binds[r.KVEvents]; ok && r.KVEvents != "" {
					return &FieldError{Field: joinPath("models", name) + fmt.Sprintf(".%s[%d].kv_events", fields[j], i), Value: r.KVEvents,
						Reason: fmt.Sprintf("model %q binds that endpoint (kv_events_bind): the gateway cannot both listen and connect there", other)}
				}
			}
		}
	}
	return nil
}
