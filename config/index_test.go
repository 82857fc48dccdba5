package config

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
)

// exactSample is a model on the exact index: r0 heard on the bind
// endpoint under its address's pod, r1 connected to its own publisher.
func exactSample() Model {
	return Model{
		Mode:         gateway.ModeCacheAware,
		Index:        IndexExact,
		BlockSize:    16,
		KVEventsBind: "tcp://0.0.0.0:5557",
		Replicas: []Replica{
			{Name: "r0", Address: "http://10.0.0.1:8000"},
			{Name: "r1", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557", Pod: "pod-1"},
		},
	}
}

// exactPD is a disaggregated model on the exact index: every pool member
// heard on the bind endpoint under its address's pod, but d1, connected
// to its own publisher; its mode is left at the default.
func exactPD() Model {
	return Model{
		Index:        IndexExact,
		KVEventsBind: "tcp://0.0.0.0:5557",
		Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode",
		Pools: map[string][]Replica{
			"prefill": {{Name: "p0", Address: "http://10.0.1.1:8000"}, {Name: "p1", Address: "http://10.0.1.2:8000"}},
			"decode":  {{Name: "d0", Address: "http://10.0.2.1:8000"}, {Name: "d1", Address: "http://10.0.2.2:8000", KVEvents: "tcp://10.0.2.2:5557"}},
			// Not a pool of the model's P/D: it needs no source.
			"spare": {{Name: "s0", Address: "http://10.0.3.1:8000"}},
		},
	}
}

// TestExactIndexDisaggregated: a disaggregated model is accepted on the
// exact index, in any mode, when every member of its prefill and decode
// pools (and every replica) has an event source; one engine may be a
// member of both pools.
func TestExactIndexDisaggregated(t *testing.T) {
	m := exactPD()
	require.NoError(t, m.Validate())
	for _, mode := range []gateway.Mode{gateway.ModeRoundRobin, gateway.ModeCacheAware, gateway.ModeLoadAware} {
		m.Mode = mode
		require.NoError(t, m.Validate(), mode)
	}
	both := exactPD()
	both.Pools["decode"] = append(both.Pools["decode"], Replica{Name: "p0", Address: "http://10.0.1.1:8000"})
	require.NoError(t, both.Validate(), "an engine of both roles is a member of each pool")
	undefined := Model{Index: IndexExact, Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode"}
	require.NoError(t, undefined.Validate(), "pools may be named before they are defined")
	off := exactPD()
	off.Disaggregate = false
	err := off.Validate()
	var fe *FieldError
	require.ErrorAs(t, err, &fe, "not disaggregated, the model needs cache_aware")
	assert.Equal(t, "index", fe.Field)
	assert.Contains(t, fe.Reason, "or disaggregate")
	off.Mode = gateway.ModeCacheAware
	require.NoError(t, off.Validate(), "the pools are not used: their sources are not required")

	// File level: a pool member may not connect where another model binds.
	other := exactSample()
	other.KVEventsBind = "tcp://10.0.2.2:5557"
	f := &File{Version: Version, Models: map[string]Model{"a": other, "b": exactPD()}}
	require.ErrorAs(t, f.Validate(), &fe)
	assert.Equal(t, "models.b.pools.decode[1].kv_events", fe.Field)
}

func TestExactIndexValidate(t *testing.T) {
	require.NoError(t, exactSample().Validate())
	for _, tc := range []struct {
		name  string
		edit  func(*Model)
		field string
	}{
		{"unknown index", func(m *Model) { m.Index = "precise" }, "index"},
		{"index in capitals", func(m *Model) { m.Index = "EXACT" }, "index"},
		{"negative block size", func(m *Model) { m.BlockSize = -16 }, "block_size"},
		{"huge block size", func(m *Model) { m.BlockSize = MaxBlockSize + 1 }, "block_size"},
		{"bind not tcp", func(m *Model) { m.KVEventsBind = "udp://0.0.0.0:5557" }, "kv_events_bind"},
		{"bind without port", func(m *Model) { m.KVEventsBind = "tcp://0.0.0.0" }, "kv_events_bind"},
		{"bind port 0", func(m *Model) { m.KVEventsBind = "tcp://0.0.0.0:0" }, "kv_events_bind"},
		{"bind with a path", func(m *Model) { m.KVEventsBind = "tcp://h/x:5557" }, "kv_events_bind"},
		{"connect to every interface", func(m *Model) { m.Replicas[1].KVEvents = "tcp://*:5557" }, "replicas[1].kv_events"},
		{"connect to 0.0.0.0", func(m *Model) { m.Replicas[1].KVEvents = "tcp://0.0.0.0:5557" }, "replicas[1].kv_events"},
		{"connect port out of range", func(m *Model) { m.Replicas[1].KVEvents = "tcp://h:70000" }, "replicas[1].kv_events"},
		{"connect with spaces", func(m *Model) { m.Replicas[1].KVEvents = "tcp://h :5557" }, "replicas[1].kv_events"},
		{"connect to the bind endpoint", func(m *Model) { m.Replicas[1].KVEvents = "tcp://0.0.0.0:5557"; m.KVEventsBind = "tcp://0.0.0.0:5557" }, "replicas[1].kv_events"},
		{"empty ipc", func(m *Model) { m.Replicas[1].KVEvents = "ipc://" }, "replicas[1].kv_events"},
		{"pod with @", func(m *Model) { m.Replicas[1].Pod = "a@b" }, "replicas[1].pod"},
		{"pod with a control character", func(m *Model) { m.Replicas[0].Pod = "p\x1b" }, "replicas[0].pod"},
		{"allow not an address", func(m *Model) { m.KVEventsAllow = []string{"10.0.0.1", "pod-1"} }, "kv_events_allow[1]"},
		{"allow prefix out of range", func(m *Model) { m.KVEventsAllow = []string{"10.0.0.0/33"} }, "kv_events_allow[0]"},
		{"allow with a zone", func(m *Model) { m.KVEventsAllow = []string{"fe80::1%eth0"} }, "kv_events_allow[0]"},
		{"allow twice", func(m *Model) { m.KVEventsAllow = []string{"10.0.0.1", "10.0.0.0/8", "10.0.0.1"} }, "kv_events_allow[2]"},
		{"allow too long", func(m *Model) { m.KVEventsAllow = make([]string, MaxKVAllow+1) }, "kv_events_allow[0]"},
		{"round robin", func(m *Model) { m.Mode = gateway.ModeRoundRobin }, "index"},
		{"load aware", func(m *Model) { m.Mode = gateway.ModeLoadAware }, "index"},
		{"disaggregated pool member without a source", func(m *Model) {
			*m = exactPD()
			m.KVEventsBind = ""
		}, "pools.prefill[0].kv_events"},
		{"disaggregated pool members one pod", func(m *Model) {
			*m = exactPD()
			m.Pools["prefill"][1].Pod = "10.0.1.1:8000"
		}, "pools.prefill[1].pod"},
		{"disaggregated pool member connecting to the bind endpoint", func(m *Model) {
			*m = exactPD()
			m.Pools["decode"][0].KVEvents = m.KVEventsBind
		}, "pools.decode[0].kv_events"},
		{"no event source", func(m *Model) { m.KVEventsBind = "" }, "replicas[0].kv_events"},
		{"two replicas one pod", func(m *Model) { m.Replicas[1].KVEvents = ""; m.Replicas[1].Pod = "10.0.0.1:8000" }, "replicas[1].pod"},
		{"bad pool kv_events", func(m *Model) {
			m.Pools = map[string][]Replica{"p": {{Name: "x", Address: "http://h:1", KVEvents: "h:1"}}}
		}, "pools.p[0].kv_events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := exactSample().Clone()
			tc.edit(&m)
			err := m.Validate()
			require.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tc.field, fe.Field, "%v", err)
		})
	}
	// Inactive fields are kept on the approximate index.
	m := exactSample()
	m.Index = ""
	m.KVEventsBind = ""
	require.NoError(t, m.Validate(), "kv_events and pods may be stored before the exact index is switched on")
	assert.Equal(t, IndexApproximate, m.IndexName())
	assert.Equal(t, DefaultBlockSize, Model{}.TokenBlockSize())
	for _, ok := range []string{"tcp://10.0.0.2:5557", "tcp://[::1]:5557", "tcp://engine-0.svc.local:5557", "ipc:///tmp/kv.sock"} {
		assert.NoError(t, ValidateKVEndpoint(ok, false), ok)
	}
	for _, ok := range []string{"tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://127.0.0.1:5557"} {
		assert.NoError(t, ValidateKVEndpoint(ok, true), ok)
	}
}

