package httpgw

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
)

// A body whose Content-Length is over MaxBodyBytes gets 413 whatever the
// budget holds, not a 503 with Retry-After that a client would retry for
// ever (found in review: it got 503 under load).
func TestRequestBodiesOversizedUnderLoad(t *testing.T) {
	const maxBody = 64 << 10
	const limit = 4 * maxBody
	f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, "http://127.0.0.1:1")
	require.True(t, f.srv.bodies.Reserve(limit-64<<10)) // 64 KiB of room left
	body := bigChat(true, 100<<10)                      // > MaxBodyBytes, declared
	resp := f.post("/v1/chat/completions", string(body))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "Retry-After=%q %s", resp.Header.Get("Retry-After"), b)
}

// A request that is invalid whatever the load (bad JSON, a bad member)
// gets 400 under load too: the sole-model rewrite is charged only once it
// applies (found in review: a reservation before the checks made it 503).
func TestRequestBodiesInvalidUnderLoad(t *testing.T) {
	const maxBody = 64 << 10
	const limit = 4 * maxBody
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m1","messages":"not an array"}`},
		{"/v1/chat/completions", `{"model":`},
		{"/v1/embeddings", `{"input":"x","model":""}`}, // fine: model present
		// Not here: a body without "model" that is invalid otherwise too
		// is only found invalid once the sole model is written into it,
		// which needs the budget: under load it gets 503, then 400.
		{"/v1/chat/completions", `{"model":"m1","messages":[]}`},
	} {
		t.Run(tc.body, func(t *testing.T) {
			f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, "http://127.0.0.1:1")
			room := requestCharge*int64(len(tc.body)+1) + 100 // the read fits, +1546 does not
			require.True(t, f.srv.bodies.Reserve(limit-room))
			resp := f.post(tc.path, tc.body)
			b := readAll(t, resp)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "Retry-After=%q %s", resp.Header.Get("Retry-After"), b)
		})
	}
}

// TestRequestBodiesReturned: every path returns its share of
// MaxRequestBytes (from the review): a held request whose client leaves,
// an answer cut after a retry, P/D with every kind of prefill fault, and
// the other endpoints.
func TestRequestBodiesReturned(t *testing.T) {
	t.Run("flow control: held, client leaves", func(t *testing.T) {
		f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{}))
		e := f.engines[0]
		release := e.Gate()
		done := make(chan struct{})
		go func() {
			defer close(done)
			readAll(t, f.post("/v1/chat/completions", fronttest.ChatBody(testModel, true, "sys", "first")))
		}()
		<-e.Gated()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions",
				strings.NewReader(fronttest.ChatBody(testModel, false, "sys", strings.Repeat("z", 50000))))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		f.waitQueued(1)
		assert.Greater(t, f.srv.bodies.Used(), int64(100000))
		cancel()
		<-errc
		release()
		<-done
		f.settle()
		require.Eventually(t, func() bool { return f.srv.bodies.Used() == 0 }, 5*time.Second, time.Millisecond)
	})
	t.Run("mid-answer abort and retry", func(t *testing.T) {
		var n atomic.Int32
		addr := rawEngine(t, func(c net.Conn, req *http.Request) bool {
			if n.Add(1) == 1 {
				return false // no answer: retried
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\ndata: {")
			return false // cut mid-answer: ErrAbortHandler
		})
		f := rawFixture(t, Options{}, addr, addr)
		resp, err := http.Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(bigChat(true, 5000))))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		f.settle()
		assert.Zero(t, f.srv.bodies.Used())
	})
	t.Run("P/D prefill fails, retried, fallback; and handed", func(t *testing.T) {
		for _, faults := range [][]string{nil, {"503"}, {"503", "close"}, {"nokv", "nokv"}, {"400"}, {"big", "big"}} {
			for _, body := range []string{pdBody(false, "hello"), pdBody(true, "hello")} {
				f := newPDFixtureOpts(t, 2, 1, nil, Options{MaxAssembledBytes: 1 << 20})
				f.pdFaults(faults...)
				resp := f.post("/v1/chat/completions", body)
				readAll(t, resp)
				f.settle()
				assert.Zero(t, f.srv.bodies.Used(), "%v -> %d %s", faults, resp.StatusCode, resp.Header.Get(HeaderDisagg))
			}
		}
	})
	t.Run("responses, tokenize, stored, unknown model", func(t *testing.T) {
		f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{})
		for _, c := range []struct{ m, p, b string }{
			{"POST", "/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hi"}`, testModel)},
			{"POST", "/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hi","stream":true}`, testModel)},
			{"POST", "/tokenize", `{"prompt":"hi"}`},
			{"POST", "/detokenize", `{"tokens":[1]}`},
			{"DELETE", "/v1/responses/resp_abc", `{}`},
			{"POST", "/v1/chat/completions", `{"model":"m1:adapter","messages":[{"role":"user","content":"x"}]}`},
			{"PUT", "/v1/chat/completions", `{}`},
		} {
			req, _ := http.NewRequest(c.m, f.http.URL+c.p, bytes.NewReader([]byte(c.b)))
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			readAll(t, resp)
			f.settle()
			assert.Zero(t, f.srv.bodies.Used(), "%s %s -> %d", c.m, c.p, resp.StatusCode)
		}
	})
}

// On a gateway serving several models, a request without "model" gets
// 400 whatever the load.
func TestRequestBodiesMissingModelUnderLoad(t *testing.T) {
	const maxBody = 64 << 10
	const limit = 4 * maxBody
	f := rawFixture(t, Options{MaxBodyBytes: maxBody, MaxRequestBytes: limit}, "http://127.0.0.1:1")
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Replicas: []config.Replica{{Name: "e0", Address: "http://127.0.0.1:1"}}},
		"m2":      {Replicas: []config.Replica{{Name: "e1", Address: "http://127.0.0.1:2"}}}}}))
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`},
		{"/v1/embeddings", `{"input":"x"}`},
	} {
		resp := f.post(tc.path, tc.body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b) // unloaded: 400
		room := requestCharge*int64(len(tc.body)+1) + 100
		require.True(t, f.srv.bodies.Reserve(limit-room))
		resp = f.post(tc.path, tc.body)
		b = readAll(t, resp)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s under load: Retry-After=%q %s", tc.path, resp.Header.Get("Retry-After"), b)
		f.settle()
		f.srv.bodies.Release(limit - room)
	}
}
