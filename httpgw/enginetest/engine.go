// Package enginetest provides an in-process fake model server that speaks
// enough of vLLM's HTTP API for gateway tests: /v1/chat/completions and
// /v1/completions (plain and streamed), /v1/embeddings, /tokenize,
// /detokenize, /v1/models, /health and a /metrics page with vLLM's metric
// names (or SGLang's or TensorRT-LLM's, Options.Metrics), backed by a
// prefix cache over whitespace-separated words. It answers at once; tests steer it with
// failure switches and gates rather than timing.
package enginetest

import (
	"bytes"
	"container/list"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Options configures an Engine. The zero value is usable.
type Options struct {
	// Name labels the engine in responses (header X-Engine); default
	// the listen address.
	Name string
	// Model is the served model name; "" accepts any model.
	Model string
	// BlockWords is how many prompt words make one cache block; default 4.
	BlockWords int
	// CacheBlocks is the prefix cache's capacity in blocks (least recently
	// used blocks are evicted); default 65536.
	CacheBlocks int
	// Chunks is how many content chunks a streamed answer has; default 3.
	Chunks int
	// Adapters are LoRA adapters the engine serves: /v1/models lists them
	// with the model as parent, and requests may name them. Each adapter
	// has its own prefix cache, as vLLM keys blocks by adapter.
	Adapters []string
	// Metrics is the engine type whose load metric names /metrics uses:
	// "" or "vllm" (vllm:num_requests_waiting, ...), "sglang"
	// (sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage,
	// labelled as SGLang labels them) or "trtllm" (Triton TensorRT-LLM's
	// nv_trt_llm_request_metrics and nv_trt_llm_kv_cache_block_metrics).
	// The prefix-cache counters and vllm:lora_requests_info stay vLLM's.
	Metrics string
	// RequireJSON makes POST requests without Content-Type
	// application/json answer 400, as vLLM's server (FastAPI) does;
	// default off (lenient, as most tests send none).
	RequireJSON bool
}

// Engine is a fake vLLM server on a loopback port. Its methods are safe
// for concurrent use.
type Engine struct {
	opts Options
	addr string

	mu      sync.Mutex
	srv     *httptest.Server
	cache   map[uint64]*list.Element
	lru     *list.List
	waiting int
	running int
	kv      float64
	gate    chan struct{}
	gate0   chan struct{} // GateFirst's

	seed      maphash.Seed
	healthy   atomic.Bool
	fail5xx   atomic.Int32
	breakAt   atomic.Int32
	requests  atomic.Int64
	hitTokens atomic.Int64
	queries   atomic.Int64
	canceled  atomic.Int64
	gated     chan struct{}
	cancelCh  chan struct{}
	byModel   map[string]int64 // requests per "model" field, under mu
	lora      string           // the lora_requests_info series, under mu
	byPath    map[string]int64 // requests per path, under mu
	lastHdr   http.Header      // the last request's headers, under mu
	lastBody  []byte           // the last POST body, under mu
	responses map[string]bool  // ids of the responses it stored, under mu
	respN     int              // responses it produced, under mu
}

// New starts an Engine on 127.0.0.1 and returns it; Close stops it.
func New(opts Options) *Engine {
	if opts.BlockWords <= 0 {
		opts.BlockWords = 4
	}
	if opts.CacheBlocks <= 0 {
		opts.CacheBlocks = 65536
	}
	if opts.Chunks <= 0 {
		opts.Chunks = 3
	}
	e := &Engine{opts: opts, cache: map[uint64]*list.Element{}, lru: list.New(), seed: maphash.MakeSeed(),
		gated: make(chan struct{}, 1024), cancelCh: make(chan struct{}, 1024)}
	e.healthy.Store(true)
	e.start("127.0.0.1:0")
	return e
}

func (e *Engine) start(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		panic(fmt.Sprintf("enginetest: listen %s: %v", addr, err))
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(e.serve))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	e.mu.Lock()
	e.srv = srv
	e.addr = l.Addr().String()
	if e.opts.Name == "" {
		e.opts.Name = e.addr
	}
	e.mu.Unlock()
}

// URL returns the engine's base URL, e.g. http://127.0.0.1:41234.
func (e *Engine) URL() string { return "http://" + e.addr }

// Name returns the engine's name.
func (e *Engine) Name() string { return e.opts.Name }

