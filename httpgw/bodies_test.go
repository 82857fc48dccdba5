package httpgw

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gateEngine is a fake engine that reads each request's body whole, then
// waits for release before answering (a one-chunk stream to a chat
// request, an empty object to any other), so that every request the
// gateway forwards is in flight at once. arrived counts the requests that
// reached it, by path.
func gateEngine(t *testing.T, release <-chan struct{}) (url string, arrived *atomic.Int64) {
	t.Helper()
	arrived = new(atomic.Int64)
	answer := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + testModel +
		`","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/health" || r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
			return
		}
		arrived.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(answer)
	}))
	return srv.URL, arrived
}

// bigChat is a chat request whose user message is size bytes.
func bigChat(stream bool, size int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"stream":%t,"messages":[{"role":"system","content":"sys"},{"role":"user","content":"%s"}]}`,
		testModel, stream, strings.Repeat("x", size))
}

// TestRequestBodiesBudget: the request bodies in flight share one budget,
// Options.MaxRequestBytes, each charged twice its buffer and every body
// made from it by its own. A request that finds it spent gets 503
// overloaded with Retry-After and never reaches an engine; the ones within
// it are served; every byte comes back once the calls end, whatever they
// came to.
func TestRequestBodiesBudget(t *testing.T) {
	const maxBody = 64 << 10
	const limit = 4 * maxBody // the least allowed: 256 KiB
	const size = 40 << 10     // each charged 2 × (its length + 1): three fit
	for _, tc := range []struct {
		name   string
		path   string
		body   []byte
		fit    int
		chunks bool // sent without a Content-Length
	}{
		{"streamed chat", "/v1/chat/completions", bigChat(true, size), 3, false},
		{"streamed chat, chunked", "/v1/chat/completions", bigChat(true, size), 2, true},
		// Asked to stream: the rewritten body is charged too, 3 × each.
		{"non-streamed chat", "/v1/chat/completions", bigChat(false, size), 2, false},
		{"embeddings", "/v1/embeddings", fmt.Appendf(nil, `{"model":%q,"input":"%s"}`, testModel, strings.Repeat("x", size)), 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			url, arrived := gateEngine(t, release)
			f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, url)
			send := func() *http.Response {
				var r io.Reader = strings.NewReader(string(tc.body))
				if tc.chunks {
					r = io.MultiReader(r) // hides the length: chunked
				}
				resp, err := http.Post(f.http.URL+tc.path, "application/json", r)
				require.NoError(t, err)
				return resp
			}
			var wg sync.WaitGroup
			codes := make([]int, tc.fit)
			for i := range tc.fit {
				wg.Go(func() {
					resp := send()
					readAll(t, resp)
					codes[i] = resp.StatusCode
				})
			}
			waitFor(t, func() bool { return arrived.Load() == int64(tc.fit) })
			used := f.srv.bodies.Used()
			assert.LessOrEqual(t, used, int64(limit))

			resp := send()
			body := readAll(t, resp)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			e := decodeError(t, body)
			require.NotNil(t, e.Code)
			assert.Equal(t, "overloaded", *e.Code)
			assert.Contains(t, e.Message, "--max-request-bytes")
			assert.Equal(t, int64(tc.fit), arrived.Load(), "the refused request reached no engine")
			assert.Equal(t, used, f.srv.bodies.Used(), "a refused request leaves nothing held")

			close(release)
			wg.Wait()
			for i, c := range codes {
				assert.Equal(t, http.StatusOK, c, "request %d within the budget", i)
			}
			f.settle()
			assert.Zero(t, f.srv.bodies.Used(), "every byte returned")
		})
	}

	t.Run("no room to ask for a stream: sent as it is", func(t *testing.T) {
		var seen atomic.Value
		srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if r.URL.Path == "/v1/chat/completions" {
				seen.Store(string(b))
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
		}))
		f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, srv.URL)
		body := bigChat(false, size)
		room := requestCharge * int64(len(body)+1) // the read, not the rewritten body
		require.True(t, f.srv.bodies.Reserve(limit-room))
		resp := f.post("/v1/chat/completions", string(body))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Equal(t, string(body), seen.Load(), "the client's body, not asking for a stream")
		f.settle()
		assert.Equal(t, limit-room, f.srv.bodies.Used())

		f.srv.bodies.Release(limit - room)
		readAll(t, f.post("/v1/chat/completions", string(body)))
		assert.Contains(t, seen.Load(), `"stream":true`, "with room, asked to stream")
	})

	t.Run("every outcome returns its bytes", func(t *testing.T) {
		release := make(chan struct{})
		close(release)
		url, _ := gateEngine(t, release)
		f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, url)
		for _, tc := range []struct {
			path, body string
			status     int
		}{
			{"/v1/chat/completions", string(bigChat(true, 100)), http.StatusOK},
			{"/v1/chat/completions", string(bigChat(true, maxBody)), http.StatusRequestEntityTooLarge},
			{"/v1/chat/completions", `{"model":`, http.StatusBadRequest},
			{"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound},
			{"/v1/embeddings", `{"input":"x"}`, http.StatusOK}, // names the sole model: rewritten
			{"/v1/embeddings", `[]`, http.StatusBadRequest},
			{"/v1/responses/resp_x/cancel", `{}`, http.StatusNotFound},
		} {
			resp := f.post(tc.path, tc.body)
			b := readAll(t, resp)
			assert.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.path, tc.body, b)
			f.settle()
			assert.Zero(t, f.srv.bodies.Used(), "%s %s", tc.path, tc.body)
		}
	})
}

