package httpgw

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// loraFixture: engines e0 (adapters a, b) and e1 (adapter a) serving
// testModel, cache-aware, adapters discovered.
func loraFixture(t *testing.T, cfg config.Model) *fixture {
	t.Helper()
	f := &fixture{t: t, reg: prometheus.NewRegistry()}
	for i, ad := range [][]string{{"a", "b"}, {"a"}} {
		e := enginetest.New(enginetest.Options{Name: "e" + string(rune('0'+i)), Model: testModel, Adapters: ad})
		t.Cleanup(e.Close)
		f.engines = append(f.engines, e)
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: e.Name(), Address: e.URL()})
	}
	s, err := New(Options{Registerer: f.reg, Gatherer: f.reg, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	s.DiscoverAll(context.Background())
	f.srv = s
	f.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(f.http.Close)
	return f
}

func (f *fixture) models() []fleet.ModelEntry {
	resp, err := http.Get(f.http.URL + "/v1/models")
	require.NoError(f.t, err)
	var l fleet.ModelList
	require.NoError(f.t, json.Unmarshal(readAll(f.t, resp), &l))
	return l.Data
}

func errorOf(t *testing.T, resp *http.Response) apiError {
	var e errorBody
	require.NoError(t, json.Unmarshal(readAll(t, resp), &e))
	return e.Error
}

func TestAdapterResolution(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	require.Equal(t, []fleet.ModelEntry{
		{ID: testModel, Object: "model", OwnedBy: "exa", Root: testModel},
		{ID: "a", Object: "model", OwnedBy: "exa", Root: "a", Parent: testModel},
		{ID: "b", Object: "model", OwnedBy: "exa", Root: "b", Parent: testModel},
	}, f.models())

	// b is served by e0 only: every request for it goes there, its model
	// field unchanged.
	for i := range 6 {
		resp := f.post("/v1/chat/completions", chatBody("b", false, "sys", "question "+string(rune('a'+i))))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "e0", resp.Header.Get(HeaderReplica))
	}
	require.EqualValues(t, 6, f.engines[0].ModelRequests("b"))
	require.Zero(t, f.engines[1].ModelRequests("b"))

	// An unknown name: 404 naming it.
	resp := f.post("/v1/chat/completions", chatBody("zz", false, "sys", "q"))
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	e := errorOf(t, resp)
	require.Equal(t, "not_found_error", e.Type)
	require.Equal(t, "model_not_found", *e.Code)
	require.Equal(t, "model", *e.Param)
	require.Contains(t, e.Message, `"zz" is not served by this gateway: it is neither a configured model nor a LoRA adapter of one`)
}

// TestAdapterSaltsKey: the same prompt under two adapters, or an adapter
// and the base model, is two caches: the second matches nothing.
func TestAdapterSaltsKey(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	body := func(model string) string {
		return chatBody(model, false, "a long shared system prompt of many words", "the same question")
	}
	dec := func(model string) string {
		resp := f.post("/v1/chat/completions", body(model))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp.Header.Get(HeaderDecision)
	}
	first := dec("a")
	require.Contains(t, first, "matched=0/")
	require.NotContains(t, dec("a"), "matched=0/", "the same adapter hits")
	require.Contains(t, dec(testModel), "matched=0/", "the base model does not")
	require.Contains(t, dec("b"), "matched=0/", "nor does another adapter")
}

func TestAdapterAllowList(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeRoundRobin, Adapters: []string{"a", "c"}})
	require.Equal(t, []fleet.ModelEntry{
		{ID: testModel, Object: "model", OwnedBy: "exa", Root: testModel},
		{ID: "a", Object: "model", OwnedBy: "exa", Root: "a", Parent: testModel},
		{ID: "c", Object: "model", OwnedBy: "exa", Root: "c", Parent: testModel},
	}, f.models())
	resp := f.post("/v1/completions", `{"model":"b","prompt":"x"}`)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Contains(t, errorOf(t, resp).Message, `LoRA adapter "b" of model "m1" is not in the model's adapter allow-list (models.m1.adapters)`)
	// c is allowed but listed by no engine: routed over every replica
	// (the fake engines do not know it and answer 404 themselves).
	seen := map[string]bool{}
	for range 8 {
		resp := f.post("/v1/completions", `{"model":"c","prompt":"x"}`)
		readAll(t, resp)
		seen[resp.Header.Get(HeaderReplica)] = true
	}
	require.Equal(t, map[string]bool{"e0": true, "e1": true}, seen)
}

