package httpgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pending returns the gateway's pending prefill at each replica of
// testModel, by name.
func (f *fixture) pending() map[string]int {
	return fronttest.PendingPrefill(f.srv.Snapshot().Models[testModel].Gateway)
}

// A non-streamed request is streamed from the engine: its pending prefill
// is released at the first chunk, while the answer is still being
// generated (the engine holds it at its gate), and the client gets the
// non-streamed JSON answer, usage included. With UpstreamStreamOff the
// engine gets the body as sent and answers whole.
func TestUpstreamStreamFirstToken(t *testing.T) {
	long := strings.Repeat("a long uncached prompt ", 40)
	for _, kind := range []string{"chat", "completions"} {
		t.Run(kind, func(t *testing.T) {
			f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{Chunks: 3})
			release := f.engines[0].Gate()
			path, body := "/v1/chat/completions", chatBody(testModel, false, "sys", long)
			if kind == "completions" {
				path, body = "/v1/completions", `{"model":"`+testModel+`","prompt":"`+long+`"}`
			}
			done := make(chan *http.Response, 1)
			go func() { done <- f.post(path, body) }()
			<-f.engines[0].Gated() // the first chunk is sent, the rest held
			require.Eventually(t, func() bool { return f.pending()["e0"] == 0 }, 10*time.Second, time.Millisecond,
				"pending prefill released at the first chunk")
			select {
			case <-done:
				t.Fatal("the answer came before the engine finished")
			default:
			}
			release()
			resp := <-done
			choice := fronttest.AssembledAnswer(t, kind, resp, readAll(t, resp))
			assert.Equal(t, "stop", choice["finish_reason"])
			assert.Equal(t, 1.0, f.counter("exa_gateway_upstream_streamed_total", map[string]string{"endpoint": kind}))
			assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "200"}))
		})
	}
	t.Run("off", func(t *testing.T) {
		f := newFixtureOpts(t, 1, gateway.ModeCacheAware, enginetest.Options{}, Options{UpstreamStream: UpstreamStreamOff})
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", long))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(b), `"content":"ok"`, "the engine's own non-streamed answer")
		assert.Zero(t, f.counter("exa_gateway_upstream_streamed_total", nil))
	})
}

// Pending prefill is held until the engine's first chunk, then released
// while the rest of the answer is still to come.
func TestUpstreamStreamPendingUntilFirstChunk(t *testing.T) {
	arrived, first, rest := make(chan struct{}), make(chan struct{}), make(chan struct{})
	addr := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllReq(r)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush() // headers at once, as vLLM
		arrived <- struct{}{}
		<-first
		fmt.Fprint(w, "data: "+`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}`+"\n\n")
		http.NewResponseController(w).Flush()
		<-rest
		fmt.Fprint(w, sse(`{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}`))
	})).URL
	f := rawFixture(t, Options{}, addr)
	name := f.srv.Snapshot().Models[testModel].Order[0]
	done := make(chan []byte, 1)
	go func() {
		done <- readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, "sys", strings.Repeat("uncached ", 100))))
	}()
	<-arrived
	before := f.pending()[name]
	assert.Positive(t, before, "prefill pending while the engine prefills")
	close(first)
	require.Eventually(t, func() bool { return f.pending()[name] == 0 }, 10*time.Second, time.Millisecond,
		"pending prefill released at the first chunk, before the answer is complete")
	close(rest)
	assert.JSONEq(t, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"logprobs":null,"finish_reason":"stop"}]}`, string(<-done))
}

// A streamed request, and an unknown mode, are left alone.
func TestUpstreamStreamLeavesStreams(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	b := readAll(t, resp)
	assert.True(t, strings.HasPrefix(string(b), "data: "), "%s", b)
	assert.Zero(t, f.counter("exa_gateway_upstream_streamed_total", nil))
	_, err := New(Options{UpstreamStream: 7})
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.Contains(t, err.Error(), "UpstreamStream 7")
}

// The body sent to the engine ends with the stream members, the client's
// own removed; bodies asking for beam search or best_of are not streamed.
func TestUpstreamStreamBody(t *testing.T) {
	var got []string
	addr := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, readAllReq(r))
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, sse(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`))
	})).URL
	f := rawFixture(t, Options{}, addr)
	for _, body := range []string{
		`{"model":"` + testModel + `","stream":false,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"q"}]}  ` + "\n",
		`{"model":"` + testModel + `","best_of":2,"messages":[{"role":"user","content":"q"}]}`,
		`{"model":"` + testModel + `" , "messages":[{"role":"user","content":"q"}] }`,
	} {
		resp := f.post("/v1/chat/completions", body)
		readAll(t, resp)
	}
	require.Len(t, got, 3)
	assert.Equal(t, `{"model":"`+testModel+`" , "messages":[{"role":"user","content":"q"}] ,"stream":true,"stream_options":{"include_usage":true}}`, got[2],
		"a body without stream members: appended, the rest byte for byte")
	assert.Equal(t, `{"model":"`+testModel+`","messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}`, got[0],
		"the client's stream members removed, the gateway's appended")
	var last struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	require.NoError(t, json.Unmarshal([]byte(got[0]), &last))
	assert.True(t, last.Stream && last.StreamOptions.IncludeUsage, "the last members count")
	assert.NotContains(t, got[1], `"stream"`, "best_of: forwarded as sent")
}

