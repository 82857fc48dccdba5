package httpgw

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// TestShedAtTheGateway: with admission on, a request for a model whose
// every replica has a queue at the threshold is shed with 429, an OpenAI
// rate_limit_error and Retry-After, reaching no engine, and counted; once
// a replica has room again it is served.
func TestShedAtTheGateway(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, func(o *Options) {
		o.Admission = gateway.Admission{QueueDepth: 3}
	})
	for _, e := range f.engines {
		e.SetLoad(5, 1, 0.2)
	}
	f.srv.ScrapeAll(t.Context())
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(b), `"type":"rate_limit_error"`)
	assert.Contains(t, string(b), `queue \u003e= 3`) // JSON escapes >
	for _, e := range f.engines {
		assert.Zero(t, e.Requests(), "a shed request reaches no engine")
	}
	f.settle()
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "429", "reason": "shed"}))

	f.engines[1].SetLoad(1, 1, 0.2)
	f.srv.ScrapeAll(t.Context())
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "e1", resp.Header.Get(HeaderReplica))
}

// TestShedPassThrough (issue 29, N5): while a model is shed, its
// pass-through requests (/v1/embeddings, /tokenize, /detokenize) get the
// same 429, reach no engine and are counted as shed; with room again
// they are served.
func TestShedPassThrough(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, func(o *Options) {
		o.Admission = gateway.Admission{QueueDepth: 3}
	})
	for _, e := range f.engines {
		e.SetLoad(5, 1, 0.2)
	}
	f.srv.ScrapeAll(t.Context())
	bodies := map[string]string{
		"/v1/embeddings": `{"model":"` + testModel + `","input":"hi"}`,
		"/tokenize":      `{"model":"` + testModel + `","prompt":"hi"}`,
		"/detokenize":    `{"model":"` + testModel + `","tokens":[1,2]}`,
	}
	for path, body := range bodies {
		resp := f.post(path, body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", path, b)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"), path)
		assert.Contains(t, string(b), `"type":"rate_limit_error"`, path)
	}
	for _, e := range f.engines {
		assert.Zero(t, e.Requests(), "a shed request reaches no engine")
	}
	f.settle()
	for _, ep := range []string{"embeddings", "tokenize", "detokenize"} {
		assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": ep, "code": "429", "reason": "shed"}), ep)
	}

	f.engines[1].SetLoad(1, 1, 0.2)
	f.srv.ScrapeAll(t.Context())
	for path, body := range bodies {
		resp := f.post(path, body)
		b := readAll(t, resp)
		assert.NotEqual(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", path, b)
		assert.Equal(t, "e1", resp.Header.Get(HeaderReplica), path)
	}
}