// Close stops the engine, cutting open connections.
func (e *Engine) Close() {
	e.mu.Lock()
	srv := e.srv
	e.srv = nil
	e.mu.Unlock()
	if srv != nil {
		srv.CloseClientConnections()
		srv.Close()
	}
}

// Restart starts a stopped engine again on the same address, with its
// cache emptied, as a restarted model server would be.
func (e *Engine) Restart() {
	e.mu.Lock()
	e.cache = map[uint64]*list.Element{}
	e.lru.Init()
	e.mu.Unlock()
	e.start(e.addr)
}

// SetHealthy makes /health answer 200 (true) or 503 (false).
func (e *Engine) SetHealthy(ok bool) { e.healthy.Store(ok) }

// FailNext makes the next n inference requests answer 500.
func (e *Engine) FailNext(n int) { e.fail5xx.Store(int32(n)) }

// BreakStreams makes answers stop after n chunks by cutting the
// connection (n >= 1); 0 turns it off.
func (e *Engine) BreakStreams(n int) { e.breakAt.Store(int32(n)) }

// SetLoad sets the values /metrics reports for vllm:num_requests_waiting,
// vllm:num_requests_running and vllm:kv_cache_usage_perc (or the series
// of Options.Metrics' engine type).
func (e *Engine) SetLoad(waiting, running int, kv float64) {
	e.mu.Lock()
	e.waiting, e.running, e.kv = waiting, running, kv
	e.mu.Unlock()
}

// Gate makes streamed answers pause after their first chunk until the
// returned function is called. Gated returns a channel that receives once
// per request reaching the gate.
func (e *Engine) Gate() (release func()) { return e.setGate(&e.gate) }

// GateFirst makes streamed answers pause before their first chunk (the
// status and headers sent) until the returned function is called; each
// reaching it is reported on Gated too.
func (e *Engine) GateFirst() (release func()) { return e.setGate(&e.gate0) }

// setGate sets the gate *g, a field of e, and returns its release.
func (e *Engine) setGate(g *chan struct{}) (release func()) {
	ch := make(chan struct{})
	e.mu.Lock()
	*g = ch
	e.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(ch)
			e.mu.Lock()
			if *g == ch {
				*g = nil
			}
			e.mu.Unlock()
		})
	}
}

// pass waits at gate (nil: none) after telling Gated, and reports
// whether the request may go on: false if its client went away.
func (e *Engine) pass(gate chan struct{}, r *http.Request) bool {
	if gate == nil {
		return true
	}
	e.gated <- struct{}{}
	select {
	case <-gate:
		return true
	case <-r.Context().Done():
		e.noteCanceled()
		return false
	}
}

// Gated receives once for each streamed request waiting at the gate.
func (e *Engine) Gated() <-chan struct{} { return e.gated }

// Requests counts inference requests received.
func (e *Engine) Requests() int64 { return e.requests.Load() }

// PrefixHits is vllm:prefix_cache_hits: prompt tokens found in the cache.
func (e *Engine) PrefixHits() int64 { return e.hitTokens.Load() }

// PrefixQueries is vllm:prefix_cache_queries: prompt tokens looked up.
func (e *Engine) PrefixQueries() int64 { return e.queries.Load() }

// Canceled counts requests whose client went away before the answer was
// complete.
func (e *Engine) Canceled() int64 { return e.canceled.Load() }

// CanceledC receives once for each request whose client went away before
// the answer was complete.
func (e *Engine) CanceledC() <-chan struct{} { return e.cancelCh }

func (e *Engine) noteCanceled() {
	e.canceled.Add(1)
	select {
	case e.cancelCh <- struct{}{}:
	default:
	}
}

func (e *Engine) serve(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Method == http.MethodPost {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	e.mu.Lock()
	if e.byPath == nil {
		e.byPath = map[string]int64{}
	}
	e.byPath[r.URL.Path]++
	e.lastHdr = r.Header.Clone()
	if body != nil {
		e.lastBody = body
	}
	e.mu.Unlock()
	switch r.URL.Path {
	case "/health":
		if !e.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case "/metrics":
		e.serveMetrics(w)
	case "/v1/models":
		name := e.opts.Model
		if name == "" {
			name = "any"
		}
		data := []any{map[string]any{"id": name, "object": "model", "owned_by": "vllm", "root": "/models/" + name, "parent": nil, "max_model_len": MaxModelLen}}
		for _, a := range e.opts.Adapters {
			data = append(data, map[string]any{"id": a, "object": "model", "owned_by": "vllm", "root": "/adapters/" + a, "parent": name})
		}
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize":
		if e.opts.RequireJSON && r.Method == http.MethodPost && !isJSON(r.Header.Get("Content-Type")) {
			// vLLM's server (FastAPI) does not read a body that is not
			// declared JSON.
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
				"message": "Content-Type must be application/json", "type": "BadRequestError", "code": 400}})
			return
		}
		if r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions" {
			e.serveInference(w, r, r.URL.Path == "/v1/chat/completions")
			return
		}
		e.serveAux(w, r, body)
	case "/v1/responses":
		e.serveResponses(w, body)
	default:
		if strings.HasPrefix(r.URL.Path, "/v1/responses/") {
			e.serveStored(w, r)
			return
		}
		http.NotFound(w, r)
	}
}