func TestExactIndexFileValidate(t *testing.T) {
	a, b := exactSample(), exactSample()
	a.KVEventsBind = "tcp://10.0.0.100:5557"
	b.KVEventsBind = "tcp://0.0.0.0:6000"
	b.Replicas[1].KVEvents = "tcp://10.0.0.100:5557" // a's bind endpoint
	f := &File{Version: Version, Models: map[string]Model{"a": a, "b": b}}
	err := f.Validate()
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "models.b.replicas[1].kv_events", fe.Field, "%v", err)
	assert.Contains(t, fe.Reason, `model "a" binds`)
}

func TestExactIndexOptions(t *testing.T) {
	opts, err := exactSample().Options()
	require.NoError(t, err)
	approx, err := Model{Mode: gateway.ModeCacheAware}.Options()
	require.NoError(t, err)
	assert.Len(t, opts, len(approx)+1, "the exact index adds gateway.WithIndex(IndexExact)")
}

func TestAddressPod(t *testing.T) {
	for addr, want := range map[string]string{
		"http://10.0.0.7:8000": "10.0.0.7:8000", "10.0.0.7:8000": "10.0.0.7:8000",
		"https://engine/v1": "engine", "http://[::1]:80": "[::1]:80",
	} {
		assert.Equal(t, want, AddressPod(addr), addr)
	}
}

