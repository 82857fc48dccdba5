package httpgw

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/kvevents"
)

// exactFixture is a gateway serving testModel on the exact index over two
// fake engines, listening for KV events on a loopback endpoint.
type exactFixture struct {
	*fixture
	bind string
	tok  *wordTokenizer
	cfg  config.Model
}

func newExactFixture(t *testing.T, bs int) *exactFixture {
	t.Helper()
	ef := &exactFixture{fixture: &fixture{t: t, reg: prometheus.NewRegistry()}, bind: freeTCP(t), tok: &wordTokenizer{}}
	var reps []config.Replica
	for i := range 2 {
		e := enginetest.New(enginetest.Options{Model: testModel, Name: "e" + strconv.Itoa(i)})
		t.Cleanup(e.Close)
		ef.engines = append(ef.engines, e)
		reps = append(reps, config.Replica{Name: e.Name(), Address: e.URL()})
	}
	s, err := New(Options{Registerer: ef.reg, Gatherer: ef.reg, Logger: quietLogger(), Fleet: fleet.Options{Tokenizer: ef.tok, MaxEjectionPercent: 100}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ef.cfg = config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, BlockSize: bs, KVEventsBind: ef.bind, Replicas: reps}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: ef.cfg}}))
	ef.srv = s
	ef.http = newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ef.handlers.Add(1)
		defer ef.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	return ef
}

// pod is the topic pod engine i answers to: its address's host:port.
func (ef *exactFixture) pod(i int) string { return strings.TrimPrefix(ef.engines[i].URL(), "http://") }

// store announces, as engine i, blocks of tokens under consecutive hashes
// from base (message seq).
func (ef *exactFixture) store(i int, seq, base uint64, tokens []uint32, bs int) {
	n := len(tokens) / bs
	hashes := make([]uint64, n)
	for j := range hashes {
		hashes[j] = base + uint64(j)
	}
	ef.srv.HandleKVFrames(ef.bind, eventFrames(ef.t, "kv@"+ef.pod(i)+"@"+testModel, seq, storedEvent(hashes, nil, tokens, bs)))
}

// complete posts a completion and returns the replica and the decision.
func (ef *exactFixture) complete(body string) (replica, decision string) {
	ef.t.Helper()
	resp := ef.post("/v1/completions", body)
	b := readAll(ef.t, resp)
	require.Equal(ef.t, http.StatusOK, resp.StatusCode, "%s", b)
	return resp.Header.Get(HeaderReplica), resp.Header.Get(HeaderDecision)
}

func TestExactRoutesOnEngineEvents(t *testing.T) {
	ef := newExactFixture(t, 4)
	prompt := words("doc", 12) // 3 blocks of 4
	ef.store(1, 1, 100, wordTokens(prompt)[:8], 4)

	rep, dec := ef.complete(`{"model":"m1","prompt":"` + prompt + `"}`)
	require.Equal(t, "e1", rep)
	require.Equal(t, "affinity; matched=2/3; index=exact", dec)
	require.Equal(t, 1, ef.tok.Calls())

	// A prompt of token ids needs no tokenizer.
	ids, _ := json.Marshal(wordTokens(prompt))
	rep, dec = ef.complete(`{"model":"m1","prompt":` + string(ids) + `}`)
	require.Equal(t, "e1", rep)
	require.Equal(t, "affinity; matched=2/3; index=exact", dec)
	require.Equal(t, 1, ef.tok.Calls())

	// The exact index changes only through events: routing e1 did not
	// add the third block.
	st := ef.stats()
	m := st.Models[testModel]
	require.Equal(t, config.IndexExact, m.Index)
	require.Equal(t, 2, m.Replicas[1].CachedBlocks)
	require.Zero(t, m.Replicas[0].CachedBlocks)
	require.NotNil(t, m.KVEvents)
	require.Equal(t, 4, m.KVEvents.BlockSize)
	require.Equal(t, uint64(1), m.KVEvents.Tokenize.Requests)
	require.Equal(t, uint64(1), m.KVEvents.Tokenize.EngineCalls)
	require.Len(t, m.KVEvents.Engines, 1)
	e := m.KVEvents.Engines[0]
	require.Equal(t, []string{"m1/e1"}, e.Replicas)
	require.Equal(t, uint64(2), e.StoredBlocks)
	require.Equal(t, 2, e.MappedBlocks)
	require.Len(t, m.KVEvents.Endpoints, 1)
	require.True(t, m.KVEvents.Endpoints[0].Bound)
	require.NotNil(t, st.KVEvents)

	// Chats are keyed from their messages.
	ef.store(0, 1, 200, wordTokens(" sys0 sys1 sys2 sys3 hello there you all"), 4)
	resp := ef.post("/v1/chat/completions", chatBody(testModel, false, "sys0 sys1 sys2 sys3", "hello there you all", "more"))
	readAll(t, resp)
	require.Equal(t, "e0", resp.Header.Get(HeaderReplica))
	require.Equal(t, "affinity; matched=2/2; index=exact", resp.Header.Get(HeaderDecision))

	require.Equal(t, 2.0, ef.counter("exa_gateway_kv_blocks_stored_total", map[string]string{"topic": "kv@" + ef.pod(1) + "@m1"}))
	require.Equal(t, 2.0, ef.counter("exa_gateway_tokenize_requests_total", map[string]string{"model": testModel}))
	require.Equal(t, uint64(2), ef.histCount("exa_gateway_tokenize_seconds", map[string]string{"model": testModel}))
	var cached float64
	for _, s := range ef.series("exa_gateway_index_cached_blocks", map[string]string{"model": testModel, "replica": "e1"}) {
		cached = s.GetGauge().GetValue()
	}
	require.Equal(t, 2.0, cached)
}

