package httpgw

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/kvevents"
)

// rawPub speaks ZMTP 3 (NULL mechanism) as a PUB, from a chosen local
// address, so that tests can publish as an engine on 127.0.0.11 or as a
// rogue on 127.0.0.99 (loopback aliases need no setup on Linux).
type rawPub struct {
	t *testing.T
	c net.Conn
}

func dialRawPub(t *testing.T, from, endpoint string) *rawPub {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := []byte{0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11}
	ready = append(ready, "Socket-Type"...)
	ready = append(ready, 0, 0, 0, 3, 'P', 'U', 'B')
	_, err = c.Write(append(greeting, ready...))
	require.NoError(t, err)
	return &rawPub{t: t, c: c}
}

// send writes one message; it returns the write's error (a closed
// connection), not failing the test.
func (p *rawPub) send(frames [][]byte) error {
	var b []byte
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags = 1
		}
		if len(f) > 255 {
			b = append(b, flags|2)
			b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		} else {
			b = append(b, flags, byte(len(f)))
		}
		b = append(b, f...)
	}
	_ = p.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := p.c.Write(b)
	return err
}

// closed reports whether the subscriber closed the connection, reading
// for up to 10 s.
func (p *rawPub) closed() bool {
	_ = p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := p.c.Read(buf); err != nil {
			ne, ok := err.(net.Error)
			return !ok || !ne.Timeout()
		}
	}
}

// TestExactSourceBinding: on a bound endpoint, an engine's events are
// taken only from its replica's host. Engines on 127.0.0.11-13; a rogue
// on 127.0.0.99 (issue 21: eight BlockStored messages on a replica's
// topic moved 1,000 of 1,000 requests) is refused at connect; an engine
// publishing another engine's topic is disconnected; a topic naming
// another model is refused by the translator; kv_events_allow admits a
// relay.
func TestExactSourceBinding(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Fleet: fleet.Options{Tokenizer: &wordTokenizer{}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	cfg := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, BlockSize: 4, KVEventsBind: bind,
		Replicas: []config.Replica{
			{Name: "r1", Address: "http://127.0.0.11:8000"},
			{Name: "r2", Address: "http://127.0.0.12:8000"},
			{Name: "r3", Address: "http://127.0.0.13:8000"},
		}}
	apply := func(cfg config.Model) {
		require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	}
	apply(cfg)
	held := func(replica string) int {
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			if r.Name == replica {
				return r.CachedBlocks
			}
		}
		return -1
	}
	blocks := func(topic string, seq, base uint64) [][]byte {
		hashes := []uint64{base, base + 1}
		return eventFrames(t, topic, seq, storedEvent(hashes, nil, wordTokens(words("w"+strings.Repeat("x", int(base%7)), 8)), 4))
	}
	topic := func(host string) string { return "kv@" + host + ":8000@" + testModel }

	// The engine on 127.0.0.11 publishes its own topic: indexed.
	e1 := dialRawPub(t, "127.0.0.11", bind)
	require.NoError(t, e1.send(blocks(topic("127.0.0.11"), 1, 10)))
	waitFor(t, func() bool { return held("r1") == 2 })

	// A rogue on 127.0.0.99 posing as r2: refused before its handshake.
	rogue := dialRawPub(t, "127.0.0.99", bind)
	for i := range 8 {
		_ = rogue.send(blocks(topic("127.0.0.12"), uint64(i+1), 100+uint64(2*i)))
	}
	require.True(t, rogue.closed(), "the rogue's connection is closed")

	// The engine on 127.0.0.12 posing as r3: its connection is closed at
	// the first message of r3's topic; its own topic is fine.
	e2 := dialRawPub(t, "127.0.0.12", bind)
	require.NoError(t, e2.send(blocks(topic("127.0.0.12"), 1, 20)))
	waitFor(t, func() bool { return held("r2") == 2 })
	_ = e2.send(blocks(topic("127.0.0.13"), 1, 30))
	require.True(t, e2.closed(), "publishing another engine's topic closes the connection")

	// A topic variant naming another model, from the engine's own host:
	// refused by the translator, counted, nothing applied.
	require.NoError(t, e1.send(blocks("kv@127.0.0.11:8000@other-model", 1, 40)))
	require.NoError(t, e1.send(blocks(topic("127.0.0.11"), 2, 50)))
	waitFor(t, func() bool { return held("r1") == 4 })
	_, glob := s.KVStats()
	require.Equal(t, uint64(1), glob.Unresolved)
	require.Contains(t, glob.LastError, `names model "other-model"`)

	// The engine's other name (its host alone) is the same engine: its
	// sequence continues, and there is one state.
	require.NoError(t, e1.send(blocks("kv@127.0.0.11@"+testModel, 3, 82)))
	waitFor(t, func() bool { return held("r1") == 6 })
	engines, _ := s.KVStats()
	require.Len(t, engines, 2, "r1 and r2, however named")
	for _, e := range engines {
		require.Zero(t, e.Gaps+e.Restarts+e.Rejected, "%+v", e)
	}

	require.Equal(t, 2, held("r2"), "the rogue's blocks never reached r2")
	require.Equal(t, 0, held("r3"), "r2's engine could not publish as r3")
	eps := s.KVEndpoints()
	require.Len(t, eps, 1)
	g := eps[0].Guard
	require.Equal(t, uint64(1), g.RefusedSource)
	require.Equal(t, uint64(1), g.RefusedTopic)
	require.Equal(t, uint64(2), g.Accepted)
	waitFor(t, func() bool { return s.KVEndpoints()[0].Guard.Open == 1 })
	f := &fixture{t: t, reg: reg}
	require.Equal(t, 1.0, f.counter("exa_gateway_kv_endpoint_closed_total", map[string]string{"reason": "source"}))
	require.Equal(t, 1.0, f.counter("exa_gateway_kv_endpoint_closed_total", map[string]string{"reason": "topic"}))
	ks := s.Stats().Models[testModel].KVEvents
	require.Len(t, ks.Endpoints, 1)
	require.Equal(t, map[string]uint64{"source": 1, "topic": 1}, ks.Endpoints[0].Closed)
	require.Equal(t, uint64(1), ks.Endpoints[0].Open)

	// kv_events_allow admits a relay on 127.0.0.99, for any topic.
	cfg.KVEventsAllow = []string{"127.0.0.99/32"}
	apply(cfg)
	relay := dialRawPub(t, "127.0.0.99", bind)
	require.NoError(t, relay.send(blocks(topic("127.0.0.13"), 1, 60)))
	waitFor(t, func() bool { return held("r3") == 2 })

	// A reload removing the allow-list re-checks the relay's open
	// connection at its next message.
	cfg.KVEventsAllow = nil
	apply(cfg)
	_ = relay.send(blocks(topic("127.0.0.13"), 2, 70))
	require.True(t, relay.closed())
	require.Equal(t, 2, held("r3"))
}