func TestParseKVAllow(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.7": "10.0.0.7/32", "10.0.0.7/24": "10.0.0.0/24", "::1": "::1/128", "::ffff:10.0.0.7": "10.0.0.7/32",
		"0.0.0.0/0": "0.0.0.0/0", "fd00::/8": "fd00::/8",
	} {
		p, err := ParseKVAllow(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, p.String(), in)
	}
	for _, in := range []string{"", "host", "10.0.0.1/", "::ffff:10.0.0.0/120", "10.0.0.1 "} {
		_, err := ParseKVAllow(in)
		require.Error(t, err, in)
	}
	m := exactSample()
	m.KVEventsAllow = []string{"10.0.0.0/24", "127.0.0.1"}
	require.NoError(t, m.Validate())
}

// TestKVEventsReplay: a replica's replay endpoint is accepted on its
// engine's host (that of its kv_events, else of its address) and refused,
// naming the field, anywhere else.
func TestKVEventsReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		r      Replica
		reason string // "" when valid
	}{
		{"connect endpoint's host", Replica{Name: "a", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557", KVEventsReplay: "tcp://10.0.0.2:5558"}, ""},
		{"address's host (bound source)", Replica{Name: "a", Address: "http://engine-0.svc:8000", KVEventsReplay: "tcp://Engine-0.svc:5558"}, ""},
		{"ipv6", Replica{Name: "a", Address: "http://[fd00::2]:8000", KVEventsReplay: "tcp://[fd00::2]:5558"}, ""},
		{"ipc with ipc", Replica{Name: "a", Address: "http://127.0.0.1:8000", KVEvents: "ipc:///run/kv", KVEventsReplay: "ipc:///run/kv-replay"}, ""},
		{"another host", Replica{Name: "a", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557", KVEventsReplay: "tcp://10.0.0.3:5558"}, `host "10.0.0.3" is not the engine's host "10.0.0.2" (of its kv_events)`},
		{"publisher's host wins over the address's", Replica{Name: "a", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.9.9:5557", KVEventsReplay: "tcp://10.0.0.2:5558"}, `not the engine's host "10.0.9.9"`},
		{"every interface", Replica{Name: "a", Address: "http://10.0.0.2:8000", KVEventsReplay: "tcp://*:5558"}, "a host to connect to"},
		{"ipc without ipc events", Replica{Name: "a", Address: "http://127.0.0.1:8000", KVEventsReplay: "ipc:///run/kv-replay"}, "needs the replica's kv_events on ipc://"},
		{"tcp with ipc events", Replica{Name: "a", Address: "http://127.0.0.1:8000", KVEvents: "ipc:///run/kv", KVEventsReplay: "tcp://127.0.0.1:5558"}, "must be on ipc:// too"},
		{"not an endpoint", Replica{Name: "a", Address: "http://10.0.0.2:8000", KVEventsReplay: "10.0.0.2:5558"}, "want tcp://HOST:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := exactSample().Clone()
			m.Replicas[1] = tc.r
			err := m.Validate()
			if tc.reason == "" {
				require.NoError(t, err)
				return
			}
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, "replicas[1].kv_events_replay", fe.Field, "%v", err)
			assert.Equal(t, tc.r.KVEventsReplay, fe.Value)
			assert.Contains(t, fe.Reason, tc.reason)
		})
	}
}

// TestKVAllowBoundFirst: a kv_events_allow list past MaxKVAllow is refused
// for its length before its entries are compared with each other, a search
// quadratic in the list's length: a file listing a million addresses
// otherwise kept Validate busy for minutes (40,000 took 1.8 s) before
// being refused anyway. The list below ends in a repeat of its first
// entry, which the bound must report instead.
func TestKVAllowBoundFirst(t *testing.T) {
	m := Model{}
	for i := range MaxKVAllow {
		m.KVEventsAllow = append(m.KVEventsAllow, fmt.Sprintf("10.0.%d.%d", i/256, i%256))
	}
	require.NoError(t, m.Validate(), "MaxKVAllow entries are allowed")
	m.KVEventsAllow = append(m.KVEventsAllow, m.KVEventsAllow[0])
	err := m.Validate()
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "kv_events_allow", fe.Field, "%v", err)
}