func TestExactFallbacks(t *testing.T) {
	ef := newExactFixture(t, 4)
	for _, tc := range []struct {
		name, body, reason string
	}{
		{"tokenizer fails", `{"model":"m1","prompt":"fail now a b c d"}`, "tokenize_error"},
		{"shorter than a block", `{"model":"m1","prompt":"a b c"}`, "short_prompt"},
		{"empty prompt", `{"model":"m1","prompt":""}`, "short_prompt"},
		{"list of prompts", `{"model":"m1","prompt":["a b c d e","f g h i"]}`, "unsupported"},
		{"list of token arrays", `{"model":"m1","prompt":[[1,2,3,4,5]]}`, "unsupported"},
		{"cache salt", `{"model":"m1","prompt":"a b c d e f","cache_salt":"tenant-7"}`, "unsupported"},
		{"special tokens left out", `{"model":"m1","prompt":"a b c d e f","add_special_tokens":false}`, "unsupported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ef.counter("exa_gateway_exact_fallbacks_total", map[string]string{"model": testModel, "reason": tc.reason})
			_, dec := ef.complete(tc.body)
			require.Contains(t, dec, "; index=exact; fallback="+tc.reason)
			require.Contains(t, dec, "matched=0/", "the approximate key matches nothing in the exact index")
			require.Equal(t, before+1, ef.counter("exa_gateway_exact_fallbacks_total", map[string]string{"model": testModel, "reason": tc.reason}))
		})
	}
	resp := ef.post("/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b c d e"}],"continue_final_message":true,"add_generation_prompt":false}`)
	readAll(t, resp)
	require.Contains(t, resp.Header.Get(HeaderDecision), "fallback=unsupported")
	resp = ef.post("/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b c d e"}],"add_generation_prompt":true,"continue_final_message":false,"cache_salt":null}`)
	readAll(t, resp)
	require.Equal(t, "load_aware; matched=0/1; index=exact", resp.Header.Get(HeaderDecision), "defaults are fine")
	m := ef.stats().Models[testModel].KVEvents
	require.Equal(t, uint64(1), m.Tokenize.Errors)
	require.Equal(t, uint64(1), m.Fallbacks["tokenize_error"])
	require.Equal(t, uint64(2), m.Fallbacks["short_prompt"])
	require.Equal(t, uint64(5), m.Fallbacks["unsupported"])
}