// serveResponses answers POST /v1/responses as vLLM's Responses API does
// with store=true: each response gets an id ("resp_" then the engine's
// name and a count) that this engine alone remembers, and a request
// continuing one (previous_response_id) this engine does not hold gets
// 404. The answer echoes the input; "stream": true streams it as
// response.created, response.output_text.delta and response.completed
// events.
func (e *Engine) serveResponses(w http.ResponseWriter, body []byte) {
	e.requests.Add(1)
	w.Header().Set("X-Engine", e.opts.Name)
	var req struct {
		Model    string          `json:"model"`
		Input    json.RawMessage `json:"input"`
		Previous string          `json:"previous_response_id"`
		Stream   bool            `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": err.Error(), "type": "invalid_request_error"}})
		return
	}
	e.mu.Lock()
	if e.responses == nil {
		e.responses = map[string]bool{}
	}
	if req.Previous != "" && !e.responses[req.Previous] {
		e.mu.Unlock()
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": "Response with id '" + req.Previous + "' not found.", "type": "invalid_request_error", "param": "previous_response_id"}})
		return
	}
	e.respN++
	id := fmt.Sprintf("resp_%s_%d", e.opts.Name, e.respN)
	e.responses[id] = true
	e.mu.Unlock()
	text := "echo: " + string(req.Input)
	resp := map[string]any{"id": id, "object": "response", "model": req.Model, "status": "completed",
		"previous_response_id": req.Previous,
		"output":               []any{map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": text}}}},
		"usage":                map[string]any{"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
	if !req.Stream {
		writeJSON(w, http.StatusOK, resp)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, ev := range []map[string]any{
		{"type": "response.created", "response": map[string]any{"id": id, "object": "response", "model": req.Model, "status": "in_progress"}},
		{"type": "response.output_text.delta", "delta": text},
		{"type": "response.completed", "response": resp},
	} {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// serveStored answers the requests about a stored response as vLLM's
// Responses API does: GET /v1/responses/{id} (the response), DELETE (it
// is forgotten), POST .../cancel (its status "cancelled"), GET
// .../input_items (an empty list); 404 for a response this engine does
// not hold, 405 for another method.
func (e *Engine) serveStored(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Engine", e.opts.Name)
	id, op, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/")
	want := map[string]string{"": "GET DELETE", "cancel": "POST", "input_items": "GET"}[op]
	if want == "" || !slices.Contains(strings.Fields(want), r.Method) {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"error": map[string]any{"message": "method not allowed", "type": "invalid_request_error"}})
		return
	}
	e.mu.Lock()
	held := e.responses[id]
	if held && r.Method == http.MethodDelete {
		delete(e.responses, id)
	}
	e.mu.Unlock()
	if !held {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": "Response with id '" + id + "' not found.", "type": "invalid_request_error", "param": "response_id"}})
		return
	}
	switch {
	case r.Method == http.MethodDelete:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
	case op == "input_items":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{}, "has_more": false})
	default:
		status := "completed"
		if op == "cancel" {
			status = "cancelled"
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "model": e.opts.Model, "status": status, "output": []any{}})
	}
}

func (e *Engine) serveMetrics(w http.ResponseWriter) {
	e.mu.Lock()
	waiting, running, kv := e.waiting, e.running, e.kv
	e.mu.Unlock()
	m := e.opts.Model
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	switch e.opts.Metrics {
	case "sglang":
		l := fmt.Sprintf(`{engine_type="unified",model_name=%q,pp_rank="0",tp_rank="0"}`, m)
		fmt.Fprintf(w, "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs%s %d.0\n", l, running)
		fmt.Fprintf(w, "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs%s %d.0\n", l, waiting)
		fmt.Fprintf(w, "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\nsglang:token_usage%s %g\n", l, kv)
	case "trtllm":
		fmt.Fprintf(w, "# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n# TYPE nv_trt_llm_request_metrics gauge\n")
		fmt.Fprintf(w, "nv_trt_llm_request_metrics{model=%q,request_type=\"scheduled\",version=\"1\"} %d\n", m, running)
		fmt.Fprintf(w, "nv_trt_llm_request_metrics{model=%q,request_type=\"waiting\",version=\"1\"} %d\n", m, waiting)
		fmt.Fprintf(w, "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics\n# TYPE nv_trt_llm_kv_cache_block_metrics gauge\n")
		fmt.Fprintf(w, "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=%q,version=\"1\"} %g\n", m, kv)
	default:
		fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=%q} %d\n", m, waiting)
		fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=%q} %d\n", m, running)
		fmt.Fprintf(w, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=%q} %g\n", m, kv)
	}
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.\n# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits{model_name=%q} %d\n", m, e.hitTokens.Load())
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.\n# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries{model_name=%q} %d\n", m, e.queries.Load())
	e.mu.Lock()
	lora := e.lora
	e.mu.Unlock()
	if lora != "" {
		fmt.Fprintf(w, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n%s", lora)
	}
}

// SetLoRAInfo sets the vllm:lora_requests_info series /metrics shows:
// each line a series, such as
// vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters=""} 1.7e+09.
func (e *Engine) SetLoRAInfo(lines ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lora = ""
	for _, l := range lines {
		e.lora += l + "\n"
	}
}

// isJSON reports whether a Content-Type is application/json (any
// parameters, any case).
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// PathRequests returns how many requests came to path (any method).
func (e *Engine) PathRequests(path string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byPath[path]
}

// LastRequest returns the headers and (for a POST) body of the last
// request received.
func (e *Engine) LastRequest() (http.Header, []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastHdr.Clone(), slices.Clone(e.lastBody)
}

// MaxModelLen is the max_model_len the engine reports in /tokenize
// answers and /v1/models.
const MaxModelLen = 4096

// serveAux answers /v1/embeddings, /tokenize and /detokenize as vLLM
// shapes them: an embedding of two numbers per request, the prompt's
// words as tokens (one id per word, its position), and the words back.
func (e *Engine) serveAux(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("X-Engine", e.opts.Name)
	if r.Method != http.MethodPost {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"error": map[string]any{"message": "POST only", "type": "invalid_request_error"}})
		return
	}
	if n := e.fail5xx.Load(); n > 0 && e.fail5xx.CompareAndSwap(n, n-1) {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": "injected failure", "type": "server_error"}})
		return
	}
	var req struct {
		Model  *string         `json:"model"`
		Input  json.RawMessage `json:"input"`
		Prompt string          `json:"prompt"`
		Tokens []int           `json:"tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": err.Error(), "type": "invalid_request_error"}})
		return
	}
	model := e.opts.Model
	if req.Model != nil {
		model = *req.Model
	}
	if e.opts.Model != "" && model != e.opts.Model && !slices.Contains(e.opts.Adapters, model) {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"message": "model " + model + " not found", "type": "not_found_error"}})
		return
	}
	switch r.URL.Path {
	case "/v1/embeddings":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "model": model,
			"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.25, -0.5}}},
			"usage": map[string]any{"prompt_tokens": 1, "total_tokens": 1}})
	case "/tokenize":
		words := strings.Fields(req.Prompt)
		toks := make([]int, len(words))
		for i := range toks {
			toks[i] = i
		}
		writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": MaxModelLen, "tokens": toks, "token_strs": nil})
	case "/detokenize":
		words := make([]string, len(req.Tokens))
		for i, t := range req.Tokens {
			words[i] = fmt.Sprintf("w%d", t)
		}
		writeJSON(w, http.StatusOK, map[string]any{"prompt": strings.Join(words, " ")})
	}
}

