package httpgw

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/sseagg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bigStreamEngine is a fake engine that streams every chat request's answer
// as SSE chunks of piece bytes of content each until total bytes, then
// [DONE]; the chunk's bytes are shared, so the engine holds next to
// nothing. It counts the requests it got.
func bigStreamEngine(t *testing.T, total, piece int) (url string, requests *atomic.Int64) {
	t.Helper()
	requests = new(atomic.Int64)
	chunk := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + testModel +
		`","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", piece) + `"}}]}` + "\n\n")
	end := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + testModel +
		`","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/v1/chat/completions" {
			return
		}
		requests.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for sent := 0; sent < total; sent += piece {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write(end)
	}))
	return srv.URL, requests
}

// TestAssembledBudget (issue 29, N1): the answers being assembled share
// one budget, Options.MaxAssembledBytes. An answer that outgrows it gets
// 503 assembly_over_budget (its engine's stream dropped); a request that
// finds it spent gets the same 503 before reaching an engine; answers
// within it are served whole; every byte comes back to it afterwards.
func TestAssembledBudget(t *testing.T) {
	const limit = 1 << 20
	url, requests := bigStreamEngine(t, 64<<10, 1<<10)
	bigURL, _ := bigStreamEngine(t, 2<<20, 8<<10)
	f := rawFixture(t, Options{MaxAssembledBytes: limit}, url)
	big := rawFixture(t, Options{MaxAssembledBytes: limit}, bigURL)
	body := chatBody(testModel, false, "sys", "hi")

	t.Run("within the budget", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				resp := f.post("/v1/chat/completions", body)
				b := readAll(t, resp)
				assert.Equal(t, http.StatusOK, resp.StatusCode, "%.200s", b)
				var v struct {
					Choices []struct{ Message struct{ Content string } }
				}
				if assert.NoError(t, json.Unmarshal(b, &v)) && assert.Len(t, v.Choices, 1) {
					assert.Equal(t, 64<<10, len(v.Choices[0].Message.Content))
				}
			})
		}
		wg.Wait()
		f.settle()
		assert.Zero(t, f.srv.assembled.Used(), "every share is released")
	})

	t.Run("an answer outgrowing it", func(t *testing.T) {
		resp := big.post("/v1/chat/completions", body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%.200s", b)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		e := decodeError(t, b)
		require.NotNil(t, e.Code)
		assert.Equal(t, "assembly_over_budget", *e.Code)
		assert.Contains(t, e.Message, "budget for them (MaxAssembledBytes, --max-assembled-bytes)")
		big.settle()
		assert.Zero(t, big.srv.assembled.Used())
		assert.Zero(t, big.counter("exa_gateway_upstream_stream_failures_total", nil), "not the engine's failure")
	})

	t.Run("a spent budget", func(t *testing.T) {
		require.True(t, f.srv.assembled.Reserve(limit-sseagg.Step+1))
		before := requests.Load()
		resp := f.post("/v1/chat/completions", body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%.200s", b)
		assert.Equal(t, before, requests.Load(), "refused before it reached an engine")
		// A streamed request is not assembled: the budget does not apply.
		resp = f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
		b = readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.True(t, bytes.HasPrefix(b, []byte("data: ")))
		f.srv.assembled.Release(limit - sseagg.Step + 1)
		resp = f.post("/v1/chat/completions", body)
		readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		f.settle()
		assert.Zero(t, f.srv.assembled.Used())
		assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"code": strconv.Itoa(http.StatusServiceUnavailable)})+
			big.counter("exa_gateway_requests_total", map[string]string{"code": strconv.Itoa(http.StatusServiceUnavailable)}))
	})
}

// A negative MaxAssembledBytes is refused; zero takes the default.
func TestMaxAssembledBytesOption(t *testing.T) {
	_, err := New(Options{MaxAssembledBytes: -1, Logger: quietLogger()})
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.Contains(t, err.Error(), "MaxAssembledBytes -1 is negative")
	f := rawFixture(t, Options{})
	assert.Equal(t, int64(DefaultMaxAssembledBytes), f.srv.assembled.Limit())
}

// A prefill answer, read whole, takes its share of the same budget: one
// the budget cannot hold is not the prefill replica's failure (not
// retried, its health untold) and the request is decoded co-located;
// within the budget the same answer hands over the KV cache. Every byte
// comes back to the budget.
func TestAssembledBudgetPrefill(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
		split  bool
	}{
		{"over the budget", 1 << 20, false},
		{"within it", 16 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPDFixtureOpts(t, 2, 1, nil, Options{UpstreamStream: UpstreamStreamOff, MaxAssembledBytes: tc.budget,
				Fleet: fleet.Options{EjectAfter: 1}})
			f.pdFaults("big")
			resp := f.post("/v1/chat/completions", pdBody(false, "tell me a long story"))
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%.300s", b)
			assert.Equal(t, "tell me a long story", answerText(t, b))
			seen := f.prefillsSeen()
			assert.Equal(t, 1, len(seen[0])+len(seen[1]), "one prefill, not retried")
			f.settle()
			assert.Zero(t, f.srv.assembled.Used())
			if tc.split {
				assert.Regexp(t, `^split`, resp.Header.Get(HeaderDisagg))
				return
			}
			assert.Equal(t, 1.0, f.fallbacks("prefill_failed"))
			assert.Zero(t, f.counter("exa_gateway_ejections_total", nil), "the budget is not the replica's failure")
		})
	}
}

// TestAnswerNotCompressed: the gateway reads every prompt answer (its
// first token, its usage, and a non-streaming client's assembly), so the
// client's Accept-Encoding does not reach the engine; an engine that
// compresses when asked (as a proxy or a server with gzip on would)
// still gives a whole answer. Before, the client's gzip was forwarded and
// the assembly failed on the compressed stream.
func TestAnswerNotCompressed(t *testing.T) {
	var asked atomic.Int64
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		sse := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + testModel +
			`","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			asked.Add(1)
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = zw.Write([]byte(sse))
			_ = zw.Close()
			return
		}
		_, _ = w.Write([]byte(sse))
	}))
	f := rawFixture(t, Options{}, srv.URL)
	for _, stream := range []bool{false, true} {
		resp := f.post("/v1/chat/completions", chatBody(testModel, stream, "sys", "hi"), "Accept-Encoding", "gzip")
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "stream %v: %.300s", stream, b)
		assert.Empty(t, resp.Header.Get("Content-Encoding"), "stream %v", stream)
		assert.Contains(t, string(b), "hello", "stream %v", stream)
	}
	assert.Zero(t, asked.Load(), "requests that asked the engine for gzip")
}