// TestExactReload: a replica added to another model on the same engine
// gets the blocks the index holds; an engine removed from the
// configuration, or ejected, leaves the index; a new block size resets.
func TestExactReload(t *testing.T) {
	ef := newExactFixture(t, 4)
	prompt := words("doc", 8)
	ef.store(0, 1, 100, wordTokens(prompt), 4)
	ef.store(1, 1, 200, wordTokens(words("other", 8)), 4)
	held := func(model, replica string) int {
		for _, r := range ef.srv.Snapshot().Models[model].Gateway.Replicas() {
			if r.Name == replica {
				return r.CachedBlocks
			}
		}
		return -1
	}
	require.Equal(t, 2, held(testModel, "e0"))

	// A second model served by e0: it gets e0's blocks at once.
	second := ef.cfg
	second.Replicas = ef.cfg.Replicas[:1]
	f := &config.File{Version: 1, Models: map[string]config.Model{testModel: ef.cfg, "m2": second}}
	require.NoError(t, ef.srv.Apply(f))
	require.Equal(t, 2, held("m2", "e0"), "replayed")
	ef.store(0, 2, 300, wordTokens(words("more", 4)), 4)
	require.Equal(t, 3, held("m2", "e0"), "and follows the engine's events")
	require.Equal(t, 3, held(testModel, "e0"))

	// e1 leaves the configuration: its engine is reset and forgotten,
	// its blocks and figures with it.
	only := ef.cfg
	only.Replicas = ef.cfg.Replicas[:1]
	engines, glob := ef.srv.KVStats()
	require.Len(t, engines, 2)
	require.Equal(t, int64(5), glob.Mapped)
	require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: only, "m2": second}}))
	engines, glob = ef.srv.KVStats()
	for _, e := range engines {
		require.NotEqual(t, ef.pod(1), e.Source.Pod, "e1's engine is forgotten")
	}
	require.Equal(t, int64(3), glob.Mapped, "e1's blocks left the count")

	// e0 is ejected: its blocks leave both models' indexes.
	ep := ef.srv.Snapshot().Models[testModel].ByName["e0"]
	for ep.Health.Healthy() {
		ef.srv.Observe(ep, ep.Health.Failure(true))
	}
	require.Zero(t, held(testModel, "e0"))
	require.Zero(t, held("m2", "e0"))

	// Its events are heard afresh (a new sequence is no gap).
	ef.store(0, 1, 400, wordTokens(words("fresh", 4)), 4)
	require.Equal(t, 1, held(testModel, "e0"))

	// A new block size: a fresh gateway, and the engine reset.
	bigger := only
	bigger.BlockSize = 8
	require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: bigger}}))
	require.Zero(t, held(testModel, "e0"))
	ef.store(0, 2, 500, wordTokens(words("eight", 8)), 4)
	engines, _ = ef.srv.KVStats()
	for _, e := range engines {
		if e.Source.Pod == ef.pod(0) {
			require.Equal(t, uint64(1), e.DroppedBlockSize, "events of the old block size are dropped")
		}
	}
}

func TestExactBindFailureChangesNothing(t *testing.T) {
	ef := newExactFixture(t, 4)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := "tcp://" + l.Addr().String()
	other := ef.cfg
	other.KVEventsBind = taken
	err = ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: ef.cfg, "m2": other}})
	var fe *config.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "models.m2.kv_events_bind", fe.Field)
	require.Equal(t, taken, fe.Value)
	// The error names the endpoint and the fix.
	require.Contains(t, err.Error(), taken)
	require.Contains(t, err.Error(), "only one process can bind a KV-event endpoint")
	require.Contains(t, err.Error(), "exa serve routing set m2 --kv-events-bind \"\" --kv-events-connect")
	require.NotContains(t, ef.srv.Snapshot().Models, "m2")
	eps := ef.srv.KVEndpoints()
	require.Len(t, eps, 1)
	require.Equal(t, ef.bind, eps[0].Endpoint)
}

// TestExactOverZMQ: events published over ZMQ reach the index, both where
// the gateway listens (bind) and from a publisher it dials (connect).
func TestExactOverZMQ(t *testing.T) {
	ef := newExactFixture(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmqPub(ctx, t)
	require.NoError(t, pub.Dial(ef.bind))
	held := func(replica string) int {
		for _, r := range ef.srv.Snapshot().Models[testModel].Gateway.Replicas() {
			if r.Name == replica {
				return r.CachedBlocks
			}
		}
		return -1
	}
	// A PUB drops what it sends before the subscription reaches it:
	// resend until the index has the block, each time under the next
	// sequence number, as an engine does. (Resent under the same number,
	// a copy arriving after the first was applied is a restart, which
	// clears the engine, and so is every copy after it: the test failed
	// whenever it missed the moment between the two, about 1 run in 12
	// with -race on a busy machine.)
	seq := uint64(0)
	waitFor(t, func() bool {
		seq++
		_ = pub.Send(zmqMsg(eventFrames(t, "kv@"+ef.pod(0)+"@m1", seq, storedEvent([]uint64{1}, nil, wordTokens(words("z", 4)), 4))))
		return held("e0") == 1
	})
	engines, _ := ef.srv.KVStats()
	for _, e := range engines {
		require.Zero(t, e.Restarts, "%s", e.Source.Topic)
	}

	// Connect mode: e1 publishes on its own endpoint.
	pub2 := zmqPub(ctx, t)
	ep2 := freeTCP(t)
	require.NoError(t, pub2.Listen(ep2))
	cfg := ef.cfg
	cfg.Replicas = append([]config.Replica(nil), ef.cfg.Replicas...)
	cfg.Replicas[1].KVEvents = ep2
	require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	seq = 0
	waitFor(t, func() bool {
		seq++
		_ = pub2.Send(zmqMsg(eventFrames(t, "", seq, storedEvent([]uint64{seq}, nil, wordTokens(words(fmt.Sprint("y", seq), 4)), 4))))
		return held("e1") > 0
	})
	eps := ef.srv.KVEndpoints()
	require.Len(t, eps, 2)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		require.False(t, time.Now().After(deadline), "timed out")
	}
}