// TestRequestBytesOptions: MaxRequestBytes defaults to 512 MiB or
// 4×MaxBodyBytes, and must hold four bodies of the largest size.
func TestRequestBytesOptions(t *testing.T) {
	for _, tc := range []struct {
		in      Options
		want    int64
		wantErr string
	}{
		{in: Options{}, want: DefaultMaxRequestBytes},
		{in: Options{MaxBodyBytes: 256 << 20}, want: 1 << 30},
		{in: Options{MaxRequestBytes: 32 << 20}, want: 32 << 20},
		{in: Options{MaxRequestBytes: 32<<20 - 1}, wantErr: "MaxRequestBytes 33554431 is below 4×MaxBodyBytes (33554432)"},
		{in: Options{MaxRequestBytes: -1}, wantErr: "MaxRequestBytes -1 is negative"},
		{in: Options{MaxBodyBytes: 1<<40 + 1}, wantErr: "MaxBodyBytes 1099511627777 is over 1 TiB"},
	} {
		o := tc.in
		err := fillOptions(&o)
		if tc.wantErr != "" {
			require.ErrorIs(t, err, ErrInvalidOptions)
			assert.Contains(t, err.Error(), tc.wantErr)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, o.MaxRequestBytes)
	}
}

// TestRequestBodiesBudgetPD: a disaggregated request whose prefill or
// decode body the MaxRequestBytes budget cannot hold decodes co-located
// (prefill_failed), is not retried on another prefill replica, and does
// not count against the prefill engine.
func TestRequestBodiesBudgetPD(t *testing.T) {
	body := []byte(pdBody(true, strings.Repeat("y", 1000)))
	read := requestCharge * int64(len(body)+1)
	pre, err := prefillBody(body)
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		room     int64 // what the budget leaves the request
		prefills int   // prefill requests sent
	}{
		{"no room for the prefill body", read + int64(cap(pre)) - 1, 0},
		{"no room for the decode body", read + int64(cap(pre)), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const limit = 32 << 20
			f := newPDFixtureOpts(t, 2, 1, nil, Options{MaxRequestBytes: limit})
			require.True(t, f.srv.bodies.Reserve(limit-tc.room))
			resp := f.post("/v1/chat/completions", string(body))
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
			assert.Equal(t, strings.Repeat("y", 1000), answerText(t, b))
			dec := f.decode[0].requests()
			require.Len(t, dec, 1)
			assert.Equal(t, map[string]any{"forged": true}, dec[0].body[fieldKVTransferParams], "co-located: the client's body as it was")
			assert.Len(t, append(f.prefill[0].requests(), f.prefill[1].requests()...), tc.prefills, "not retried")
			for _, st := range f.stats().Models[testModel].Replicas {
				assert.True(t, st.Healthy, st.Name)
			}
			assert.Equal(t, limit-tc.room, f.srv.bodies.Used(), "the call's bytes returned")
		})
	}
}