func TestAdapterScrape(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	f.engines[0].SetLoRAInfo(
		`vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 10`,
		`vllm:lora_requests_info{max_lora="1",running_lora_adapters="b",waiting_lora_adapters="a"} 11`)
	f.srv.ScrapeAll(context.Background())
	reps := f.srv.Snapshot().Models[testModel].Gateway.Replicas()
	require.Equal(t, gateway.AdapterReport{Running: []string{"b"}, Waiting: []string{"a"}, MaxLoras: 1}, reps[0].Adapters)
	require.Zero(t, reps[1].Adapters.MaxLoras, "e1 exposes no adapter state")
	st := f.stats()
	for _, es := range st.Engines {
		require.NotNil(t, es.Adapters, es.Address)
		if es.Address == f.engines[0].URL() {
			require.Equal(t, fleet.EngineAdapters{Served: []string{"a", "b"}, Running: []string{"b"}, Waiting: []string{"a"}, MaxLoras: 1}, *es.Adapters)
		} else {
			require.Equal(t, fleet.EngineAdapters{Served: []string{"a"}}, *es.Adapters)
		}
	}
	// e0 runs b with its one slot full, a waiting: a request for a goes
	// to e1, where a slot is free.
	resp := f.post("/v1/chat/completions", chatBody("a", false, "sys", "q"))
	readAll(t, resp)
	require.Equal(t, "e1", resp.Header.Get(HeaderReplica))
}

// TestAdapterDiscoveryFailureKeepsList: a failed discovery keeps the
// engine's last list and says why in /stats.
func TestAdapterDiscoveryFailureKeepsList(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	f.engines[0].Close()
	f.srv.DiscoverAll(context.Background())
	names := []string{}
	for _, m := range f.models() {
		names = append(names, m.ID)
	}
	require.Equal(t, []string{testModel, "a", "b"}, names)
	for _, es := range f.stats().Engines {
		if es.Address == f.engines[0].URL() {
			require.Contains(t, es.Adapters.DiscoveryError, "gateway: engine model list")
			require.Equal(t, []string{"a", "b"}, es.Adapters.Served)
		}
	}
}

// TestAdapterConcurrent: requests for adapters and the base model while
// discoveries, scrapes and reloads run, under -race; every request gets
// an answer from an engine or a 404 while an allow-list refuses it.
func TestAdapterConcurrent(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	f.engines[0].SetLoRAInfo(`vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters=""} 1`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfgs := []config.Model{{Mode: gateway.ModeCacheAware}, {Mode: gateway.ModeCacheAware, Adapters: []string{"a"}}}
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			f.srv.DiscoverAll(ctx)
			f.srv.ScrapeAll(ctx)
			m := cfgs[i%2]
			for _, e := range f.engines {
				m.Replicas = append(m.Replicas, config.Replica{Name: e.Name(), Address: e.URL()})
			}
			_ = f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}})
			_ = f.srv.Stats()
		}
	}()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				model := []string{"a", "b", testModel}[(i+w)%3]
				resp := f.post("/v1/chat/completions", chatBody(model, i%2 == 0, "sys", "q"))
				readAll(t, resp)
				if resp.StatusCode == http.StatusOK {
					continue
				}
				if !(model == "b" && resp.StatusCode == http.StatusNotFound) {
					t.Errorf("%s: status %d", model, resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	bg.Wait()
}

// TestExactAdapterKeys: on the exact index a request for an adapter is
// keyed from the adapter's root, as the engines' events carrying its
// lora_name are: it matches the blocks stored under the adapter, not
// those of the base model, and the base model's request the reverse.
func TestExactAdapterKeys(t *testing.T) {
	ef := newExactFixture(t, 4)
	cfg := ef.cfg
	cfg.Adapters = []string{"a"} // allowed, listed by no engine: any replica
	require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	prompt := words("doc", 12) // 3 blocks of 4
	tokens := wordTokens(prompt)[:8]
	ev := storedEvent([]uint64{100, 101}, nil, tokens, 4)
	ev[7] = "a" // lora_name
	ef.srv.HandleKVFrames(ef.bind, eventFrames(t, "kv@"+ef.pod(1)+"@"+testModel, 1, ev))
	ef.store(0, 1, 200, tokens, 4) // the base model's blocks, on e0

	// The fake engines do not know the adapter and answer 404 themselves:
	// the routing is what is checked.
	resp := ef.post("/v1/completions", `{"model":"a","prompt":"`+prompt+`"}`)
	readAll(t, resp)
	require.Equal(t, "e1", resp.Header.Get(HeaderReplica))
	require.Equal(t, "affinity; matched=2/3; index=exact", resp.Header.Get(HeaderDecision))
	rep, dec := ef.complete(`{"model":"m1","prompt":"` + prompt + `"}`)
	require.Equal(t, "e0", rep)
	require.Equal(t, "affinity; matched=2/3; index=exact", dec)
}

// A pass-through request naming an adapter (embeddings, tokenize with a
// LoRA adapter's tokenizer) goes only to the replicas whose engines serve
// it, as an inference request does: adapter b is served by e0 alone, so
// every one of them reaches e0 and is answered 200, none gets e1's 404.
func TestAdapterPassThroughGoesToItsReplicas(t *testing.T) {
	f := loraFixture(t, config.Model{Mode: gateway.ModeCacheAware})
	for i := range 12 {
		path := "/v1/embeddings"
		body := `{"model":"b","input":"x` + string(rune('a'+i)) + `"}`
		if i%2 == 1 {
			path, body = "/tokenize", `{"model":"b","prompt":"hello `+string(rune('a'+i))+`"}`
		}
		resp := f.post(path, body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d to %s: %s", i, path, b)
		require.Equal(t, "e0", resp.Header.Get(HeaderReplica), "request %d to %s", i, path)
	}
}