// Errors: an engine's error status is relayed as it is; an error event or
// a cut stream gets the client a 502 naming the cause.
func TestUpstreamStreamErrors(t *testing.T) {
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
		status int
		msg    string
	}{
		{"error status", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"max_tokens too large","type":"BadRequestError"}}`)
		}, http.StatusBadRequest, "max_tokens too large"},
		{"error event", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, sse(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`, `{"error":{"message":"engine died","code":500}}`))
		}, http.StatusBadGateway, `the engine's stream carried an error event: {"message":"engine died","code":500}`},
		{"cut", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: "+`{"choices":[{"index":0,"delta":{"content":"x"}}]}`+"\n\n")
		}, http.StatusBadGateway, "the stream ended before its data: [DONE]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				readAllReq(r)
				tt.answer(w)
			})).URL
			f := rawFixture(t, Options{}, addr)
			resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"))
			b := readAll(t, resp)
			require.Equal(t, tt.status, resp.StatusCode, "%s", b)
			assert.Contains(t, decodeError(t, b).Message, tt.msg)
			if tt.status == http.StatusBadGateway {
				assert.Equal(t, 1.0, f.counter("exa_gateway_upstream_stream_failures_total", nil))
			}
		})
	}
}

// The wait for a streamed-upstream answer's first chunk is bounded by
// FirstByteTimeout (its first token), the whole answer by ResponseTimeout.
func TestUpstreamStreamTimeout(t *testing.T) {
	f := newFixtureOpts(t, 1, gateway.ModeRoundRobin, enginetest.Options{}, Options{FirstByteTimeout: 5 * time.Second, ResponseTimeout: 7 * time.Second})
	var got []time.Duration
	f.srv.afterFunc = func(d time.Duration, fn func()) func() bool {
		got = append(got, d)
		return func() bool { return true }
	}
	readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q")))
	assert.Equal(t, []time.Duration{5 * time.Second, 7 * time.Second}, got)
}

// readAllReq reads a request's body as a string.
func readAllReq(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// A one-token answer is not streamed from the engine: its first token is
// its end.
func TestUpstreamStreamSkipsOneToken(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{})
	for _, tc := range []struct {
		body     string
		streamed bool
	}{
		{`{"model":"m1","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m1","max_completion_tokens":1,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m1","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, true},
		{`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, true},
	} {
		resp := f.post("/v1/chat/completions", tc.body)
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_, body := f.engines[0].LastRequest()
		assert.Equal(t, tc.streamed, bytes.Contains(body, []byte(`"stream":true`)), "%s", tc.body)
	}
}

// sse frames chunks as an engine's stream, [DONE] included.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}