// ModelRequests returns how many inference requests named model in their
// "model" field.
func (e *Engine) ModelRequests(model string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byModel[model]
}

type request struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (e *Engine) serveInference(w http.ResponseWriter, r *http.Request, chat bool) {
	e.requests.Add(1)
	w.Header().Set("X-Engine", e.opts.Name)
	if n := e.fail5xx.Load(); n > 0 && e.fail5xx.CompareAndSwap(n, n-1) {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": "injected failure", "type": "server_error"}})
		return
	}
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": err.Error(), "type": "invalid_request_error"}})
		return
	}
	adapter := slices.Contains(e.opts.Adapters, req.Model)
	if e.opts.Model != "" && req.Model != e.opts.Model && !adapter {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"message": "model " + req.Model + " not found", "type": "not_found_error"}})
		return
	}
	e.mu.Lock()
	if e.byModel == nil {
		e.byModel = map[string]int64{}
	}
	e.byModel[req.Model]++
	e.mu.Unlock()
	var text strings.Builder
	for _, m := range req.Messages {
		text.WriteString(m.Role)
		text.WriteString(": ")
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			text.WriteString(s)
		} else {
			text.Write(m.Content)
		}
		text.WriteString("\n")
	}
	if len(req.Prompt) > 0 {
		var s string
		if json.Unmarshal(req.Prompt, &s) == nil {
			text.WriteString(s)
		} else {
			text.Write(req.Prompt)
		}
	}
	words := strings.Fields(text.String())
	if adapter {
		// An adapter's blocks are its own: salt the first word.
		words = append([]string{"\x00lora:" + req.Model}, words...)
	}
	cached := e.lookupAndStore(words)
	if adapter {
		words = words[1:]
		cached = max(cached-1, 0)
	}
	e.queries.Add(int64(len(words)))
	e.hitTokens.Add(int64(cached))

	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	usage := map[string]any{"prompt_tokens": len(words), "completion_tokens": e.opts.Chunks,
		"total_tokens": len(words) + e.opts.Chunks, "prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	breakAt := int(e.breakAt.Load())
	if !req.Stream {
		body, _ := json.Marshal(map[string]any{"id": "fake-1", "object": object, "model": req.Model,
			"choices": []any{choice(chat, "ok", false)}, "usage": usage})
		if breakAt > 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body[:len(body)/2])
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	e.mu.Lock()
	gate, gate0 := e.gate, e.gate0
	e.mu.Unlock()
	if gate0 != nil {
		_ = rc.Flush()
		if !e.pass(gate0, r) {
			return
		}
	}
	for i := 0; i < e.opts.Chunks; i++ {
		if breakAt > 0 && i == breakAt {
			panic(http.ErrAbortHandler)
		}
		chunkObject := object // vLLM's completions chunks are "text_completion" too
		if chat {
			chunkObject += ".chunk"
		}
		chunk, _ := json.Marshal(map[string]any{"id": "fake-1", "object": chunkObject, "model": req.Model,
			"choices": []any{choice(chat, fmt.Sprintf("tok%d ", i), true)}})
		if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
			e.noteCanceled()
			return
		}
		_ = rc.Flush()
		if i == 0 && !e.pass(gate, r) {
			return
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		// As vLLM: a last chunk with no choices and the usage.
		chunkObject := object
		if chat {
			chunkObject += ".chunk"
		}
		chunk, _ := json.Marshal(map[string]any{"id": "fake-1", "object": chunkObject, "model": req.Model,
			"choices": []any{}, "usage": usage})
		fmt.Fprintf(w, "data: %s\n\n", chunk)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

func choice(chat bool, text string, delta bool) map[string]any {
	c := map[string]any{"index": 0, "finish_reason": "stop"}
	switch {
	case chat && delta:
		c["delta"] = map[string]any{"content": text}
	case chat:
		c["message"] = map[string]any{"role": "assistant", "content": text}
	default:
		c["text"] = text
	}
	return c
}

// lookupAndStore returns how many leading words of the prompt are cached
// in whole blocks, then caches all of its whole blocks.
func (e *Engine) lookupAndStore(words []string) int {
	bw := e.opts.BlockWords
	var h maphash.Hash
	h.SetSeed(e.seed)
	e.mu.Lock()
	defer e.mu.Unlock()
	cached, matching := 0, true
	for i := 0; i+bw <= len(words); i += bw {
		for _, w := range words[i : i+bw] {
			h.WriteString(w)
			h.WriteByte(0)
		}
		k := h.Sum64()
		if el, ok := e.cache[k]; ok {
			e.lru.MoveToFront(el)
			if matching {
				cached += bw
			}
			continue
		}
		matching = false
		e.cache[k] = e.lru.PushFront(k)
		for e.lru.Len() > e.opts.CacheBlocks {
			old := e.lru.Back()
			e.lru.Remove(old)
			delete(e.cache, old.Value.(uint64))
		}
	}
	return cached
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