func zmqPub(ctx context.Context, t *testing.T) zmq4.Socket {
	p := zmq4.NewPub(ctx)
	t.Cleanup(func() { p.Close() })
	return p
}

func zmqMsg(frames [][]byte) zmq4.Msg { return zmq4.NewMsgFrom(frames...) }

// TestExactConcurrent: events, requests, stats, reloads and ejections at
// once (run with -race); the index ends consistent with the last
// configuration.
func TestExactConcurrent(t *testing.T) {
	ef := newExactFixture(t, 4)
	second := ef.cfg
	second.Replicas = ef.cfg.Replicas[:1]
	files := []*config.File{
		{Version: 1, Models: map[string]config.Model{testModel: ef.cfg}},
		{Version: 1, Models: map[string]config.Model{testModel: ef.cfg, "m2": second}},
		{Version: 1, Models: map[string]config.Model{testModel: second}},
	}
	var wg sync.WaitGroup
	run := func(n int, f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				f(i)
			}
		}()
	}
	for e := range 2 {
		run(300, func(i int) {
			ef.store(e, uint64(i+1), uint64(1000*i), wordTokens(words(fmt.Sprint("c", e, "-", i%7, "-"), 8)), 4)
		})
	}
	run(100, func(i int) {
		resp := ef.post("/v1/completions", `{"model":"m1","prompt":"`+words(fmt.Sprint("c0-", i%7, "-"), 8)+`"}`)
		readAll(t, resp)
	})
	run(50, func(int) { _ = ef.srv.Stats(); _, _ = ef.reg.Gather() })
	run(60, func(i int) {
		require.NoError(t, ef.srv.Apply(files[i%len(files)]))
		if i%5 == 0 {
			ep := ef.srv.Snapshot().Models[testModel].ByName["e0"]
			ef.srv.Observe(ep, ep.Health.Failure(true))
			ef.srv.Observe(ep, ep.Health.Success(true))
			ef.srv.Observe(ep, ep.Health.Success(true))
		}
	})
	wg.Wait()
	ef.settle()
	require.NoError(t, ef.srv.Apply(files[0]))
	// After the last reload, every replica's index holds no more blocks
	// than its engine's map.
	engines, _ := ef.srv.KVStats()
	mapped := map[string]int{}
	for _, e := range engines {
		if e.Replica != "" {
			mapped[e.Source.Pod] = e.Mapped
		}
	}
	for i, r := range ef.srv.Snapshot().Models[testModel].Gateway.Replicas() {
		require.LessOrEqual(t, r.CachedBlocks, mapped[ef.pod(i)], r.Name)
	}
}

// TestExactTokenizeBudget: with the engines' own /tokenize, a call that
// does not fit Fleet.TokenizeMaxBytes beside the others fails at once:
// its request is still served, keyed without tokens (tokenize_error),
// and the refusal is counted in /stats and /metrics.
func TestExactTokenizeBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		limit    int64
		fallback bool
	}{{"default budget", 0, false}, {"64 bytes", 64, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fixture{t: t, reg: prometheus.NewRegistry()}
			e := enginetest.New(enginetest.Options{Model: testModel, Name: "e0"})
			t.Cleanup(e.Close)
			f.engines = append(f.engines, e)
			s, err := New(Options{Registerer: f.reg, Gatherer: f.reg, Logger: quietLogger(), Fleet: fleet.Options{TokenizeMaxBytes: tc.limit}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			cfg := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, BlockSize: 4, KVEventsBind: freeTCP(t),
				Replicas: []config.Replica{{Name: e.Name(), Address: e.URL()}}}
			require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
			f.srv = s
			f.http = newHTTPTestServer(t, s)
			resp := f.post("/v1/completions", `{"model":"m1","prompt":"`+strings.Repeat("word ", 40)+`"}`)
			readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			dec := resp.Header.Get(HeaderDecision)
			st := f.stats()
			over := f.counter("exa_gateway_tokenize_over_budget_total", nil)
			if !tc.fallback {
				require.NotContains(t, dec, "fallback=")
				require.Zero(t, over)
				require.EqualValues(t, kvevents.DefaultTokenizeBytes, st.KVEvents.TokenizeMaxBytes)
				return
			}
			require.Contains(t, dec, "; index=exact; fallback=tokenize_error")
			require.EqualValues(t, 1, over)
			require.EqualValues(t, 1, st.KVEvents.TokenizeOverBudget)
			require.EqualValues(t, 64, st.KVEvents.TokenizeMaxBytes)
			require.Zero(t, st.KVEvents.TokenizeBytes, "the refused call holds nothing")
		})
	}
}