// TestExactMapBoundFromCapacity: an engine's map of block hashes is
// bounded by fleet.KVMapFactor times its replica's capacity (issue 21: the
// bound was 1M blocks per topic variant whatever the replica), the
// gateway's default capacity when cache_blocks is not set.
func TestExactMapBoundFromCapacity(t *testing.T) {
	ef := newExactFixture(t, 4)
	cfg := ef.cfg
	cfg.Replicas = append([]config.Replica(nil), ef.cfg.Replicas...)
	cfg.Replicas[0].CacheBlocks = 4
	require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	tab := ef.srv.Snapshot()
	require.Equal(t, fleet.KVMapFactor*4, tab.KVMapBound(ef.bind, ef.pod(0)))
	require.Equal(t, fleet.KVMapFactor*16384, tab.KVMapBound(ef.bind, ef.pod(1)), "the gateway's default capacity")

	// 4 x 4 blocks fit; one more overflows and clears the engine.
	for i := range 4 {
		ef.store(0, uint64(i+1), uint64(100*i), wordTokens(words(fmt.Sprint("p", i), 16)), 4)
	}
	engine0 := func() kvevents.EngineStats {
		st, _ := ef.srv.KVStats()
		for _, e := range st {
			if e.Source.Pod == ef.pod(0) {
				return e
			}
		}
		t.Fatal("engine 0 not heard")
		return kvevents.EngineStats{}
	}
	require.Equal(t, 16, engine0().Mapped)
	require.Zero(t, engine0().Overflows)
	ef.store(0, 5, 1000, wordTokens(words("q", 4)), 4)
	require.Equal(t, uint64(1), engine0().Overflows)
	require.Equal(t, 1, engine0().Mapped)
}
